//! Model architectures: one file per architecture, sharing the layers in [`layers`].
//!
//! A model is a pure function of its weights: [`Model::forward`] takes a batch of tokens that
//! may belong to many sequences, at any positions, whose KV slots were already appended to the
//! cache, writes their keys and values into it and returns logits for the rows asked for.

pub mod attention;
#[cfg(test)]
mod attention_bench;
#[cfg(test)]
mod attention_tests;
pub mod bert;
pub mod gemma3;
pub mod layers;
pub mod llama;
mod pager;
pub(crate) mod tensor_file;
mod weights;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kernels::{self, MatmulScratch, Matrix};
use crate::kv::{KvCache, KvLayout, SeqId};
use crate::lora::AdapterSet;
use crate::threadpool::ThreadPool;
pub(crate) use pager::Blocks;
pub use pager::{LayerPager, PagerSource, PagerStats};
pub use tensor_file::TensorFile;
pub use weights::Pass;
pub use weights::{Linear, Loader, Stack};

/// Architectures weft runs, as `general.architecture` names them.
pub const SUPPORTED_ARCHITECTURES: &str = "llama, gemma3";

/// What callers need to know about a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// `general.architecture`.
    pub arch: String,
    /// Vocabulary size (rows of the output projection).
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
}

/// One token of a forward batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchToken {
    pub token: u32,
    /// Position id (RoPE angle and causal order).
    pub pos: u32,
    pub seq: SeqId,
    /// KV slot the token's key and value go to (already appended to `seq`).
    pub slot: usize,
    /// Whether logits are wanted for this token.
    pub logits: bool,
    /// Whether its final-norm hidden state is wanted (embeddings; no LM head needed).
    pub hidden: bool,
    /// Index of this token's attention mask in the `masks` given to [`Model::forward`]; `None`
    /// is the causal mask (every earlier position of the sequence).
    pub mask: Option<u32>,
    /// Index of this token's adapters in the `loras` given to [`Model::forward`]; `None`: the
    /// base model.
    pub lora: Option<u32>,
    /// Index of this token's input vector in the `embeds` given to [`Model::forward`] (one row
    /// of `n_embd` values each), which replaces the embedding of `token`; `None`: `token`'s.
    pub embed: Option<u32>,
}

/// Which KV slots of its sequence a token attends to: slot `i` (the `i`-th token appended to
/// the sequence) is visible when `visible[i]`; slots past the end are not. Replaces the causal
/// rule for that token (a sliding-window layer still applies its window). A mask may reach
/// past the token's own slot to slots later tokens of the same batch fill (bidirectional
/// attention within a block, as Gemma 3's image tokens attend). A mask may also
/// carry an additive attention bias: `bias[i]` is added to the token's (scaled) score for
/// slot `i`, as Hugging Face's float attention masks are.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlotMask {
    visible: Vec<bool>,
    bias: Option<Vec<f32>>,
}

impl SlotMask {
    /// A mask from one flag per slot.
    pub fn new(visible: Vec<bool>) -> SlotMask {
        SlotMask {
            visible,
            bias: None,
        }
    }

    /// A mask from one additive bias per slot: `-inf` hides a slot, any other value is added
    /// to the slot's score. NaN counts as hidden.
    pub fn with_bias(bias: Vec<f32>) -> SlotMask {
        let visible = bias.iter().map(|&b| b > f32::NEG_INFINITY).collect();
        SlotMask {
            visible,
            bias: Some(bias),
        }
    }

    /// This mask with a slot hidden wherever `other` hides it, and `other`'s bias (if any).
    pub fn and(mut self, other: &SlotMask) -> SlotMask {
        for (v, i) in self.visible.iter_mut().zip(0..) {
            *v &= other.allows(i);
        }
        if other.bias.is_some() {
            self.bias = other.bias.clone();
        }
        self
    }

