//! Shared by the integration tests: the real models (fetched on first use) and llama.cpp's
//! reference outputs in `../shared/reference/`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Mutex;

use weft_core::gguf::GgufFile;

/// The two real models, by registry name and by the key the reference files use.
pub const MODELS: [(&str, &str); 2] = [("smollm2-135m", "smollm2"), ("gemma3-270m", "gemma3")];

/// Opens a known model, fetching it into the cache first if needed.
pub fn open_model(name: &str) -> GgufFile {
    let path = model_file(name);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

/// The path of a known model's file, fetching it into the cache first if needed.
pub fn model_file(name: &str) -> PathBuf {
    // Tests run in parallel threads: fetch one model at a time so a fresh machine downloads
    // each file once.
    static FETCH: Mutex<()> = Mutex::new(());
    let hub = weft_hub::Hub::from_env().expect("WEFT_HOME or HOME must be set");
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    hub.resolve(name, &mut weft_hub::NoProgress)
        .unwrap_or_else(|e| panic!("cannot fetch model {name}: {e}"))
}

/// llama.cpp's reference outputs (see `weft_testkit::reference_dir`).
pub fn reference_dir() -> PathBuf {
    weft_testkit::reference_dir()
}

/// Parses one JSON file of the reference directory.
pub fn reference_json(file: &str) -> serde_json::Value {
    let path = reference_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}
