//! The error type of the public API.

use weft_core::sampling::SamplerError;

/// Everything a call of the public API can fail with. Each variant names what the caller
/// passed and why it does not fit; nothing here is ever a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine core failed (model file, tokenizer, KV cache, forward pass).
    #[error(transparent)]
    Core(#[from] weft_core::Error),
    /// Fetching a model failed.
    #[error(transparent)]
    Hub(#[from] weft_hub::HubError),
    /// Rendering a chat template failed.
    #[error(transparent)]
    Chat(#[from] crate::chat::ChatError),
    /// A sampler's parameters are out of range.
    #[error("invalid sampler: {0}")]
    Sampler(#[from] SamplerError),
    /// A sampler or probe refers to an index past the tokens of the pass.
    #[error("{what} at index {index}, but the pass runs only {len} tokens")]
    IndexOutOfRange {
        what: &'static str,
        index: usize,
        len: usize,
    },
    /// A token id past the model's vocabulary.
    #[error("token id {id} is not in the vocabulary ({vocab_size} tokens)")]
    TokenOutOfVocab { id: u32, vocab_size: usize },
    /// `input_at` got a different number of positions than tokens.
    #[error("input_at: {tokens} tokens but {positions} positions")]
    PositionCount { tokens: usize, positions: usize },
    /// A position past the context length the engine allows.
    #[error("position {pos} is past the context length {n_ctx}")]
    PositionOutOfRange { pos: u32, n_ctx: usize },
    /// A mask of the wrong length.
    #[error("{what} has length {got}, expected {expected}")]
    MaskLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// Input vectors (`input_embeds`, `fill_embeds`) of the wrong shape or with values that
    /// are not finite.
    #[error("input embeddings: {reason}")]
    InputEmbeds { reason: String },
    /// An additive attention bias of the wrong shape, or one that lets a token see a later one.
    #[error("attention bias: {reason}")]
    AttentionBias { reason: String },
    /// A padded batch of prompts whose rows, attention mask or padding do not fit together.
    #[error("padded batch: {reason}")]
    PaddedBatch { reason: String },
    /// The pass would make the context longer than the engine allows.
    #[error("the context would hold {len} tokens, more than its limit of {n_ctx}")]
    ContextTooLong { len: usize, n_ctx: usize },
    /// A pass with no tokens to run.
    #[error("the pass has no input tokens (fill the context or call input)")]
    EmptyPass,
    /// A logit mask allows no token at all (or the logit biases leave every token at `-inf`),
    /// so nothing can be sampled.
    #[error("the logit mask allows no token (or every token's logit is -inf after the biases)")]
    NothingAllowed,
    /// The model computed NaN logits: its weights are broken (a corrupt file, a NaN scale).
    #[error("the model computed NaN logits: its weights are probably corrupt (check the file)")]
    NanLogits,
    /// [`crate::Generator::accept`] got a token the generator's constraints do not allow at
    /// that point of the output (none of the tokens passed is taken).
    #[error(
        "token id {id} is not allowed by the generator's constraint at this point of the output"
    )]
    TokenNotAllowed { id: u32 },
    /// The truncation length is longer than the context.
    #[error("cannot truncate a context of {len} tokens to {n} (tokens filled but not run yet do not count)")]
    TruncateTooLong { n: usize, len: usize },
    /// Generator options that cannot be used together.
    #[error("{0}")]
    Config(String),
    /// A JSON schema, regular expression or grammar that does not compile, or generated tokens
    /// that do not fit a constraint.
    #[error("invalid {kind}: {message}")]
    Grammar { kind: &'static str, message: String },
    /// `collect_json`: the output does not parse into the requested type.
    #[error("the output is not the requested JSON: {message} (output: {output:?})")]
    Json { message: String, output: String },
    /// Bytes that are not a weft snapshot, or one damaged or cut short.
    #[error("not a usable weft snapshot: {reason}")]
    SnapshotCorrupt { reason: String },
    /// A snapshot written by a newer weft, in a format version this one cannot read.
    #[error("snapshot format version {found} is not supported (this weft reads versions 1 to {supported})")]
    SnapshotVersion { found: u32, supported: u32 },
    /// A snapshot taken on another model than the engine's (their fingerprints differ).
    #[error(
        "the snapshot was taken on another model ({snapshot}) than this engine runs ({model})"
    )]
    ModelFingerprintMismatch { snapshot: String, model: String },
    /// Beam-search options out of range (`num_beams` 0, more return sequences than beams, …)
    /// or a [`crate::beam::BeamScorer`] step that does not fit its state.
    #[error("beam search: {reason}")]
    BeamSearch { reason: String },
    /// Request `index` of a batch ([`crate::rollout::generate_batch`]) cannot run; nothing of
    /// the batch ran. [`Error::cause`] gives the error of the request itself.
    #[error("request {index} of the batch: {source}")]
    InRequest { index: usize, source: Box<Error> },
    /// Reading or writing a snapshot failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The engine's scheduler thread is gone: it panicked, the engine shut down, or this
    /// process is a `fork()` of the one that made the engine.
    #[error(
        "the engine has stopped (or was made before this process was forked from its parent: \
         make a new engine in this process)"
    )]
    EngineStopped,
    /// The caller's watcher (the `go_on` of [`crate::Engine::embed_tokens_watched`]) said to
    /// stop before the work was done; nothing of it is kept.
    #[error("stopped by the caller before it finished")]
    Cancelled,
}

impl Error {
    /// Whether the KV cache had no free page for the pass: not the caller's fault, and worth
    /// a retry once other contexts have given pages back (see [`crate::Context::evict`]).
    pub fn is_kv_full(&self) -> bool {
        matches!(
            self.cause(),
            Error::Core(weft_core::Error::KvCacheFull { .. })
        )
    }

    /// The error itself, or for [`Error::InRequest`] the request's own error.
    pub fn cause(&self) -> &Error {
        match self {
            Error::InRequest { source, .. } => source.cause(),
            e => e,
        }
    }

    /// Whether a rewind ([`crate::Context::truncate`]) went further back than a
    /// sliding-window model's cache still holds keys for.
    pub fn is_rewind_past_window(&self) -> bool {
        matches!(
            self.cause(),
            Error::Core(weft_core::Error::RewindPastWindow { .. })
        )
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// [`Error::TokenOutOfVocab`] for the first of `ids` past a vocabulary of `vocab_size`.
pub(crate) fn check_vocab(ids: impl IntoIterator<Item = u32>, vocab_size: usize) -> Result<()> {
    match ids.into_iter().find(|&id| id as usize >= vocab_size) {
        Some(id) => Err(Error::TokenOutOfVocab { id, vocab_size }),
        None => Ok(()),
    }
}
