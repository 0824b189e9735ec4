//! Llama (Touvron et al. 2023) and the many models that share its shape: SmolLM2, Llama 2/3,
//! Mistral-style GQA models.
//!
//! ```text
//! x = embed(token)
//! for each block:
//!     h = x + Wo · attention(rope(Wq · norm(x)), rope(Wk · norm(x)), Wv · norm(x))
//!     x = h + Wdown · (silu(Wgate · norm(h)) ⊙ Wup · norm(h))
//! logits = Wout · norm(x)            (Wout = embedding when the file ties them)
//! ```
//! RMSNorm everywhere, rotary embeddings on adjacent pairs, grouped-query attention.

use std::sync::Arc;

use super::attention;
use super::layers::{self, add_assign, rms_norm, silu_mul, Rope};
use super::{
    buf, embedding_rows, input_rows, output_hidden, output_logits, BatchToken, Blocks, LayerPager,
    Linear, Loader, Model, ModelInfo, Pass, SlotMask, Stack, Workspace,
};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kv::{GroupSpec, KvCache, KvLayout, KvType};
use crate::lora::AdapterSet;
use crate::threadpool::ThreadPool;

/// Hyper-parameters read from `llama.*` keys.
#[derive(Debug, Clone)]
pub struct Config {
    pub n_embd: usize,
    pub n_layers: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub eps: f32,
}

/// One transformer block's weights.
struct Block {
    attn_norm: Vec<f32>,
    /// Q, K and V (one matrix where their weight types match).
    qkv: Stack,
    wo: Linear,
    ffn_norm: Vec<f32>,
    /// Gate and up (one matrix where their weight types match).
    gate_up: Stack,
    down: Linear,
}

/// A loaded Llama-family model.
pub struct Llama {
    file: Arc<GgufFile>,
    info: ModelInfo,
    cfg: Config,
    rope: Rope,
    token_embd: Linear,
    output_norm: Vec<f32>,
    output: Linear,
    blocks: Blocks<Block>,
}

impl Llama {
    /// Reads the configuration and checks every tensor's shape.
    pub fn load(l: &Loader, pager: Option<Arc<LayerPager>>) -> Result<Llama> {
        let n_embd = l.usize("embedding_length")?;
        let n_head = l.usize("attention.head_count")?;
        let n_head_kv = l.opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = l
            .opt_usize("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        if n_head % n_head_kv != 0
            || head_dim == 0
            || head_dim > attention::MAX_HEAD_DIM
            || head_dim % 2 != 0
        {
            return Err(Error::BadModel {
                reason: format!("{n_head} heads, {n_head_kv} KV heads, head size {head_dim}"),
            });
        }
        let cfg = Config {
            n_embd,
            n_layers: l.usize("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: l.usize("feed_forward_length")?,
            eps: l
                .opt_f32_where("attention.layer_norm_rms_epsilon", "a number >= 0", |v| {
                    v >= 0.0
                })?
                .unwrap_or(1e-5),
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
        let (token_embd, output) = if l.has("output.weight") {
            let token_embd = l.table("token_embd.weight", vocab, n_embd)?;
            (token_embd, l.linear("output.weight", vocab, n_embd)?)
        } else {
            let tied = l.tied("token_embd.weight", vocab, n_embd)?;
            (tied.clone(), tied)
        };
        let rope_dims = l
            .opt_usize("rope.dimension_count")?
            .unwrap_or(head_dim)
            .min(head_dim);
        let freq_factors = if l.has("rope_freqs.weight") {
            Some(l.vector("rope_freqs.weight", rope_dims / 2)?)
        } else {
            None
        };
        let base = l
            .opt_f32_where("rope.freq_base", "a number > 0", |v| v > 0.0)?
            .unwrap_or(10000.0);
        let rope = Rope::new(rope_dims, base, 1.0 / l.rope_scale()?, false, freq_factors);
        l.refuse_unread()?;
        let blocks = Blocks::load_from(l, &cfg, cfg.n_layers, pager, load_block)?;
        let info = ModelInfo {
            arch: l.arch.clone(),
            vocab_size: vocab,
            n_ctx_train: l.opt_usize("context_length")?.unwrap_or(4096),
            n_embd,
            n_layers: cfg.n_layers,
        };
        Ok(Llama {
            file: l.file.clone(),
            info,
            rope,
            output_norm: l.vector("output_norm.weight", n_embd)?,
            token_embd,
            output,
            blocks,
            cfg,
        })
    }
}

impl Model for Llama {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            n_layers: self.cfg.n_layers,
            n_kv_heads: self.cfg.n_head_kv,
            head_dim: self.cfg.head_dim,
            groups: vec![GroupSpec {
                layers: (0..self.cfg.n_layers).collect(),
                window: None,
            }],
            kv_type: KvType::F16,
        }
    }

    fn input_embeddings(&self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let emb = self.token_embd.matrix(&self.file)?;
        embedding_rows(&emb, 1.0, ids, out)
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
        input_rows(&self.token_embd.matrix(f)?, 1.0, tokens, embeds, x)?;
        // The rotation angles of each token, computed once for all layers.
        let half = self.rope.dims / 2;
        rope.resize(n * half, (0.0, 0.0));
        for (t, cs) in tokens.iter().zip(rope.chunks_exact_mut(half.max(1))) {
            self.rope.angles(t.pos, cs);
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
            // Attention.
            rms_norm(x, &b.attn_norm, c.eps, h);
            b.qkv
                .forward(&pass, h, &mut [&mut *q, &mut *k, &mut *v], mm)?;
            layers::rope_and_cache(kv, il, tokens, &self.rope, rope, hd, 1.0, (q, k, v))?;
            let scale = 1.0 / (hd as f32).sqrt();
            attention::attention(pool, kv, il, tokens, masks, q, c.n_head, hd, scale, att)?;
            b.wo.forward(&pass, att, h, mm)?;
            add_assign(x, h);
            // Feed-forward (SwiGLU).
            rms_norm(x, &b.ffn_norm, c.eps, h);
            b.gate_up
                .forward(&pass, h, &mut [&mut *gate, &mut *up], mm)?;
            layers::gated(pool, gate, up, silu_mul);
            b.down.forward(&pass, gate, h, mm)?;
            add_assign(x, h);
        }
        output_hidden(tokens, x, &self.output_norm, c.eps, hidden);
        let output = self.output.matrix(f)?;
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
        wo: l.linear(&t("attn_output"), c.n_embd, qd)?,
        ffn_norm: l.vector(&t("ffn_norm"), c.n_embd)?,
        gate_up: l.stack(
            &[(&t("ffn_gate"), c.n_ff), (&t("ffn_up"), c.n_ff)],
            c.n_embd,
        )?,
        down: l.linear(&t("ffn_down"), c.n_embd, c.n_ff)?,
    })
}
