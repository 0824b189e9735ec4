//! Gemma 3 (Gemma Team 2025).
//!
//! ```text
//! x = embed(token) · √d
//! for each block:
//!     q, k = rmsnorm_per_head(Wq · norm(x)), rmsnorm_per_head(Wk · norm(x))
//!     a = Wo · attention(rope(q) / √d_head, rope(k), Wv · norm(x))    (local or global)
//!     x = x + post_attention_norm(a)
//!     x = x + post_ffw_norm(Wdown · (gelu_tanh(Wgate · norm(x)) ⊙ Wup · norm(x)))
//! logits = Wembed · norm(x)
//! ```
//! Five local (sliding-window) layers for each global one: layers 5, 11, 17… attend to the whole
//! context with RoPE base `rope.freq_base` (10⁶); the others see the last `sliding_window`
//! positions with RoPE base 10⁴. RoPE rotates NeoX-style halves. The norm weights in the GGUF
//! already include Gemma's `1 + w` offset.

use std::sync::Arc;

use super::attention;
use super::layers::{self, add_assign, gelu_tanh_mul, rms_norm, rms_norm_inplace, Rope};
use super::{
    buf, embedding_rows, input_rows, output_hidden, output_logits, BatchToken, Blocks, LayerPager,
    Linear, Loader, Model, ModelInfo, Pass, SlotMask, Stack, Workspace,
};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kv::{GroupSpec, KvCache, KvLayout, KvType};
use crate::lora::AdapterSet;
use crate::threadpool::ThreadPool;

/// RoPE base of the local layers (not stored in the file).
const LOCAL_ROPE_BASE: f32 = 10_000.0;
/// One global layer in this many (not stored in the file).
const GLOBAL_EVERY: usize = 6;

/// Hyper-parameters read from `gemma3.*` keys.
#[derive(Debug, Clone)]
pub struct Config {
    pub n_embd: usize,
    pub n_layers: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub eps: f32,
    pub window: usize,
    /// Query scale (`attention.scale`, default 1/√head_dim).
    pub attn_scale: f32,
}

impl Config {
    /// Whether layer `il` attends to the whole context.
    pub fn is_global(&self, il: usize) -> bool {
        il % GLOBAL_EVERY == GLOBAL_EVERY - 1
    }
}

struct Block {
    attn_norm: Vec<f32>,
    /// Q, K and V (one matrix where their weight types match).
    qkv: Stack,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: Linear,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    /// Gate and up (one matrix where their weight types match).
    gate_up: Stack,
    down: Linear,
    post_ffw_norm: Vec<f32>,
}

/// A loaded Gemma 3 model.
pub struct Gemma3 {
    file: Arc<GgufFile>,
    info: ModelInfo,
    cfg: Config,
    rope_local: Rope,
    rope_global: Rope,
    token_embd: Linear,
    output_norm: Vec<f32>,
    blocks: Blocks<Block>,
}

