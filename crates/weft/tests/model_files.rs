//! Model files weft cannot run are refused with the reason, before anything else is read.

use weft::{Engine, EngineConfig, Error};
use weft_core::gguf::{GgufWriter, Value};

/// The architecture is checked first: a file of one weft does not run says so, whatever its
/// tokenizer. A Qwen2 file was refused for its pre-tokenizer, which hid the reason, and a
/// BERT GGUF now learns that encoders load from safetensors.
#[test]
fn an_unknown_architecture_is_named_before_the_tokenizer_is_read() {
    for (name, pre, hint) in [
        ("qwen2", "qwen2", "weft runs: llama, gemma3)"),
        ("bert", "default", "model.safetensors"),
    ] {
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", Value::String(name.into()))
            .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
            .metadata("tokenizer.ggml.pre", Value::String(pre.into()));
        let e = Engine::from_bytes(w.to_bytes(), None, EngineConfig::default())
            .map(|_| ())
            .expect_err("refused");
        assert!(
            matches!(
                e,
                Error::Core(weft_core::Error::UnknownArchitecture { ref arch, .. }) if arch == name
            ),
            "{e}"
        );
        assert!(e.to_string().contains(hint), "{e}");
    }
}
