//! Shared by the integration tests: the real models, fetched on first use (the same helper as
//! weft-core's tests).

#![allow(dead_code)]

use std::sync::Mutex;

use weft::GgufFile;

/// Opens a known model, fetching it into the cache first if needed.
pub fn open_model(name: &str) -> GgufFile {
    // Tests run in parallel threads: fetch one model at a time so a fresh machine downloads
    // each file once.
    static FETCH: Mutex<()> = Mutex::new(());
    let hub = weft_hub::Hub::from_env().expect("WEFT_HOME or HOME must be set");
    let path = {
        let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
        hub.resolve(name, &mut weft_hub::NoProgress)
            .unwrap_or_else(|e| panic!("cannot fetch model {name}: {e}"))
    };
    GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}
