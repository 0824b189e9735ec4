//! Python exceptions mirroring `weft::Error`: one class per variant, all subclasses of
//! `weft.WeftError`, carrying the Rust error's message unchanged.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{create_exception, PyTypeInfo};

create_exception!(
    weft,
    WeftError,
    PyException,
    "Base class of every error weft raises."
);

/// Declares each exception with its base and docstring, and lists them for the module.
macro_rules! exceptions {
    ($($name:ident($base:ident): $doc:literal;)*) => {
        $(create_exception!(weft, $name, $base, $doc);)*

        /// Adds `WeftError` and every subclass to the module.
        pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("WeftError", WeftError::type_object(py))?;
            $(m.add(stringify!($name), $name::type_object(py))?;)*
            Ok(())
        }
    };
}

exceptions! {
    ModelError(WeftError): "The engine core failed: model file, tokenizer, KV cache or forward pass.";
    KvCacheFull(ModelError): "The KV cache had no free page for the pass; retry once other contexts have given pages back.";
    NanLogits(ModelError): "The model computed logits that are not numbers (NaN), so nothing can be sampled.";
    RewindPastWindow(ModelError): "A context cannot go back that far: the model's sliding-window layers have released keys that point needs.";
    HubError(WeftError): "Fetching a model failed.";
    ChatTemplateError(WeftError): "Rendering the model's chat template failed.";
    InvalidSampler(WeftError): "A sampler's parameters are out of range.";
    IndexOutOfRange(WeftError): "A sampler or probe refers to an index past the tokens of the pass.";
    TokenOutOfVocab(WeftError): "A token id past the model's vocabulary.";
    TokenNotAllowed(WeftError): "Generation.accept got a token the generation's constraint does not allow there.";
    PositionCount(WeftError): "input_at got a different number of positions than tokens.";
    PositionOutOfRange(WeftError): "A position past the context length the engine allows.";
    MaskLength(WeftError): "A mask of the wrong length.";
    InputEmbeds(WeftError): "Input vectors of the wrong shape or with values that are not finite.";
    AttentionBias(WeftError): "An additive attention bias of the wrong shape.";
    PaddedBatch(WeftError): "A padded batch whose rows, attention mask or padding do not fit together.";
    ContextTooLong(WeftError): "The pass would make the context longer than the engine allows.";
    EmptyPass(WeftError): "A pass with no tokens to run.";
    NothingAllowed(WeftError): "A logit mask allows no token at all (or logit biases left every token at -inf).";
    TruncateTooLong(WeftError): "The truncation length is longer than the context.";
    ConfigError(WeftError): "Options that cannot be used together, or an unknown option value.";
    GrammarError(WeftError): "A JSON schema, regular expression or grammar that does not compile.";
    JsonError(WeftError): "The output is not the requested JSON.";
    SnapshotCorrupt(WeftError): "Bytes that are not a weft snapshot, or one damaged or cut short.";
    SnapshotVersion(WeftError): "A snapshot in a format version this weft cannot read.";
    ModelFingerprintMismatch(WeftError): "A snapshot taken on another model than the engine's.";
    BeamSearchError(WeftError): "Beam-search options out of range.";
    IoError(WeftError): "Reading or writing a file failed.";
    EngineStopped(WeftError): "The engine's scheduler thread is gone.";
    ContextBusy(WeftError): "The context is in use by a generation or pass that has not finished (Python only: Rust's borrow rules prevent this).";
    StalePass(ContextBusy): "A pass whose context has run or gained tokens since forward() made it, so that its indices would point at other tokens: make the pass again (Python only: Rust's borrow rules prevent this).";
}

/// The Python exception for `e`, with its message.
pub fn to_py(e: weft::Error) -> PyErr {
    use weft::Error as E;
    let msg = e.to_string();
    // A batch's error names its request in the message, and keeps the request's own class.
    match e.cause() {
        _ if e.is_kv_full() => KvCacheFull::new_err(msg),
        _ if e.is_rewind_past_window() => RewindPastWindow::new_err(msg),
        // A file that cannot be read (missing, a directory, no permission) is an I/O error
        // wherever it was opened, as `Context.save` and friends raise.
        E::Core(weft::CoreError::Io { .. }) => IoError::new_err(msg),
        E::Core(weft::CoreError::Threads { .. }) => ConfigError::new_err(msg),
        E::Core(_) => ModelError::new_err(msg),
        E::NanLogits => NanLogits::new_err(msg),
        E::Hub(_) => HubError::new_err(msg),
        E::Chat(_) => ChatTemplateError::new_err(msg),
        E::Sampler(_) => InvalidSampler::new_err(msg),
        E::IndexOutOfRange { .. } => IndexOutOfRange::new_err(msg),
        E::TokenOutOfVocab { .. } => TokenOutOfVocab::new_err(msg),
        E::TokenNotAllowed { .. } => TokenNotAllowed::new_err(msg),
        E::PositionCount { .. } => PositionCount::new_err(msg),
        E::PositionOutOfRange { .. } => PositionOutOfRange::new_err(msg),
        E::MaskLength { .. } => MaskLength::new_err(msg),
        E::InputEmbeds { .. } => InputEmbeds::new_err(msg),
        E::AttentionBias { .. } => AttentionBias::new_err(msg),
        E::PaddedBatch { .. } => PaddedBatch::new_err(msg),
        E::ContextTooLong { .. } => ContextTooLong::new_err(msg),
        E::EmptyPass => EmptyPass::new_err(msg),
        E::NothingAllowed => NothingAllowed::new_err(msg),
        E::TruncateTooLong { .. } => TruncateTooLong::new_err(msg),
        E::Config(_) => ConfigError::new_err(msg),
        E::Grammar { .. } => GrammarError::new_err(msg),
        E::Json { .. } => JsonError::new_err(msg),
        E::SnapshotCorrupt { .. } => SnapshotCorrupt::new_err(msg),
        E::SnapshotVersion { .. } => SnapshotVersion::new_err(msg),
        E::ModelFingerprintMismatch { .. } => ModelFingerprintMismatch::new_err(msg),
        E::BeamSearch { .. } => BeamSearchError::new_err(msg),
        E::Io(_) => IoError::new_err(msg),
        E::EngineStopped => EngineStopped::new_err(msg),
        _ => WeftError::new_err(msg),
    }
}

/// `Result<T, weft::Error>` → `PyResult<T>`.
pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for weft::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
