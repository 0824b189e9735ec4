//! Writes a small seed corpus for the `gguf_parse` fuzz target into `corpus/gguf_parse/`.

use weft_core::gguf::{Array, GgmlType, GgufWriter, Value};

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

fn main() -> std::io::Result<()> {
    let dir = std::path::Path::new("corpus/gguf_parse");
    std::fs::create_dir_all(dir)?;

    let mut bpe = GgufWriter::new();
    bpe.metadata("general.architecture", Value::String("llama".into()))
        .metadata("llama.block_count", Value::U32(1))
        .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::String("smollm".into()))
        .metadata("tokenizer.ggml.tokens", strings(&["<s>", "H", "e", "l", "o", "He", "ll", "Ġ"]))
        .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![3, 1, 1, 1, 1, 1, 1, 1])))
        .metadata("tokenizer.ggml.merges", strings(&["H e", "l l"]))
        .metadata("tokenizer.ggml.bos_token_id", Value::U32(0))
        .metadata("tokenizer.ggml.add_bos_token", Value::Bool(true));
    bpe.tensor("token_embd.weight", GgmlType::Q8_0, &[32, 2], vec![0x3c; 68])
        .tensor("norm", GgmlType::F32, &[4], vec![0; 16]);
    std::fs::write(dir.join("bpe.gguf"), bpe.to_bytes())?;

    let mut spm = GgufWriter::new();
    spm.metadata("general.architecture", Value::String("gemma3".into()))
        .metadata("tokenizer.ggml.model", Value::String("llama".into()))
        .metadata("tokenizer.ggml.tokens", strings(&["<pad>", "<bos>", "▁", "a", "▁a", "<0x41>"]))
        .metadata("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0, 0.0, -1.0, -2.0, -0.5, 0.0])))
        .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![3, 3, 1, 1, 1, 6])))
        .metadata("nested", Value::Array(Array::Array(vec![Array::U8(vec![1, 2]), Array::Bool(vec![true])])));
    spm.tensor("q4k", GgmlType::Q4_K, &[256], vec![0x11; 144])
        .tensor("q6k", GgmlType::Q6_K, &[256], vec![0x22; 210])
        .tensor("q5_0", GgmlType::Q5_0, &[32], vec![0x33; 22]);
    std::fs::write(dir.join("spm.gguf"), spm.to_bytes())?;
    println!("wrote seeds to {}", dir.display());
    Ok(())
}