impl Gemma3 {
    /// Reads the configuration and checks every tensor's shape.
    pub fn load(l: &Loader, pager: Option<Arc<LayerPager>>) -> Result<Gemma3> {
        let n_embd = l.usize("embedding_length")?;
        let n_head = l.usize("attention.head_count")?;
        let n_head_kv = l.opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = l
            .opt_usize("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        let value_dim = l.opt_usize("attention.value_length")?.unwrap_or(head_dim);
        if n_head % n_head_kv != 0
            || head_dim == 0
            || head_dim > attention::MAX_HEAD_DIM
            || head_dim % 2 != 0
            || value_dim != head_dim
        {
            return Err(Error::BadModel {
                reason: format!(
                    "{n_head} heads, {n_head_kv} KV heads, key/value size {head_dim}/{value_dim}"
                ),
            });
        }
        let n_layers = l.usize("block_count")?;
        let cfg = Config {
            n_embd,
            n_layers,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: l.usize("feed_forward_length")?,
            eps: l
                .opt_f32_where("attention.layer_norm_rms_epsilon", "a number >= 0", |v| {
                    v >= 0.0
                })?
                .unwrap_or(1e-6),
            window: l.opt_usize("attention.sliding_window")?.unwrap_or(512),
            // Gemma 3 27B scales its queries by 1/√(n_embd/n_head) = 1/√168, not by its head
            // size, 128 (`query_pre_attn_scalar`); llama.cpp tells it by its 62 blocks.
            attn_scale: l
                .opt_f32_where("attention.scale", "a number > 0", |v| v > 0.0)?
                .unwrap_or(match n_layers {
                    62 => 1.0 / ((n_embd / n_head) as f32).sqrt(),
                    _ => 1.0 / (head_dim as f32).sqrt(),
                }),
        };
        let embd_info = l.file.tensor("token_embd.weight")?;
        let vocab = embd_info.shape.get(1).copied().unwrap_or(0) as usize;
        if vocab == 0 {
            return Err(Error::BadModel {
                reason: format!(
                    "token_embd.weight has shape {:?}: no vocabulary",
                    embd_info.shape
                ),
            });
        }
        let token_embd = l.tied("token_embd.weight", vocab, n_embd)?; // also the LM head
        let base = l
            .opt_f32_where("rope.freq_base", "a number > 0", |v| v > 0.0)?
            .unwrap_or(1_000_000.0);
        let scale = l.rope_scale()?;
        l.refuse_unread()?;
        let blocks = Blocks::load_from(l, &cfg, cfg.n_layers, pager, load_block)?;
        let info = ModelInfo {
            arch: l.arch.clone(),
            vocab_size: vocab,
            n_ctx_train: l.opt_usize("context_length")?.unwrap_or(32768),
            n_embd,
            n_layers: cfg.n_layers,
        };
        Ok(Gemma3 {
            file: l.file.clone(),
            info,
            rope_local: Rope::new(head_dim, LOCAL_ROPE_BASE, 1.0, true, None),
            rope_global: Rope::new(head_dim, base, 1.0 / scale, true, None),
            output_norm: l.vector("output_norm.weight", n_embd)?,
            token_embd,
            blocks,
            cfg,
        })
    }

    /// The factor the embedding rows are multiplied by before the first block: √d.
    fn embd_scale(&self) -> f32 {
        (self.cfg.n_embd as f32).sqrt()
    }
}

impl Model for Gemma3 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_layout(&self) -> KvLayout {
        let (global, local): (Vec<usize>, Vec<usize>) =
            (0..self.cfg.n_layers).partition(|&il| self.cfg.is_global(il));
        KvLayout {
            n_layers: self.cfg.n_layers,
            n_kv_heads: self.cfg.n_head_kv,
            head_dim: self.cfg.head_dim,
            groups: vec![
                GroupSpec {
                    layers: global,
                    window: None,
                },
                GroupSpec {
                    layers: local,
                    window: Some(self.cfg.window),
                },
            ],
            kv_type: KvType::F16,
        }
    }

    fn input_embeddings(&self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let emb = self.token_embd.matrix(&self.file)?;
        embedding_rows(&emb, self.embd_scale(), ids, out)
    }

