//! Reading a model's tensors and hyper-parameters out of its GGUF file, with shape checks.

use std::borrow::Cow;
use std::sync::Arc;

use super::pager::PagerSource;
use super::BatchToken;
use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::kernels::{self, MatmulScratch};
use crate::kernels::{interleaved, Matrix};
use crate::lora::{self, AdapterSet, Proj};
use crate::quant;
use crate::threadpool::ThreadPool;

/// A weight matrix: read from the mapped file, or for the types that can be
/// [interleaved](crate::kernels::interleaved) a copy interleaved by 8 rows at load time (the
/// faster GEMM).
#[derive(Debug, Clone)]
pub struct Linear {
    /// Where the tensor lies in the file, kept so the forward pass needs no lookup by name.
    info: TensorInfo,
    /// The interleaved copy, when there is one.
    packed: Option<Arc<Vec<u8>>>,
    /// A copy in the file's row layout, for a tensor read from a pager source.
    owned: Option<Arc<Vec<u8>>>,
    /// The projection this is, for adapters ([`lora::key`]); `None` for other matrices.
    lora_key: Option<u32>,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

/// What every projection of one forward pass shares: the batch's tokens (and their adapters),
/// the thread pool and the model file.
pub struct Pass<'a> {
    pub pool: &'a ThreadPool,
    pub file: &'a GgufFile,
    pub tokens: &'a [BatchToken],
    pub loras: &'a [AdapterSet],
}

impl Pass<'_> {
    /// Adds each row's adapter deltas of the projection `key` (`x`: rows × `cols`, `y`: rows ×
    /// `rows`), when it is one adapters can target and the pass has adapters.
    fn add_adapter_deltas(
        &self,
        key: Option<u32>,
        x: &[f32],
        cols: usize,
        y: &mut [f32],
        rows: usize,
    ) {
        if let (Some(key), false) = (key, self.loras.is_empty()) {
            lora::apply(self.pool, key, self.tokens, self.loras, x, cols, y, rows);
        }
    }
}

impl Linear {
    /// `y = W·x` for the pass's rows (`x`: rows × `cols`, `y`: rows × `rows`), plus each row's
    /// adapter deltas when this projection has any.
    pub fn forward(
        &self,
        p: &Pass,
        x: &[f32],
        y: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<()> {
        let n = p.tokens.len();
        kernels::matmul(p.pool, &self.matrix(p.file)?, x, n, y, scratch);
        p.add_adapter_deltas(self.lora_key, x, self.cols, y, self.rows);
        Ok(())
    }

    /// The matrix view, borrowing the file's bytes or the interleaved copy.
    pub fn matrix<'a>(&'a self, file: &'a GgufFile) -> Result<Matrix<'a>> {
        let (dtype, rows, cols) = (self.info.dtype, self.rows, self.cols);
        match (&self.packed, &self.owned) {
            (Some(p), _) => Matrix::interleaved(dtype, p, rows, cols),
            (None, Some(o)) => Matrix::new(dtype, o, rows, cols),
            (None, None) => Matrix::new(dtype, file.tensor_data(&self.info), rows, cols),
        }
    }
}

/// Projections of one input stacked into as few matrix multiplications as their weight types
/// allow (Q, K and V of attention; gate and up of a gated feed-forward), as fused QKV and
/// gate-up projections do elsewhere: a run of neighbouring projections with one interleaved
/// type becomes one matrix whose rows are theirs in order, so the input is quantized once and
/// the pool is woken once for all of them. Each output row is computed exactly as by its own
/// matrix (a row's result depends only on that row and the input), so the bits are unchanged.
#[derive(Debug, Clone)]
pub struct Stack {
    /// The runs, each one matrix and the projections whose rows it holds.
    runs: Vec<(Linear, Vec<StackPart>)>,
}

/// One projection of a [`Stack`]: its output features and its adapter key.
#[derive(Debug, Clone, Copy)]
struct StackPart {
    rows: usize,
    lora_key: Option<u32>,
}

impl Stack {
    /// `ys[i] = W_i·x` for every projection `i` of the stack, in the order given at load, plus
    /// each row's adapter deltas. A stacked matrix writes each projection's rows straight into
    /// its buffer ([`kernels::matmul_split`]).
    ///
    /// # Panics
    /// If `ys` does not hold one buffer of `tokens × rows` per projection.
    pub fn forward(
        &self,
        p: &Pass,
        x: &[f32],
        ys: &mut [&mut [f32]],
        scratch: &mut MatmulScratch,
    ) -> Result<()> {
        let n = p.tokens.len();
        let mut at = 0;
        for (lin, parts) in &self.runs {
            let ys = &mut ys[at..at + parts.len()];
            at += parts.len();
            kernels::matmul_split(p.pool, &lin.matrix(p.file)?, x, n, ys, scratch);
            for (part, y) in parts.iter().zip(ys.iter_mut()) {
                p.add_adapter_deltas(part.lora_key, x, lin.cols, y, part.rows);
            }
        }
        Ok(())
    }
}

/// Looks up tensors and hyper-parameters of one architecture (`{arch}.…` keys).
#[derive(Clone)]
pub struct Loader {
    pub file: Arc<GgufFile>,
    pub arch: String,
    /// Where weight bytes come from instead of the file (a layer pager's source): the tensor
    /// table still comes from the file.
    pub source: Option<Arc<dyn PagerSource>>,
    /// Threads that repack weights into the interleaved layout: the machine's cores for a
    /// model loaded whole, 1 for layers a pager loads beside running passes.
    pub repack_threads: usize,
}

fn bad(reason: String) -> Error {
    Error::BadModel { reason }
}

impl Loader {
    /// A required integer hyper-parameter `{arch}.{key}`, which must be positive.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let full = format!("{}.{key}", self.arch);
        let v = self.file.get_u64(&full)?;
        if v == 0 || v > u32::MAX as u64 {
            return Err(bad(format!("{full} = {v}")));
        }
        Ok(v as usize)
    }