    /// The additive bias per slot, if the mask has one.
    #[inline]
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// Number of slots the mask covers.
    pub fn len(&self) -> usize {
        self.visible.len()
    }

    /// Whether the mask covers no slot.
    pub fn is_empty(&self) -> bool {
        self.visible.is_empty()
    }

    /// Whether slot `i` is visible.
    #[inline]
    pub fn allows(&self, i: usize) -> bool {
        self.visible.get(i).copied().unwrap_or(false)
    }

    /// The last slot the mask lets through, if any.
    pub fn last_visible(&self) -> Option<usize> {
        self.visible.iter().rposition(|&v| v)
    }
}

/// A transformer that runs batched forward passes over a paged KV cache.
pub trait Model: Send + Sync {
    /// Shape and vocabulary.
    fn info(&self) -> &ModelInfo;
    /// The KV cache this model needs.
    fn kv_layout(&self) -> KvLayout;
    /// Runs `tokens`, writing their KV entries, and fills `logits` with one row of
    /// `vocab_size` values per token whose `logits` flag is set, and `hidden` with one row of
    /// `n_embd` values (the hidden state after the final norm) per token whose `hidden` flag is
    /// set, both in batch order. A token with
    /// `mask: Some(i)` attends as `masks[i]` says, one with `lora: Some(j)` runs with the
    /// adapters `loras[j]`, one with `embed: Some(e)` starts from row `e` of `embeds` instead
    /// of its token's embedding.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;

    /// The rows the model feeds its first block for `ids` (`ids.len() × n_embd` values into
    /// `out`): the embedding rows, scaled as the model scales them (Gemma: by √n_embd). Given
    /// back as [`BatchToken::embed`] inputs, they reproduce the ids exactly.
    fn input_embeddings(&self, ids: &[u32], out: &mut [f32]) -> Result<()>;
}

/// Refuses a file of an architecture weft does not run, naming it: checked before anything
/// else is read from the file (its tokenizer may be one weft lacks too, which would hide
/// the reason). A BERT-family GGUF is told that encoders load from safetensors.
pub fn check_architecture(file: &GgufFile) -> Result<()> {
    match file.architecture()? {
        "llama" | "gemma3" => Ok(()),
        other => Err(Error::UnknownArchitecture {
            arch: other.to_string(),
            supported: match other.contains("bert") {
                true => {
                    "llama, gemma3; encoders such as BERT load from a sentence-transformers \
                         folder with model.safetensors, not from GGUF"
                }
                false => SUPPORTED_ARCHITECTURES,
            },
        }),
    }
}

/// Loads the model a GGUF file describes, every block resident.
pub fn load(file: Arc<GgufFile>) -> Result<Box<dyn Model>> {
    load_paged(file, None)
}

/// Loads the model a GGUF file describes; with a `pager`, at most its number of blocks stay
/// resident (see [`LayerPager`]).
pub fn load_paged(file: Arc<GgufFile>, pager: Option<Arc<LayerPager>>) -> Result<Box<dyn Model>> {
    check_architecture(&file)?;
    let arch = file.architecture()?.to_string();
    let loader = Loader {
        file,
        arch,
        source: None,
        // Loading is the only work running: all the cores (up to 4) repack.
        repack_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
    };
    match loader.arch.as_str() {
        "llama" => Ok(Box::new(llama::Llama::load(&loader, pager)?)),
        "gemma3" => Ok(Box::new(gemma3::Gemma3::load(&loader, pager)?)),
        other => Err(Error::UnknownArchitecture {
            arch: other.to_string(),
            supported: SUPPORTED_ARCHITECTURES,
        }),
    }
}

/// Activation buffers reused across forward passes: they grow to the largest batch seen and
/// are never freed, so a steady-state forward pass allocates nothing.
#[derive(Default)]
pub struct Workspace {
    pub x: Vec<f32>,
    pub h: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub out_rows: Vec<f32>,
    pub rope: Vec<(f32, f32)>,
    pub matmul: MatmulScratch,
}

