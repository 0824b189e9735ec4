//! BERT (Devlin et al., 2018), the encoder sentence-transformers models such as
//! all-MiniLM-L6-v2 are built on, read from a Hugging Face `config.json` + `model.safetensors`.
//!
//! ```text
//! x = LayerNorm(word[id] + position[p] + token_type[0])
//! per layer:  x = LayerNorm(x + O·Attention(Q·x, K·x, V·x))      (every token sees every token
//!             x = LayerNorm(x + Down·GELU(Up·x))                   of its own sequence)
//! ```
//! Post-LayerNorm (normalise after the residual add), learned absolute positions, biases on
//! every projection, exact (erf) GELU. Unlike the decoders there is no KV cache: a call takes
//! whole sequences and returns every token's final hidden state.
//!
//! The dense layers run on the int16 [`gemm_i16`]: weights quantized at load and activations
//! per call, both symmetric int16 (|q| ≤ 8191) with an `f32` scale per block of 32 columns.
//! Measured on all-MiniLM-L6-v2 against a float64 forward, Q8_0 weights (with or without 8-bit
//! activations) leave sentence embeddings at cosine 0.9983–0.9996, under the 0.9999 users of
//! sentence-transformers can expect, so the int8 kernels of the decoders do not serve here;
//! int16 keeps them at cosine 1.0000000 (the `minilm` test) and `vpmaddwd` does twice the
//! multiply-adds per cycle of the f32 FMA ([`gemm_f32`](crate::kernels::gemm_f32), which
//! remains for other full-precision uses). Q, K and V are one 1152-row product, so each layer
//! quantizes its input once for all three.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use super::layers::SharedOut;
use super::tensor_file::TensorFile;
use crate::error::{Error, Result};
use crate::kernels;
use crate::kernels::gemm_i16::{gemm_i16, PackedI16, QuantizedRows};
use crate::threadpool::ThreadPool;

fn bad(reason: String) -> Error {
    Error::BadModel { reason }
}

/// Hyper-parameters, from the Hugging Face `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    /// The longest sequence the position table covers.
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
}

impl BertConfig {
    /// Parses a `config.json`; anything but a BERT with absolute positions and GELU is an
    /// [`Error::BadModel`] naming what differs.
    pub fn from_json(text: &str) -> Result<BertConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("config.json: {e}")))?;
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
        if !matches!(field("model_type"), "bert" | "") {
            return Err(Error::UnknownArchitecture {
                arch: field("model_type").to_string(),
                supported: "bert (safetensors encoders), llama, gemma3 (GGUF decoders)",
            });
        }
        if !matches!(field("hidden_act"), "gelu" | "") {
            return Err(bad(format!(
                "config.json: hidden_act {:?} (only the exact \"gelu\" is supported)",
                field("hidden_act")
            )));
        }
        if !matches!(field("position_embedding_type"), "absolute" | "") {
            return Err(bad(format!(
                "config.json: position_embedding_type {:?} (only \"absolute\" is supported)",
                field("position_embedding_type")
            )));
        }
        let int = |k: &str| -> Result<usize> {
            match v.get(k).and_then(Value::as_u64) {
                Some(n) if n > 0 && n <= u32::MAX as u64 => Ok(n as usize),
                _ => Err(bad(format!(
                    "config.json: {k} must be a positive integer, found {}",
                    v.get(k).map_or("nothing".to_string(), Value::to_string)
                ))),
            }
        };
        let cfg = BertConfig {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size")?,
            layer_norm_eps: v
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-12) as f32,
        };
        if !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
            return Err(bad(format!(
                "config.json: hidden_size {} does not split into {} heads",
                cfg.hidden_size, cfg.num_attention_heads
            )));
        }
        Ok(cfg)
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// `y = W·x + b`, with `W` (`rows × cols`) quantized and packed for [`gemm_i16`].
struct Dense {
    w: PackedI16,
    b: Vec<f32>,
}