    /// An optional integer hyper-parameter.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        let full = format!("{}.{key}", self.arch);
        match self.file.get(&full) {
            None => Ok(None),
            Some(_) => self.usize(key).map(Some),
        }
    }

    /// An optional float hyper-parameter, which must be finite (a NaN epsilon or RoPE base
    /// would turn every logit into NaN or zero, silently).
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.opt_f32_where(key, "a finite number", |_| true)
    }

    /// [`Loader::opt_f32`] that must also pass `ok` (described by `what`, for the error).
    pub fn opt_f32_where(
        &self,
        key: &str,
        what: &str,
        ok: impl Fn(f32) -> bool,
    ) -> Result<Option<f32>> {
        let full = format!("{}.{key}", self.arch);
        match self.file.opt_f64(&full)?.map(|v| v as f32) {
            Some(v) if !(v.is_finite() && ok(v)) => {
                Err(bad(format!("{full} = {v}, where {what} is expected")))
            }
            v => Ok(v),
        }
    }

    /// A weight matrix `name` of shape `rows × cols` (ggml `[cols, rows]`) for matmuls only:
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K weights with a multiple of 8 rows are interleaved
    /// (see [`Linear`]), and the file's pages they were read from are released (a file read
    /// into memory rather than mapped keeps both copies).
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let mut lin = self.table(name, rows, cols)?;
        lin.lora_key = Proj::parse_gguf(name).map(|(layer, proj)| lora::key(layer, proj));
        let data = self.data(&lin.info)?;
        if interleaved::supports(lin.info.dtype) && rows.is_multiple_of(interleaved::GROUP_ROWS) {
            lin.packed = Some(Arc::new(self.repack(lin.info.dtype, &data, rows, cols)));
        } else if let Cow::Owned(bytes) = data {
            lin.owned = Some(Arc::new(bytes));
        }
        Ok(lin)
    }

    /// The projections `parts` (name, output features) of one input of `cols` features as a
    /// [`Stack`]: each as by [`Loader::linear`], and neighbours of one interleaved type
    /// concatenated into one matrix (the interleaved layout is by groups of 8 rows, so the
    /// concatenation is the layout of the stacked rows).
    pub fn stack(&self, parts: &[(&str, usize)], cols: usize) -> Result<Stack> {
        let mut runs: Vec<(Linear, Vec<StackPart>)> = Vec::new();
        for &(name, rows) in parts {
            let lin = self.linear(name, rows, cols)?;
            let part = StackPart {
                rows,
                lora_key: lin.lora_key,
            };
            match runs.last_mut() {
                Some((run, parts))
                    if run.info.dtype == lin.info.dtype && parts.len() < kernels::MAX_SPLITS =>
                {
                    if let (Some(packed), Some(more)) = (&mut run.packed, &lin.packed) {
                        Arc::make_mut(packed).extend_from_slice(more);
                        run.rows += rows;
                        parts.push(part);
                        continue;
                    }
                    runs.push((lin, vec![part]));
                }
                _ => runs.push((lin, vec![part])),
            }
        }
        Ok(Stack { runs })
    }

    /// [`interleaved::repack`] of `data` (`rows × cols` weights of `dtype`, from the file), a
    /// slice of rows at a time into one buffer, each slice's file pages released once copied:
    /// they are not read again, and a large tensor is then never resident twice (Gemma 3's
    /// tied 178 MB embedding, repacked whole, set the peak RSS of a whole run: 369 MiB, 298
    /// now). The interleaved layout goes by groups of 8 rows, so each slice of rows is a slice
    /// of the buffer.
    fn repack(&self, dtype: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
        const SLICE_BYTES: usize = 8 << 20;
        let group = interleaved::GROUP_ROWS;
        let row_bytes = data.len() / rows.max(1);
        let out_group = interleaved::group_bytes(dtype, cols);
        let step = (SLICE_BYTES / row_bytes.max(1))
            .next_multiple_of(group)
            .clamp(group, rows.max(group));
        let mut out = vec![0u8; rows / group * out_group];
        for r0 in (0..rows).step_by(step) {
            let r1 = (r0 + step).min(rows);
            let src = &data[r0 * row_bytes..r1 * row_bytes];
            let dst = &mut out[r0 / group * out_group..r1 / group * out_group];
            repack_parallel(dtype, src, r1 - r0, cols, dst, self.repack_threads);
            // A no-op for bytes from a pager source.
            self.file.release(src);
        }
        out
    }

    /// The bytes of a tensor: from the pager source if there is one (checked for length),
    /// else borrowed from the file.
    fn data(&self, info: &TensorInfo) -> Result<Cow<'_, [u8]>> {
        let Some(source) = &self.source else {
            return Ok(Cow::Borrowed(self.file.tensor_data(info)));
        };
        let bytes = source.read(info)?;
        if bytes.len() as u64 != info.n_bytes {
            return Err(bad(format!(
                "the pager source returned {} bytes for tensor {}, expected {}",
                bytes.len(),
                info.name,
                info.n_bytes
            )));
        }
        Ok(Cow::Owned(bytes))
    }

    /// A weight matrix `name` of shape `rows × cols` kept in the file's row layout (an
    /// embedding table, whose rows are looked up one by one).
    pub fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let info = self.file.tensor(name)?;
        if info.shape != [cols as u64, rows as u64] {
            return Err(bad(format!(
                "tensor {name} has shape {:?}, expected [{cols}, {rows}]",
                info.shape
            )));
        }
        if !kernels::MATMUL_TYPES.contains(&info.dtype) {
            return Err(Error::UnsupportedWeight {
                name: name.to_string(),
                dtype: info.dtype,
            });
        }
        let lin = Linear {
            info: info.clone(),
            packed: None,
            owned: None,
            lora_key: None,
            rows,
            cols,
        };
        lin.matrix(&self.file)?; // checks the shape fits the type's blocks
        Ok(lin)
    }

    /// An embedding table that is also the output projection (a tied LM head): interleaved as
    /// by [`Loader::linear`] when its rows can still be looked up in that layout (Q8_0, see
    /// [`interleaved::supports_lookup`]), so that the batched LM head gets the faster GEMM;
    /// else in the file's row layout, as [`Loader::table`].
    pub fn tied(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let dtype = self.file.tensor(name)?.dtype;
        if interleaved::supports_lookup(dtype) && rows.is_multiple_of(interleaved::GROUP_ROWS) {
            self.linear(name, rows, cols)
        } else {
            self.table(name, rows, cols)
        }
    }

    /// The RoPE frequency scale factor, read as llama.cpp reads it: `rope.scaling.factor`, or
    /// the older `rope.scale_linear`, applied linearly unless `rope.scaling.type` says
    /// otherwise ("none" leaves positions unscaled). YaRN and LongRoPE are refused: read as
    /// linear they would garble every position, and weft does not implement them.
    pub fn rope_scale(&self) -> Result<f32> {
        let key = |k: &str| format!("{}.rope.{k}", self.arch);
        let factor = match self.opt_f32("rope.scaling.factor")? {
            Some(f) => Some(f),
            None => self.opt_f32("rope.scale_linear")?,
        };
        let factor = factor.filter(|&f| f > 0.0).unwrap_or(1.0);
        match self.file.opt_str(&key("scaling.type"))? {
            None | Some("linear") => Ok(factor),
            Some("none") => Ok(1.0),
            Some(other) => Err(Error::UnsupportedModel {
                what: format!("{other:?} RoPE scaling ({})", key("scaling.type")),
            }),
        }
    }

    /// Refuses a file whose blocks hold biases or a mixture of experts, which the model files
    /// (Llama, Gemma 3) do not read: run without them, the outputs would be wrong silently
    /// (a "llamafied" Qwen has biases on Q, K and V), and a mixture of experts would only fail
    /// later, on a missing dense feed-forward.
    pub fn refuse_unread(&self) -> Result<()> {
        for t in self.file.tensors() {
            let Some(rest) = t.name.strip_prefix("blk.") else {
                continue;
            };
            let what = if rest.ends_with(".bias") {
                "bias vectors"
            } else if rest.contains("_exps.") || rest.contains(".ffn_gate_inp.") {
                "a mixture of experts"
            } else {
                continue;
            };
            return Err(Error::UnsupportedModel {
                what: format!("{what} ({})", t.name),
            });
        }
        Ok(())
    }

    /// Whether the file has a tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_ok()
    }

    /// A vector (norm weights, frequency factors) of `len` values, dequantized to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self.file.tensor(name)?;
        if info.n_elements() != len as u64 {
            return Err(bad(format!(
                "tensor {name} has {} values, expected {len}",
                info.n_elements()
            )));
        }
        quant::dequantize_to_vec(info.dtype, &self.data(info)?)
    }
}

