//! weft: a fast, CPU-first, programmable LLM inference engine.
//!
//! This crate is the public API. Today it gathers the foundation: the GGUF reader and
//! tokenizer of [`weft_core`] and the model registry of [`weft_hub`]; the `Context`,
//! `Forward` and `Generator` API builds on them.
//!
//! Key design decision: front ends (the CLI, the HTTP server) depend only on this crate, and
//! this crate only on the engine core, so dependencies point one way.
//!
//! ```no_run
//! use weft::{Hub, NoProgress, Tokenizer, GgufFile};
//! let path = Hub::from_env()?.resolve("smollm2-135m", &mut NoProgress)?;
//! let file = GgufFile::open(&path)?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! println!("{:?}", tok.encode("Hello world", true, true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use weft_core::gguf::{self, GgmlType, GgufFile};
pub use weft_core::runner::{BatchEntry, ModelRunner, RunnerConfig};
pub use weft_core::tokenizer::{self, StreamDecoder, Tokenizer};
pub use weft_core::{kv, models, quant, runner, sampling, Error};
pub use weft_hub::{self as hub, Hub, HubError, NoProgress, Progress};