impl Dense {
    /// The tensors `{name}.weight` (`rows × cols`) and `{name}.bias` of each name, stacked
    /// (one product for several projections of the same input; each row is quantized on its
    /// own, so stacking changes no result).
    fn load(f: &TensorFile, names: &[&str], rows: usize, cols: usize) -> Result<Dense> {
        let (mut w, mut b) = (Vec::new(), Vec::new());
        for name in names {
            w.extend(f.f32(&format!("{name}.weight"), &[rows, cols])?);
            b.extend(f.f32(&format!("{name}.bias"), &[rows])?);
        }
        Ok(Dense {
            w: PackedI16::pack(&w, rows * names.len(), cols),
            b,
        })
    }

    /// `y[t] = W·x[t] + b` for the (quantized) rows of `x`.
    fn forward(&self, pool: &ThreadPool, x: &QuantizedRows, y: &mut [f32]) {
        gemm_i16(pool, &self.w, x, Some(&self.b), y);
    }
}

/// `LayerNorm(x) = (x − mean) / sqrt(var + eps) · g + b`, row by row.
struct LayerNorm {
    g: Vec<f32>,
    b: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn load(f: &TensorFile, name: &str, d: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            g: f.f32(&format!("{name}.weight"), &[d])?,
            b: f.f32(&format!("{name}.bias"), &[d])?,
            eps,
        })
    }

    /// Normalises every row of `x` in place. Mean and variance are summed in f64: the
    /// residual stream of a post-LN model has a few large components.
    fn apply(&self, x: &mut [f32]) {
        let d = self.g.len();
        for row in x.chunks_exact_mut(d) {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / d as f64;
            let inv = 1.0 / (var + f64::from(self.eps)).sqrt();
            for ((v, &g), &b) in row.iter_mut().zip(&self.g).zip(&self.b) {
                *v = ((f64::from(*v) - mean) * inv) as f32 * g + b;
            }
        }
    }
}

struct Layer {
    /// Q, K and V stacked: row `t` of the output is `q[t] ‖ k[t] ‖ v[t]`.
    qkv: Dense,
    o: Dense,
    attn_norm: LayerNorm,
    up: Dense,
    down: Dense,
    ffn_norm: LayerNorm,
}

/// A BERT encoder.
pub struct Bert {
    cfg: BertConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert").field("cfg", &self.cfg).finish()
    }
}

