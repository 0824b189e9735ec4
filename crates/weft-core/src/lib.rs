//! weft's engine core: everything between a GGUF file on disk and a batch of logits.
//!
//! - [`gguf`]: our own GGUF reader (memory-mapped, zero-copy tensor views, every field
//!   validated so a corrupt file is an [`Error`], never a panic) and a small writer for tests.
//! - [`quant`]: scalar reference dequantizers for the ggml block types.
//! - [`tokenizer`]: byte-level BPE and SentencePiece tokenizers built from GGUF metadata,
//!   matching llama.cpp token for token.
//!
//! Key design decision: the core owns its file format and math. Nothing here depends on an
//! ML framework; the model file is the single source of truth for weights, hyper-parameters
//! and the tokenizer.

pub mod checkpoint;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod kv;
pub mod lora;
pub mod models;
pub mod quant;
pub mod runner;
pub mod sampling;
pub mod threadpool;
pub mod tokenizer;

pub use error::{Error, Result};
