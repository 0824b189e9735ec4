//! The one error type of the engine core.

use std::path::PathBuf;

use crate::gguf::GgmlType;

/// Everything that can go wrong in the engine core: reading a model file, dequantizing a
/// tensor, tokenizing. Messages are written for the user who passed the file or the text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("not a GGUF file (it starts with \"{}\", not \"GGUF\")", found.escape_ascii())]
    BadMagic { found: [u8; 4] },
    /// A GGUF version this reader does not handle.
    #[error("unsupported GGUF version {version} (weft reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },
    /// The file ends before the structure it announces.
    #[error("truncated GGUF file: {what} at byte {offset} needs {needed} bytes, {available} left")]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// A count or length larger than the file could possibly hold.
    #[error("corrupt GGUF file: {what} of {count} at byte {offset} cannot fit in the file")]
    ImplausibleCount {
        what: &'static str,
        count: u64,
        offset: u64,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("corrupt GGUF file: unknown metadata value type {type_id} for key {key:?}")]
    UnknownValueType { key: String, type_id: u32 },
    /// Arrays nested deeper than any real file does.
    #[error("corrupt GGUF file: arrays nested more than {max} deep under key {key:?}")]
    NestingTooDeep { key: String, max: usize },
    /// A string that is not valid UTF-8.
    #[error("corrupt GGUF file: {what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },
    /// The same metadata key or tensor name appears twice.
    #[error("corrupt GGUF file: duplicate {what} {name:?}")]
    Duplicate { what: &'static str, name: String },
    /// A tensor whose element type id is not a known ggml type.
    #[error("tensor {name:?} has unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    /// A tensor shape that is empty, too large or not a whole number of blocks.
    #[error("tensor {name:?} has an invalid shape {shape:?} for type {dtype}: {reason}")]
    BadShape {
        name: String,
        shape: Vec<u64>,
        dtype: GgmlType,
        reason: &'static str,
    },
    /// `general.alignment` is not a power of two, or a tensor offset is not aligned to it.
    #[error("corrupt GGUF file: {what} (alignment {alignment})")]
    BadAlignment { what: String, alignment: u64 },
    /// A tensor's bytes reach past the end of the file.
    #[error("tensor {name:?} (bytes {start}..{end} of the data section) lies past the end of the file ({data_len} data bytes)")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    /// A metadata key the caller needs is missing.
    #[error("model file has no metadata key {key:?}")]
    MissingKey { key: String },
    /// A metadata key holds a value of another type than expected.
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongValueType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A tensor the caller asked for is not in the file.
    #[error("model file has no tensor {name:?}")]
    MissingTensor { name: String },
    /// Dequantization of a type weft has no dequantizer for.
    #[error("dequantizing {dtype} is not supported")]
    UnsupportedType { dtype: GgmlType },
    /// A byte buffer whose length is not a whole number of blocks of its type.
    #[error("{len} bytes are not a whole number of {dtype} blocks ({block_bytes} bytes each)")]
    PartialBlock {
        dtype: GgmlType,
        len: usize,
        block_bytes: usize,
    },
    /// An output buffer whose length differs from the element count of the input.
    #[error("output buffer holds {found} values, the {dtype} input has {expected}")]
    OutputLength {
        dtype: GgmlType,
        expected: usize,
        found: usize,
    },
    /// The tokenizer metadata is missing or inconsistent.
    #[error("invalid tokenizer in model file: {reason}")]
    BadTokenizer { reason: String },
    /// A tokenizer model (`tokenizer.ggml.model`) weft does not implement.
    #[error("unsupported tokenizer model {model:?} (weft supports \"gpt2\" BPE and \"llama\" SentencePiece)")]
    UnsupportedTokenizer { model: String },
    /// The KV cache has no free page left for a write.
    #[error("KV cache is full: {needed_pages} more pages needed, {free_pages} free (free some sequences or raise the cache size)")]
    KvCacheFull {
        needed_pages: usize,
        free_pages: usize,
    },
    /// The KV cache for this many tokens cannot be allocated.
    #[error("a {kv_type} KV cache cannot store heads of {head_dim} values (q8_0 needs a multiple of 32; use f16)")]
    KvTypeUnfit {
        kv_type: &'static str,
        head_dim: usize,
    },

    #[error("cannot allocate a KV cache for {max_tokens} tokens with this model's shape (lower the cache size)")]
    KvTooLarge { max_tokens: usize },
    /// A sequence id that is not (or no longer) in the KV cache.
    #[error("sequence {seq} is not in the KV cache")]
    UnknownSequence { seq: u64 },
    /// A sequence id that is already in the KV cache.
    #[error("sequence {seq} is already in the KV cache")]
    SequenceExists { seq: u64 },
    /// A rewind to a point whose sliding-window keys were already released.
    #[error("cannot go back to {to} tokens: the model's sliding-window layers ({window} positions) have already released keys that point needs (a context can go back about one window behind its end; start a new context and fill it instead)")]
    RewindPastWindow { seq: u64, to: usize, window: usize },
    /// A token placed so far back that the sliding-window keys it would see were released.
    #[error("position {pos} is too far behind the context's highest position: the model's sliding-window layers have already released keys a token there would see")]
    PositionBehindWindow { seq: u64, pos: u32 },
    /// A model file of an architecture weft does not implement.
    #[error("unsupported model architecture {arch:?} (weft runs: {supported})")]
    UnknownArchitecture {
        arch: String,
        supported: &'static str,
    },
    /// A model hyper-parameter that is missing, zero or inconsistent.
    #[error("invalid model: {reason}")]
    BadModel { reason: String },
    /// A model that uses something weft does not implement (`what`): refused rather than run
    /// without it, which would give wrong outputs silently.
    #[error("this model uses {what}, which weft does not implement")]
    UnsupportedModel { what: String },
    /// A weight of a type the matrix kernels do not run.
    #[error(
        "tensor {name} is {dtype}, a type weft has no matrix kernels for (they run {}){}",
        matmul_type_names(),
        widen_hint(*dtype)
    )]
    UnsupportedWeight { name: String, dtype: GgmlType },
    /// A forward batch that cannot run.
    #[error("invalid batch: {reason}")]
    BadBatch { reason: String },
    /// A LoRA adapter that cannot be used with this model (wrong base, missing or misshapen
    /// tensors, an option weft does not implement).
    #[error("invalid LoRA adapter: {reason}")]
    BadAdapter { reason: String },
    /// Saved KV state that does not fit this cache's layout.
    #[error("saved KV state does not fit this model's cache: {reason}")]
    BadKvState { reason: String },
    /// A sequence would grow past the model's context length.
    #[error("sequence of {len} tokens exceeds the context length {n_ctx}")]
    ContextOverflow { len: usize, n_ctx: usize },
    /// A token id past the end of the vocabulary.
    #[error("token id {id} is out of the vocabulary (size {vocab_size})")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    /// A thread count past [`crate::threadpool::MAX_THREADS`], or threads the operating
    /// system would not start.
    #[error("cannot run on {n_threads} threads: {reason}")]
    Threads { n_threads: usize, reason: String },
}

/// Result with the engine core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The types the matrix kernels run, for [`Error::UnsupportedWeight`].
fn matmul_type_names() -> String {
    let names: Vec<String> = crate::kernels::MATMUL_TYPES
        .iter()
        .map(|t| t.to_string())
        .collect();
    names.join(", ")
}

/// How to run a weight type the kernels lack but can be dequantized.
fn widen_hint(dtype: GgmlType) -> &'static str {
    match crate::quant::is_supported(dtype) {
        true => {
            "; widened to F16 or F32 as the model loads (`--weights f16`, \
                 `EngineConfig::checkpoint_weights`) it runs"
        }
        false => "",
    }
}
