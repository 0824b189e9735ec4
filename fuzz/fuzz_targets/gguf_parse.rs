//! Any byte string given to the GGUF reader ends in a file or an error, never a panic or an
//! out-of-bounds read; a file that parses yields in-bounds tensor views and a tokenizer (or a
//! tokenizer error), and encoding/decoding with it does not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_core::gguf::GgufFile;
use weft_core::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes);
        if t.n_bytes <= 1 << 16 {
            let _ = weft_core::quant::dequantize_to_vec(t.dtype, file.tensor_data(t));
        }
    }
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        let ids = tok.encode("Hello <s> wörld  12 🙂", true, true);
        let _ = tok.decode(&ids);
        let _ = tok.decode(&[0, 1, u32::MAX]);
    }
});
