//! weft-core's integration tests (the real models against llama.cpp's reference outputs, and
//! tiny synthetic models), one module per file beside this one, built as one test binary: one
//! compile and link instead of one per file. `cargo test -p weft-core --test suite gguf_reader::`
//! runs one file's tests. `kv_memory.rs` stays a binary of its own: it measures this process's
//! resident memory, which tests running beside it would move.

mod common;

mod batched_forward;
mod dequant_reference;
mod gguf_reader;
mod greedy_reference;
mod model_loading;
mod tokenize_reference;