/// `v[..n]`, growing `v` if it is shorter.
pub fn buf(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// The first block's input rows, into `x` (`tokens.len() × n_embd`): each token's row of the
/// embedding matrix times `scale` (1 for models that do not scale it), or, for a token with
/// `embed: Some(e)`, row `e` of `embeds` as given (the caller's vectors are already what the
/// first block reads: see [`Model::input_embeddings`]).
pub fn input_rows(
    emb: &Matrix,
    scale: f32,
    tokens: &[BatchToken],
    embeds: &[f32],
    x: &mut [f32],
) -> Result<()> {
    let d = emb.cols;
    for (t, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
        if let Some(e) = t.embed {
            let e = e as usize;
            let src = embeds
                .get(e * d..(e + 1) * d)
                .ok_or_else(|| Error::BadBatch {
                    reason: format!(
                        "input vector {e} of {} does not exist",
                        embeds.len() / d.max(1)
                    ),
                })?;
            row.copy_from_slice(src);
            continue;
        }
        if t.token as usize >= emb.rows {
            return Err(Error::TokenOutOfRange {
                id: t.token,
                vocab_size: emb.rows,
            });
        }
        kernels::dequantize_row(emb, t.token as usize, row);
        if scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
    Ok(())
}

/// [`Model::input_embeddings`] for a model whose first block reads its embedding rows times
/// `scale`.
pub fn embedding_rows(emb: &Matrix, scale: f32, ids: &[u32], out: &mut [f32]) -> Result<()> {
    if out.len() != ids.len() * emb.cols {
        return Err(Error::BadBatch {
            reason: format!(
                "{} ids need {} values of output, got {}",
                ids.len(),
                ids.len() * emb.cols,
                out.len()
            ),
        });
    }
    let tokens: Vec<BatchToken> = ids
        .iter()
        .map(|&token| BatchToken {
            token,
            pos: 0,
            seq: SeqId(0),
            slot: 0,
            logits: false,
            hidden: false,
            mask: None,
            lora: None,
            embed: None,
        })
        .collect();
    input_rows(emb, scale, &tokens, &[], out)
}

/// The final-norm hidden states of the rows that want them, into `hidden` (one row of
/// `norm.len()` values each, in batch order).
pub fn output_hidden(tokens: &[BatchToken], x: &[f32], norm: &[f32], eps: f32, hidden: &mut [f32]) {
    let d = norm.len();
    let picked = tokens
        .iter()
        .zip(x.chunks_exact(d))
        .filter(|(t, _)| t.hidden)
        .map(|(_, r)| r);
    for (dst, src) in hidden.chunks_exact_mut(d).zip(picked) {
        layers::rms_norm(src, norm, eps, dst);
    }
}

/// The last step of every model: final norm and output projection for the rows that want
/// logits (only those are computed: the projection is the largest matmul of a decode step).
#[allow(clippy::too_many_arguments)]
pub fn output_logits(
    pool: &ThreadPool,
    tokens: &[BatchToken],
    x: &[f32],
    norm: &[f32],
    eps: f32,
    output: &Matrix,
    ws_rows: &mut Vec<f32>,
    scratch: &mut MatmulScratch,
    logits: &mut [f32],
) {
    let d = norm.len();
    let n_out = tokens.iter().filter(|t| t.logits).count();
    if n_out == 0 {
        return;
    }
    let rows = buf(ws_rows, n_out * d);
    let picked = tokens
        .iter()
        .zip(x.chunks_exact(d))
        .filter(|(t, _)| t.logits)
        .map(|(_, r)| r);
    for (dst, src) in rows.chunks_exact_mut(d).zip(picked) {
        layers::rms_norm(src, norm, eps, dst);
    }
    kernels::matmul(
        pool,
        output,
        rows,
        n_out,
        &mut logits[..n_out * output.rows],
        scratch,
    );
}
