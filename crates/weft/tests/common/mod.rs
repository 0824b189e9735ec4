//! Shared by the integration tests: the real models, fetched on first use (the same helper as
//! weft-core's tests).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Mutex;

use weft::{Engine, EngineConfig, GgufFile};

/// The path of a known model, fetching it into the cache first if needed.
pub fn model_path(name: &str) -> PathBuf {
    // Tests run in parallel threads: fetch one model at a time so a fresh machine downloads
    // each file once.
    static FETCH: Mutex<()> = Mutex::new(());
    let hub = weft_hub::Hub::from_env().expect("WEFT_HOME or HOME must be set");
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    hub.resolve(name, &mut weft_hub::NoProgress)
        .unwrap_or_else(|e| panic!("cannot fetch model {name}: {e}"))
}

/// Opens a known model's GGUF file.
pub fn open_model(name: &str) -> GgufFile {
    let path = model_path(name);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

/// An engine over a known model with 2 threads and a KV cache of `kv_tokens`.
pub fn engine(name: &str, kv_tokens: usize) -> Engine {
    engine_with(
        name,
        EngineConfig {
            n_threads: 2,
            kv_tokens,
            ..EngineConfig::default()
        },
    )
}

/// An engine over a known model with `config`.
pub fn engine_with(name: &str, config: EngineConfig) -> Engine {
    Engine::open(&model_path(name), config).unwrap_or_else(|e| panic!("cannot load {name}: {e}"))
}

/// llama.cpp's reference outputs (see `weft_testkit::reference_dir`).
pub fn reference_dir() -> PathBuf {
    weft_testkit::reference_dir()
}