impl Bert {
    /// Loads the weights of `cfg` from `f` (Hugging Face names, with or without the `bert.`
    /// prefix a `BertForMaskedLM` checkpoint has), checking every shape.
    pub fn load(f: &TensorFile, cfg: BertConfig) -> Result<Bert> {
        let prefix = if f.has("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let (d, ff, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let emb = |name: &str, rows: usize| {
            f.f32(&format!("{prefix}embeddings.{name}.weight"), &[rows, d])
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("{prefix}encoder.layer.{i}");
                let dense = |name: &str, rows, cols| {
                    Dense::load(f, &[format!("{p}.{name}").as_str()], rows, cols)
                };
                let qkv = ["query", "key", "value"].map(|m| format!("{p}.attention.self.{m}"));
                Ok(Layer {
                    qkv: Dense::load(f, &qkv.each_ref().map(String::as_str), d, d)?,
                    o: dense("attention.output.dense", d, d)?,
                    attn_norm: LayerNorm::load(
                        f,
                        &format!("{p}.attention.output.LayerNorm"),
                        d,
                        eps,
                    )?,
                    up: dense("intermediate.dense", ff, d)?,
                    down: dense("output.dense", d, ff)?,
                    ffn_norm: LayerNorm::load(f, &format!("{p}.output.LayerNorm"), d, eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Bert {
            word: emb("word_embeddings", cfg.vocab_size)?,
            position: emb("position_embeddings", cfg.max_position_embeddings)?,
            token_type: emb("token_type_embeddings", cfg.type_vocab_size)?,
            emb_norm: LayerNorm::load(f, &format!("{prefix}embeddings.LayerNorm"), d, eps)?,
            layers,
            cfg,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The input vector of token `id` at position `pos` before the embedding LayerNorm:
    /// `word[id] + position[pos] + token_type[0]`.
    pub fn embed_row(&self, id: u32, pos: usize, out: &mut [f32]) -> Result<()> {
        let d = self.cfg.hidden_size;
        if id as usize >= self.cfg.vocab_size {
            return Err(Error::TokenOutOfRange {
                id,
                vocab_size: self.cfg.vocab_size,
            });
        }
        let word = &self.word[id as usize * d..][..d];
        let position = &self.position[pos * d..][..d];
        for (((o, &w), &p), &t) in out.iter_mut().zip(word).zip(position).zip(&self.token_type) {
            *o = w + p + t;
        }
        Ok(())
    }

    /// The final hidden state of every token of `seqs`, row after row (sequence by sequence).
    /// Each sequence attends only to itself, so a sequence's rows do not depend on what else
    /// is in the call.
    pub fn forward(&self, pool: &ThreadPool, seqs: &[&[u32]]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let d = cfg.hidden_size;
        let n: usize = seqs.iter().map(|s| s.len()).sum();
        if let Some(long) = seqs.iter().find(|s| s.len() > cfg.max_position_embeddings) {
            return Err(Error::BadBatch {
                reason: format!(
                    "a sequence of {} tokens is longer than the model's {} positions",
                    long.len(),
                    cfg.max_position_embeddings
                ),
            });
        }
        let mut x = vec![0f32; n * d];
        let mut rows = x.chunks_exact_mut(d);
        for seq in seqs {
            for (pos, (&id, row)) in seq.iter().zip(rows.by_ref()).enumerate() {
                self.embed_row(id, pos, row)?;
            }
        }
        par_rows(pool, &mut x, d, &|rows| self.emb_norm.apply(rows));

        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let mut qkv = vec![0f32; n * 3 * d];
        let (mut ctx, mut proj) = (vec![0f32; n * d], vec![0f32; n * d]);
        let mut hidden = vec![0f32; n * cfg.intermediate_size];
        let mut xq = QuantizedRows::default();
        for layer in &self.layers {
            xq.quantize(pool, &x, d);
            layer.qkv.forward(pool, &xq, &mut qkv);
            attention(pool, cfg, &lens, &qkv, &mut ctx);
            xq.quantize(pool, &ctx, d);
            layer.o.forward(pool, &xq, &mut proj);
            add_assign(&mut x, &proj);
            par_rows(pool, &mut x, d, &|rows| layer.attn_norm.apply(rows));

            xq.quantize(pool, &x, d);
            layer.up.forward(pool, &xq, &mut hidden);
            par_rows(pool, &mut hidden, cfg.intermediate_size, &|rows| {
                kernels::math::gelu_inplace(rows)
            });
            xq.quantize(pool, &hidden, cfg.intermediate_size);
            layer.down.forward(pool, &xq, &mut proj);
            add_assign(&mut x, &proj);
            par_rows(pool, &mut x, d, &|rows| layer.ffn_norm.apply(rows));
        }
        Ok(x)
    }
}

/// Applies `f` to `data` (rows of `width` values) split into one run of whole rows per thread.
fn par_rows(pool: &ThreadPool, data: &mut [f32], width: usize, f: &(dyn Fn(&mut [f32]) + Sync)) {
    let n = data.len() / width;
    let nt = pool.n_threads().min(n / 8).max(1);
    if nt == 1 {
        return f(data);
    }
    let out = SharedOut(data.as_mut_ptr());
    pool.run(&|ti, _| {
        let out = &out;
        let (r0, r1) = (n * ti / nt, n * (ti + 1) / nt);
        if r0 < r1 {
            // SAFETY: thread `ti` alone touches rows `r0..r1`, which lie inside `data`.
            let rows =
                unsafe { std::slice::from_raw_parts_mut(out.0.add(r0 * width), (r1 - r0) * width) };
            f(rows);
        }
    });
}

fn add_assign(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, &y)| *x += y);
}

/// Bidirectional softmax attention within each sequence: for every (sequence, head) pair, each
/// query row attends to all the sequence's key rows. `qkv` holds per token `q ‖ k ‖ v`
/// (`3 × hidden_size` values). The pairs are shared out over the pool; each writes only its
/// own `head_dim` columns of its own rows of `out`.
fn attention(pool: &ThreadPool, cfg: &BertConfig, lens: &[usize], qkv: &[f32], out: &mut [f32]) {
    let (d, heads, hd) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
    let scale = 1.0 / (hd as f32).sqrt();
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |at, &l| {
            let s = *at;
            *at += l;
            Some(s)
        })
        .collect();
    let items = lens.len() * heads;
    let next = AtomicUsize::new(0);
    let shared = SharedOut(out.as_mut_ptr());
    pool.run(&|_, _| {
        let shared = &shared;
        let mut scratch = HeadScratch::default();
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                break;
            }
            let (s, h) = (item / heads, item % heads);
            let (start, len) = (starts[s], lens[s]);
            let rows = &qkv[start * 3 * d..(start + len) * 3 * d];
            // SAFETY: rows `start..start + len`, columns `h·hd..(h+1)·hd` of `out` belong to
            // this (sequence, head) item alone and lie inside `out` (`n × d` values); `head`
            // writes only those.
            unsafe {
                head(
                    rows,
                    d,
                    h * hd,
                    hd,
                    scale,
                    &mut scratch,
                    shared.0.add(start * d),
                )
            };
        }
    });
}

/// `scores[8·jb ..][..8·B] = (q · k[j]) · scale` for `B` blocks of 8 keys, each sum a `mul_add`
/// chain over the head dimension in order (the same chain whatever `B`).
#[inline(always)]
fn scores_blocks<const B: usize>(
    q: &[f32],
    kt: &[f32],
    padded: usize,
    jb: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let mut a = [[0f32; 8]; B];
    for (&qc, ktrow) in q.iter().zip(kt.chunks_exact(padded)) {
        for (a, k8) in a.iter_mut().zip(ktrow[jb * 8..][..B * 8].chunks_exact(8)) {
            for (a, &kv) in a.iter_mut().zip(k8) {
                *a = qc.mul_add(kv, *a);
            }
        }
    }
    for (o, a) in scores[jb * 8..][..B * 8].chunks_exact_mut(8).zip(a) {
        for (o, a) in o.iter_mut().zip(a) {
            *o = a * scale;
        }
    }
}

/// Buffers of one attention worker, reused across (sequence, head) items.
#[derive(Default)]
struct HeadScratch {
    /// The head's keys transposed, `hd` rows of `len` rounded up to 8 (zero-padded).
    kt: Vec<f32>,
    scores: Vec<f32>,
    acc: Vec<f32>,
}

/// One head of one sequence: `rows` holds the sequence's `q ‖ k ‖ v` rows (`3·d` values
/// each), the head's columns start at `col`; writes columns `col..col + hd` of each row of
/// `out` (rows of `d` values).
///
/// # Safety
/// `out` must point to `len` rows of `d` values whose columns `col..col + hd` no one else
/// reads or writes during the call.
///
/// The arithmetic is written once and compiled twice ([`head_avx2`] and the portable path):
/// every score and every output value is its own chain of `mul_add`s in a fixed order (scores
/// over the head dimension, outputs over the keys), so vectorizing across keys or dimensions
/// cannot change a bit, the two paths agree, and a row's result depends only on its sequence.
unsafe fn head(
    rows: &[f32],
    d: usize,
    col: usize,
    hd: usize,
    scale: f32,
    s: &mut HeadScratch,
    out: *mut f32,
) {
    #[cfg(target_arch = "x86_64")]
    if kernels::simd_level().has_avx2() {
        // SAFETY: AVX2 and FMA were detected; `out` as the caller guarantees.
        return unsafe { head_avx2(rows, d, col, hd, scale, s, out) };
    }
    // SAFETY: as the caller guarantees.
    unsafe { head_body(rows, d, col, hd, scale, s, out) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_avx2(
    rows: &[f32],
    d: usize,
    col: usize,
    hd: usize,
    scale: f32,
    s: &mut HeadScratch,
    out: *mut f32,
) {
    head_body(rows, d, col, hd, scale, s, out);
}

/// # Safety
/// As [`head`].
#[inline(always)]
unsafe fn head_body(
    rows: &[f32],
    d: usize,
    col: usize,
    hd: usize,
    scale: f32,
    s: &mut HeadScratch,
    out: *mut f32,
) {
    let len = rows.len() / (3 * d);
    let padded = len.div_ceil(8) * 8;
    // kt[c][j] = k[j][c]: the scores of one query are then 8 keys per vector.
    s.kt.clear();
    s.kt.resize(hd * padded, 0.0);
    for (c, ktrow) in s.kt.chunks_exact_mut(padded).enumerate() {
        for (o, row) in ktrow.iter_mut().zip(rows.chunks_exact(3 * d)) {
            *o = row[d + col + c];
        }
    }
    s.scores.resize(padded, 0.0);
    s.acc.resize(hd, 0.0);
    for (i, qrow) in rows.chunks_exact(3 * d).enumerate() {
        let qi = &qrow[col..][..hd];
        // scores[j] = (Σ_c q[c]·k[j][c]) · scale, the sum a mul_add chain over c in order;
        // 8 keys per register, up to 4 registers of keys at a time (independent chains).
        let mut jb = 0;
        while jb < padded / 8 {
            let blocks = (padded / 8 - jb).min(4);
            match blocks {
                4 => scores_blocks::<4>(qi, &s.kt, padded, jb, scale, &mut s.scores),
                3 => scores_blocks::<3>(qi, &s.kt, padded, jb, scale, &mut s.scores),
                2 => scores_blocks::<2>(qi, &s.kt, padded, jb, scale, &mut s.scores),
                _ => scores_blocks::<1>(qi, &s.kt, padded, jb, scale, &mut s.scores),
            }
            jb += blocks;
        }
        let scores = &mut s.scores[..len];
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        scores.iter_mut().for_each(|sc| *sc -= max);
        kernels::math::exp_inplace(scores);
        let sum: f32 = scores.iter().sum();
        // acc[c] = Σ_j p[j]·v[j][c], a mul_add chain over j in order; 32 columns at a time
        // held in registers.
        for c0 in (0..hd).step_by(32) {
            let w = (hd - c0).min(32);
            let mut acc = [0f32; 32];
            for (&p, vrow) in scores.iter().zip(rows.chunks_exact(3 * d)) {
                let v = &vrow[2 * d + col + c0..][..w];
                if w == 32 {
                    for (a, &vv) in acc.iter_mut().zip(v) {
                        *a = p.mul_add(vv, *a);
                    }
                } else {
                    for (a, &vv) in acc[..w].iter_mut().zip(v) {
                        *a = p.mul_add(vv, *a);
                    }
                }
            }
            s.acc[c0..c0 + w].copy_from_slice(&acc[..w]);
        }
        // SAFETY: row i's columns of this head, which the caller reserved for us.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.add(i * d + col), hd) };
        for (o, &a) in dst.iter_mut().zip(&s.acc) {
            *o = a / sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_are_typed() {
        let ok = r#"{"model_type":"bert","vocab_size":10,"hidden_size":8,"num_hidden_layers":1,
            "num_attention_heads":2,"intermediate_size":16,"max_position_embeddings":4,
            "type_vocab_size":2,"hidden_act":"gelu"}"#;
        assert_eq!(
            BertConfig::from_json(ok).map(|c| c.hidden_size).ok(),
            Some(8)
        );
        for broken in [
            "",
            "{",
            "[]",
            &ok.replace("\"hidden_size\":8", "\"hidden_size\":-8"),
            &ok.replace("\"hidden_size\":8", "\"hidden_size\":7"),
            &ok.replace("gelu", "relu"),
            &ok.replace("\"bert\"", "\"roberta\""),
        ] {
            assert!(BertConfig::from_json(broken).is_err(), "{broken}");
        }
    }
}
