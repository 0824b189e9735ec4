//! Any byte string given to the safetensors reader ends in a file or an error, never a panic or
//! an out-of-bounds read; every tensor of a file that parses reads back (or errors) cleanly. The
//! same bytes as a `tokenizer.json` build a tokenizer or an error, and encoding with it does not
//! panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_core::models::TensorFile;
use weft_core::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = TensorFile::from_bytes("fuzz", data.to_vec()) {
        for (name, shape) in file.tensors() {
            let _ = file.f32(&name, &shape);
        }
    }
    if let Ok(tok) = Tokenizer::from_json(&String::from_utf8_lossy(data)) {
        let ids = tok.encode("Hello [SEP] wörld  12 🙂 北京", true, true);
        let _ = tok.decode(&ids);
    }
});
