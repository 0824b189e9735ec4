//! weft's integration tests (the public API on the real models and on tiny synthetic ones),
//! one module per file beside this one, built as one test binary: one compile and link instead
//! of one per file (31 s against about 60 on two cores). `cargo test -p weft --test suite lora::`
//! runs one file's tests.

mod common;

mod api;
mod beam_search;
mod bidirectional;
mod bpe_json;
mod chat_template;
mod constrained_generation;
mod constraints_llg;
mod embeddings;
mod encoder_files;
mod examples;
mod generation_api;
mod input_embeds;
mod layer_pager;
mod lora;
mod minilm;
mod model_files;
mod prefix_cache;
mod readme;
mod snapshot;
mod speculative;