    fn forward(
        &self,
        tokens: &[BatchToken],
        masks: &[SlotMask],
        loras: &[AdapterSet],
        embeds: &[f32],
        kv: &mut KvCache,
        pool: &ThreadPool,
        ws: &mut Workspace,
        logits: &mut [f32],
        hidden: &mut [f32],
    ) -> Result<()> {
        let c = &self.cfg;
        let f = &*self.file;
        let n = tokens.len();
        let (d, hd, ff) = (c.n_embd, c.head_dim, c.n_ff);
        let (qd, kvd) = (c.n_head * hd, c.n_head_kv * hd);
        let Workspace {
            x,
            h,
            q,
            k,
            v,
            att,
            gate,
            up,
            out_rows,
            rope,
            matmul: mm,
        } = ws;
        let pass = Pass {
            pool,
            file: f,
            tokens,
            loras,
        };
        let x = buf(x, n * d);
        // Gemma scales its embeddings by √d before the first block.
        input_rows(
            &self.token_embd.matrix(f)?,
            self.embd_scale(),
            tokens,
            embeds,
            x,
        )?;
        // Angles of each token for local and global layers, computed once.
        let half = hd / 2;
        rope.resize(2 * n * half, (0.0, 0.0));
        let (local_cs, global_cs) = rope.split_at_mut(n * half);
        for (i, t) in tokens.iter().enumerate() {
            self.rope_local
                .angles(t.pos, &mut local_cs[i * half..(i + 1) * half]);
            self.rope_global
                .angles(t.pos, &mut global_cs[i * half..(i + 1) * half]);
        }
        let (h, q, k, v, att) = (
            buf(h, n * d),
            buf(q, n * qd),
            buf(k, n * kvd),
            buf(v, n * kvd),
            buf(att, n * qd),
        );
        let (gate, up) = (buf(gate, n * ff), buf(up, n * ff));
        for il in 0..self.blocks.len() {
            let b = &*self.blocks.get(il)?;
            let (rope_l, cs_all) = if c.is_global(il) {
                (&self.rope_global, &*global_cs)
            } else {
                (&self.rope_local, &*local_cs)
            };
            // Attention with per-head QK norms.
            rms_norm(x, &b.attn_norm, c.eps, h);
            b.qkv
                .forward(&pass, h, &mut [&mut *q, &mut *k, &mut *v], mm)?;
            rms_norm_inplace(q, &b.q_norm, c.eps);
            rms_norm_inplace(k, &b.k_norm, c.eps);
            layers::rope_and_cache(kv, il, tokens, rope_l, cs_all, hd, c.attn_scale, (q, k, v))?;
            attention::attention(pool, kv, il, tokens, masks, q, c.n_head, hd, 1.0, att)?;
            b.wo.forward(&pass, att, h, mm)?;
            rms_norm_inplace(h, &b.post_attn_norm, c.eps);
            add_assign(x, h);
            // Feed-forward (GeGLU), normalized before and after.
            rms_norm(x, &b.ffn_norm, c.eps, h);
            b.gate_up
                .forward(&pass, h, &mut [&mut *gate, &mut *up], mm)?;
            layers::gated(pool, gate, up, gelu_tanh_mul);
            b.down.forward(&pass, gate, h, mm)?;
            rms_norm_inplace(h, &b.post_ffw_norm, c.eps);
            add_assign(x, h);
        }
        output_hidden(tokens, x, &self.output_norm, c.eps, hidden);
        let output = self.token_embd.matrix(f)?;
        output_logits(
            pool,
            tokens,
            x,
            &self.output_norm,
            c.eps,
            &output,
            out_rows,
            mm,
            logits,
        );
        Ok(())
    }
}

/// Reads block `i`'s weights (from the pager's source, if the loader has one).
fn load_block(l: &Loader, c: &Config, i: usize) -> Result<Block> {
    let t = |n: &str| format!("blk.{i}.{n}.weight");
    let (qd, kvd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
    Ok(Block {
        attn_norm: l.vector(&t("attn_norm"), c.n_embd)?,
        qkv: l.stack(
            &[(&t("attn_q"), qd), (&t("attn_k"), kvd), (&t("attn_v"), kvd)],
            c.n_embd,
        )?,
        q_norm: l.vector(&t("attn_q_norm"), c.head_dim)?,
        k_norm: l.vector(&t("attn_k_norm"), c.head_dim)?,
        wo: l.linear(&t("attn_output"), c.n_embd, qd)?,
        post_attn_norm: l.vector(&t("post_attention_norm"), c.n_embd)?,
        ffn_norm: l.vector(&t("ffn_norm"), c.n_embd)?,
        gate_up: l.stack(
            &[(&t("ffn_gate"), c.n_ff), (&t("ffn_up"), c.n_ff)],
            c.n_embd,
        )?,
        down: l.linear(&t("ffn_down"), c.n_embd, c.n_ff)?,
        post_ffw_norm: l.vector(&t("post_ffw_norm"), c.n_embd)?,
    })
}
