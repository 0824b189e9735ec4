//! weft: a fast, CPU-first, programmable LLM inference engine.
//!
//! Load a model into an [`Engine`] (a handle to one scheduler thread), make [`Context`]s on
//! it, and drive them with the two layers of the API:
//!
//! - [`Forward`]: one pass — inputs at positions, attention masks, logit masks, samplers and
//!   probes ([`Logits`], [`Distribution`], [`Logprob`], [`Logprobs`], [`Entropy`]) at any
//!   position, `execute().await`.
//! - [`Generator`]: the loop over passes — samplers, stop rules, collectors, manual stepping.
//!
//! Every pass of every live context goes to the engine's scheduler, which batches them into
//! shared model calls (continuous batching). Futures work under any executor; [`block_on`]
//! runs one from blocking code.
//!
//! ```no_run
//! use weft::{Engine, Sampler};
//! # fn main() -> weft::Result<()> {
//! let engine = Engine::load("smollm2-135m")?; // fetched into the cache on first use
//! let mut ctx = engine.context();
//! ctx.fill("The capital of France is")?;
//! let text = weft::block_on(ctx.generate(Sampler::Argmax).max_tokens(16).collect_text())?;
//! println!("{text}");
//! # Ok(()) }
//! ```
//!
//! Dependencies point one way: front ends (CLI, HTTP server) → this crate → the engine core
//! ([`weft_core`]) and the model registry ([`weft_hub`]).

mod adapter;
pub mod beam;
mod brle;
pub mod chat;
pub mod constraint;
mod context;
mod converted;
mod embed;
mod embedder;
mod engine;
mod error;
mod executor;
mod forward;
mod generator;
mod kv_wait;
mod output;
mod probe;
mod rewind;
pub mod rollout;
mod scheduler;
mod session;
pub mod speculate;

pub use adapter::Adapter;
pub use brle::Brle;
pub use chat::{ChatTemplate, Message};
pub use constraint::{Constraint, Schema, TokenMask};
pub use context::Context;
pub use converted::{conversions, open_model, prune_conversions, Conversion};
pub use embed::{
    ensure_decoder, is_gguf, open_embedding_model, EmbedOptions, EmbeddingModel, Pooling,
};
pub use embedder::{Embedder, EmbedderConfig};
pub use engine::{Engine, EngineConfig, GenerationDefaults, Metrics};
pub use error::{Error, Result};
pub use executor::{block_on, block_on_for};
pub use forward::Forward;
pub use generator::{Generator, Step, StepOutput, StopReason, StopRules, StopStrings};
pub use output::{ForwardOutput, OutputHandle, SampleHandle};
pub use probe::{
    Distribution, Entropy, Hidden, Logits, Logprob, LogprobProbe, Logprobs, Probe, ProbeHandle,
};
pub use rewind::Rewindable;
/// The schemars (1.x) that [`Generator::collect_json`] derives schemas with: derive
/// `JsonSchema` from this one (`#[schemars(crate = "weft::schemars")]`) to match its version.
pub use schemars;
pub use session::SNAPSHOT_VERSION;
pub use speculate::{DraftModel, NgramSpeculator, Speculator};
pub use weft_core::sampling::{Penalties, Sampler};
/// The engine core's error, inside [`Error::Core`]: match its variants through this name.
pub use weft_core::Error as CoreError;

pub use weft_core::gguf::{self, GgmlType, GgufFile};
pub use weft_core::kernels::{self, bandwidth};
pub use weft_core::kv::KvType;
pub use weft_core::runner::{BatchEntry, ModelRunner, RunnerConfig};
pub use weft_core::tokenizer::{self, StreamDecoder, Tokenizer};
pub use weft_core::{checkpoint, kv, lora, models, quant, runner, sampling};
pub use weft_hub::{self as hub, Hub, HubError, NoProgress, Progress};