/// [`interleaved::repack_into`] of `rows` rows split between up to `threads` threads:
/// repacking is most of a model's load time (Gemma 3: 0.35 of 0.75 s on one thread), and
/// each group of 8 rows is repacked on its own, so the parts of a slice are independent.
fn repack_parallel(
    dtype: GgmlType,
    src: &[u8],
    rows: usize,
    cols: usize,
    dst: &mut [u8],
    threads: usize,
) {
    /// Below this many bytes a thread's start costs more than it saves.
    const MIN_BYTES_PER_THREAD: usize = 256 << 10;
    let group = interleaved::GROUP_ROWS;
    let threads = threads
        .min(src.len() / MIN_BYTES_PER_THREAD)
        .min(rows / group)
        .max(1);
    if threads == 1 {
        return interleaved::repack_into(dtype, src, rows, cols, dst);
    }
    let row_bytes = src.len() / rows;
    let out_group = dst.len() / (rows / group);
    let per_thread = (rows / group).div_ceil(threads) * group;
    std::thread::scope(|scope| {
        let parts = src
            .chunks(per_thread * row_bytes)
            .zip(dst.chunks_mut(per_thread / group * out_group));
        for (src, dst) in parts {
            scope.spawn(move || {
                interleaved::repack_into(dtype, src, src.len() / row_bytes, cols, dst)
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{random_weights, Rng};

    /// Split between threads (an uneven split among them), the repacked bytes are those of
    /// one thread.
    #[test]
    fn repacking_on_several_threads_gives_the_same_layout() {
        let mut rng = Rng::new(9);
        let types = kernels::MATMUL_TYPES
            .into_iter()
            .filter(|&t| interleaved::supports(t));
        for dtype in types {
            // 2 MiB and more of weights: enough for 3 threads past the per-thread minimum.
            let (rows, cols) = (8 * 161, 16 * 256);
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let one = interleaved::repack(dtype, &wb, rows, cols);
            for threads in [2, 3] {
                let mut many = vec![0u8; one.len()];
                repack_parallel(dtype, &wb, rows, cols, &mut many, threads);
                assert!(many == one, "{dtype} on {threads} threads");
            }
        }
    }
}
