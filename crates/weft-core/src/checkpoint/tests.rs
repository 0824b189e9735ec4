//! Tiny synthetic checkpoints: what the conversion writes, and every refusal. The real models'
//! checkpoints are checked against llama.cpp in `tests/greedy_reference.rs`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

use super::*;
use crate::gguf::GgufFile;
use crate::runner::{BatchEntry, ModelRunner, RunnerConfig};
use crate::tokenizer::Tokenizer;

const HIDDEN: usize = 64;
const HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const FF: usize = 64;
const VOCAB: usize = 8;

fn tokenizer_json() -> Value {
    json!({
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true},
            {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
                  "byte_fallback": false, "ignore_merges": false,
                  "vocab": {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "ab": 5, "d": 6, "e": 7},
                  "merges": ["a b"]}
    })
}

fn llama_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": 1,
        "num_hidden_layers": 2, "intermediate_size": FF, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
        "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu"
    })
}

/// Deterministic values for tensor `name`.
fn values(name: &str, n: usize) -> Vec<f32> {
    let seed = name
        .bytes()
        .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    (0..n)
        .map(|i| {
            let x = seed.wrapping_add(i as u32).wrapping_mul(2_654_435_761);
            (x >> 8) as f32 / (1u32 << 24) as f32 * 0.2 - 0.1
        })
        .collect()
}

/// The tensors (name, shape) of a 2-layer Llama checkpoint.
fn llama_tensors() -> Vec<(String, Vec<usize>)> {
    let kvd = HEAD_DIM;
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".to_string(), vec![HIDDEN]),
        ("lm_head.weight".to_string(), vec![VOCAB, HIDDEN]),
    ];
    for i in 0..2 {
        for (p, shape) in [
            ("self_attn.q_proj", vec![HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.k_proj", vec![kvd, HIDDEN]),
            ("self_attn.v_proj", vec![kvd, HIDDEN]),
            ("self_attn.o_proj", vec![HIDDEN, HEADS * HEAD_DIM]),
            ("mlp.gate_proj", vec![FF, HIDDEN]),
            ("mlp.up_proj", vec![FF, HIDDEN]),
            ("mlp.down_proj", vec![HIDDEN, FF]),
            ("input_layernorm", vec![HIDDEN]),
            ("post_attention_layernorm", vec![HIDDEN]),
        ] {
            t.push((format!("model.layers.{i}.{p}.weight"), shape));
        }
    }
    t
}

/// The bytes of `name`'s values in `dtype` (F32 or BF16).
fn encoded(name: &str, shape: &[usize], dtype: Dtype) -> Vec<u8> {
    let v = values(name, shape.iter().product());
    match dtype {
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Writes `tensors` (in `dtype`) as one safetensors file at `path`.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>)], dtype: Dtype) {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s)| (n.clone(), s.clone(), encoded(n, s, dtype)))
        .collect();
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// A checkpoint folder with `config`, `tensors` in `dtype`, and the tiny tokenizer.
fn folder(config: &Value, tensors: &[(String, Vec<usize>)], dtype: Dtype) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        tokenizer_json().to_string(),
    )
    .unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors, dtype);
    dir
}

fn tensor_f32(file: &GgufFile, name: &str) -> Vec<f32> {
    let t = file.tensor(name).unwrap();
    crate::quant::dequantize_to_vec(t.dtype, file.tensor_data(t)).unwrap()
}

#[test]
fn a_llama_checkpoint_becomes_the_gguf_llama_cpp_would_write() {
    let dir = folder(&llama_config(), &llama_tensors(), Dtype::BF16);
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"chat_template": "{{ messages[0].content }}", "eos_token": "</s>"}).to_string(),
    )
    .unwrap();
    let file = GgufFile::from_bytes(convert(dir.path(), WeightType::F32).unwrap()).unwrap();
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(file.get_u64("llama.attention.head_count_kv").unwrap(), 1);
    assert_eq!(file.opt_f64("llama.rope.freq_base").unwrap(), Some(10000.0));
    assert_eq!(
        file.opt_str("tokenizer.chat_template").unwrap(),
        Some("{{ messages[0].content }}")
    );
    // BF16 values read exactly; Q and K rows go from halves to pairs, V does not.
    let bf16 = |name: &str, n: usize| -> Vec<f32> {
        values(name, n)
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect()
    };
    let q = bf16(
        "model.layers.1.self_attn.q_proj.weight",
        HEADS * HEAD_DIM * HIDDEN,
    );
    let q_pairs = pairs_from_halves(&q, HEADS, HEADS * HEAD_DIM, HIDDEN);
    assert_eq!(tensor_f32(&file, "blk.1.attn_q.weight"), q_pairs);
    assert_ne!(q_pairs, q);
    let v = bf16("model.layers.0.self_attn.v_proj.weight", HEAD_DIM * HIDDEN);
    assert_eq!(tensor_f32(&file, "blk.0.attn_v.weight"), v);
    assert_eq!(
        tensor_f32(&file, "blk.0.ffn_norm.weight"),
        bf16("model.layers.0.post_attention_layernorm.weight", HIDDEN)
    );
    assert!(file.tensor("output.weight").is_ok(), "untied head");
    // Untied without a head: the embedding serves, as in llama.cpp.
    let mut headless = llama_tensors();
    headless.retain(|(n, _)| n != "lm_head.weight");
    let dir = folder(&llama_config(), &headless, Dtype::F32);
    let tied = GgufFile::from_bytes(convert(dir.path(), WeightType::Q8_0).unwrap()).unwrap();
    assert!(tied.tensor("output.weight").is_err());
    // The tokenizer is the tokenizer.json, its special ids from config.json.
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.encode("abc", false, true), vec![5, 4]);
    assert_eq!(tok.vocab().special.eos, Some(1));
    // And the model runs.
    let mut runner = ModelRunner::new(Arc::new(file), &RunnerConfig::default()).unwrap();
    let seq = runner.new_sequence();
    let logits = runner
        .forward(&BatchEntry::run_of(&[0, 5, 4], seq, 0, false))
        .unwrap();
    assert_eq!(logits.len(), VOCAB);
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn q8_0_f16_and_f32_weights_hold_the_same_values_to_their_precision() {
    let dir = folder(&llama_config(), &llama_tensors(), Dtype::F32);
    let read = |w: WeightType| {
        let file = GgufFile::from_bytes(convert(dir.path(), w).unwrap()).unwrap();
        let t = file.tensor("blk.0.ffn_up.weight").unwrap();
        (t.dtype, tensor_f32(&file, "blk.0.ffn_up.weight"))
    };
    let (t32, exact) = read(WeightType::F32);
    assert_eq!(t32, GgmlType::F32);
    assert_eq!(
        exact,
        values("model.layers.0.mlp.up_proj.weight", FF * HIDDEN)
    );
    for (w, dtype, bound) in [
        (WeightType::F16, GgmlType::F16, 1e-4),
        (WeightType::Q8_0, GgmlType::Q8_0, 0.1 / 127.0),
    ] {
        let (t, got) = read(w);
        assert_eq!(t, dtype);
        let worst = got
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= bound, "{w}: off by {worst}");
    }
    for (s, w) in [
        ("q8_0", WeightType::Q8_0),
        ("F16", WeightType::F16),
        ("f32", WeightType::F32),
    ] {
        assert_eq!(s.parse::<WeightType>().unwrap(), w);
        assert_eq!(w.to_string().parse::<WeightType>().unwrap(), w);
    }
    assert!("q4_0"
        .parse::<WeightType>()
        .unwrap_err()
        .contains("q8_0, f16 or f32"));
}

#[test]
fn a_sharded_checkpoint_reads_every_shard() {
    let tensors = llama_tensors();
    let single = folder(&llama_config(), &tensors, Dtype::F32);
    let sharded = folder(&llama_config(), &tensors, Dtype::F32);
    std::fs::remove_file(sharded.path().join("model.safetensors")).unwrap();
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let mut map = HashMap::new();
    for (part, name) in [
        (a, "model-00001-of-00002.safetensors"),
        (b, "model-00002-of-00002.safetensors"),
    ] {
        write_safetensors(&sharded.path().join(name), part, Dtype::F32);
        map.extend(part.iter().map(|(n, _)| (n.clone(), name.to_string())));
    }
    let index = json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_eq!(
        convert(sharded.path(), WeightType::Q8_0).unwrap(),
        convert(single.path(), WeightType::Q8_0).unwrap()
    );
}

#[test]
fn an_index_naming_a_file_outside_the_folder_is_refused() {
    let tensors = llama_tensors();
    let dir = folder(&llama_config(), &tensors, Dtype::F32);
    let outside = folder(&llama_config(), &tensors, Dtype::F32);
    let escape = format!(
        "../{}/model.safetensors",
        outside.path().file_name().unwrap().to_string_lossy()
    );
    let absolute = outside.path().join("model.safetensors");
    for name in [escape.as_str(), &absolute.to_string_lossy(), ""] {
        let map: HashMap<&str, &str> = tensors.iter().map(|(n, _)| (n.as_str(), name)).collect();
        let index = json!({"metadata": {}, "weight_map": map});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let e = convert(dir.path(), WeightType::Q8_0).unwrap_err();
        assert!(
            e.to_string()
                .contains("not a file in the checkpoint's folder"),
            "{name}: {e}"
        );
    }
}

/// Gemma 3's tensors, under `prefix`.
fn gemma_tensors(prefix: &str) -> Vec<(String, Vec<usize>)> {
    let mut t = vec![
        (format!("{prefix}embed_tokens.weight"), vec![VOCAB, HIDDEN]),
        (format!("{prefix}norm.weight"), vec![HIDDEN]),
    ];
    for (p, shape) in [
        ("self_attn.q_proj", vec![HEADS * HEAD_DIM, HIDDEN]),
        ("self_attn.k_proj", vec![HEAD_DIM, HIDDEN]),
        ("self_attn.v_proj", vec![HEAD_DIM, HIDDEN]),
        ("self_attn.o_proj", vec![HIDDEN, HEADS * HEAD_DIM]),
        ("self_attn.q_norm", vec![HEAD_DIM]),
        ("self_attn.k_norm", vec![HEAD_DIM]),
        ("mlp.gate_proj", vec![FF, HIDDEN]),
        ("mlp.up_proj", vec![FF, HIDDEN]),
        ("mlp.down_proj", vec![HIDDEN, FF]),
        ("input_layernorm", vec![HIDDEN]),
        ("post_attention_layernorm", vec![HIDDEN]),
        ("pre_feedforward_layernorm", vec![HIDDEN]),
        ("post_feedforward_layernorm", vec![HIDDEN]),
    ] {
        t.push((format!("{prefix}layers.0.{p}.weight"), shape));
    }
    t
}

fn gemma_text_config() -> Value {
    json!({
        "model_type": "gemma3_text", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
        "num_key_value_heads": 1, "head_dim": HEAD_DIM, "num_hidden_layers": 1,
        "intermediate_size": FF, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 16, "sliding_window": 128, "layer_types": ["sliding_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": null
    })
}

#[test]
fn a_multimodal_gemma3_checkpoint_gives_its_text_decoder_with_norms_plus_one() {
    let config = json!({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                        "text_config": gemma_text_config(), "eos_token_id": [1, 7]});
    let mut tensors = gemma_tensors("model.language_model.");
    tensors.push(("model.vision_tower.patch.weight".into(), vec![4, 4]));
    let dir = folder(&config, &tensors, Dtype::F32);
    let file = GgufFile::from_bytes(convert(dir.path(), WeightType::Q8_0).unwrap()).unwrap();
    assert_eq!(file.architecture().unwrap(), "gemma3");
    assert_eq!(file.opt_f64("gemma3.rope.freq_base").unwrap(), Some(1e6));
    assert_eq!(
        file.get_u64("gemma3.attention.sliding_window").unwrap(),
        128
    );
    let scale = file.opt_f64("gemma3.attention.scale").unwrap().unwrap();
    assert!(
        (scale - 0.25).abs() < 1e-6,
        "1/sqrt(16), not 1/sqrt(head_dim): {scale}"
    );
    let norm = values(
        "model.language_model.layers.0.self_attn.k_norm.weight",
        HEAD_DIM,
    );
    let plus_one: Vec<f32> = norm.iter().map(|v| v + 1.0).collect();
    assert_eq!(tensor_f32(&file, "blk.0.attn_k_norm.weight"), plus_one);
    assert!(file.tensor("output.weight").is_err(), "the head is tied");
    assert_eq!(file.get_u64("tokenizer.ggml.eos_token_id").unwrap(), 1);
    let mut runner = ModelRunner::new(Arc::new(file), &RunnerConfig::default()).unwrap();
    let seq = runner.new_sequence();
    let logits = runner
        .forward(&BatchEntry::run_of(&[0, 2], seq, 0, false))
        .unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
}

/// The error converting `config` (with Llama's tensors unless `tensors` is given).
fn refusal(config: Value, tensors: Option<Vec<(String, Vec<usize>)>>) -> String {
    let dir = folder(&config, &tensors.unwrap_or_else(llama_tensors), Dtype::F32);
    match convert(dir.path(), WeightType::Q8_0) {
        Ok(_) => panic!("converted {config}"),
        Err(e) => e.to_string(),
    }
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

#[test]
fn what_weft_does_not_implement_is_refused_by_name() {
    let qwen = with(
        with(llama_config(), "architectures", json!(["Qwen2ForCausalLM"])),
        "model_type",
        json!("qwen2"),
    );
    let e = refusal(qwen, None);
    assert!(
        e.contains("Qwen2ForCausalLM") && e.contains("Gemma3ForCausalLM"),
        "{e}"
    );
    let e = refusal(
        with(
            llama_config(),
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 8.0}),
        ),
        None,
    );
    assert!(e.contains("RoPE scaling \"llama3\""), "{e}");
    // Version 5's rope_parameters beside version 4's rope_scaling: both are read.
    let both = |params, scaling| {
        let config = with(llama_config(), "rope_parameters", params);
        refusal(with(config, "rope_scaling", scaling), None)
    };
    let e = both(
        json!({"rope_type": "default", "rope_theta": 1e4}),
        json!({"type": "yarn", "factor": 4.0}),
    );
    assert!(e.contains("RoPE scaling \"yarn\""), "{e}");
    let e = both(
        json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
        json!({"type": "linear", "factor": 4.0}),
    );
    assert!(e.contains("two different RoPE scalings"), "{e}");
    let e = refusal(with(llama_config(), "hidden_act", json!("gelu")), None);
    assert!(e.contains("hidden_act"), "{e}");
    let e = refusal(with(llama_config(), "attention_bias", json!(true)), None);
    assert!(e.contains("attention_bias"), "{e}");
    let e = refusal(
        with(gemma_text_config(), "final_logit_softcapping", json!(30.0)),
        Some(gemma_tensors("model.")),
    );
    assert!(e.contains("final_logit_softcapping"), "{e}");
    let e = refusal(
        with(
            gemma_text_config(),
            "layer_types",
            json!(["full_attention"]),
        ),
        Some(gemma_tensors("model.")),
    );
    assert!(e.contains("layer_types"), "{e}");
    let mut local = gemma_text_config();
    local["rope_parameters"]["sliding_attention"]["rope_theta"] = json!(2e4);
    let e = refusal(local, Some(gemma_tensors("model.")));
    assert!(e.contains("a local RoPE base of 20000 "), "{e}");
    let quantized = with(
        llama_config(),
        "quantization_config",
        json!({"quant_method": "gptq"}),
    );
    let e = refusal(quantized, None);
    assert!(e.contains("quantization_config"), "{e}");
    let e = refusal(with(llama_config(), "num_hidden_layers", json!(0)), None);
    assert!(e.contains("num_hidden_layers"), "{e}");
}

#[test]
fn broken_checkpoints_are_errors_that_say_what_is_wrong() {
    // A missing tensor, a tensor of the wrong shape, a projection bias.
    let mut missing = llama_tensors();
    missing.retain(|(n, _)| n != "model.layers.1.mlp.down_proj.weight");
    assert!(refusal(llama_config(), Some(missing)).contains("model.layers.1.mlp.down_proj.weight"));
    let mut wrong = llama_tensors();
    wrong[0].1 = vec![VOCAB, HIDDEN / 2];
    assert!(refusal(llama_config(), Some(wrong)).contains("shape"));
    let mut biased = llama_tensors();
    biased.push((
        "model.layers.0.self_attn.q_proj.bias".into(),
        vec![HEADS * HEAD_DIM],
    ));
    assert!(refusal(llama_config(), Some(biased)).contains("biases"));
    // No tokenizer.json; a config that is not JSON; a truncated safetensors file.
    let dir = folder(&llama_config(), &llama_tensors(), Dtype::F32);
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let e = convert(dir.path(), WeightType::Q8_0).unwrap_err();
    assert!(
        matches!(e, Error::BadTokenizer { .. }) && e.to_string().contains("tokenizer.json"),
        "{e}"
    );
    let dir = folder(&llama_config(), &llama_tensors(), Dtype::F32);
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert!(convert(dir.path(), WeightType::Q8_0)
        .unwrap_err()
        .to_string()
        .contains("not JSON"));
    let dir = folder(&llama_config(), &llama_tensors(), Dtype::F32);
    let st = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let e = convert(dir.path(), WeightType::Q8_0).unwrap_err();
    assert!(
        e.to_string().contains("not a valid safetensors file"),
        "{e}"
    );
}

#[test]
fn only_encoder_folders_are_left_to_the_embedder() {
    let llama = folder(&llama_config(), &llama_tensors(), Dtype::F32);
    assert!(!is_encoder(llama.path()));
    assert_eq!(
        folder_of(&llama.path().join("model.safetensors")).as_deref(),
        Some(llama.path())
    );
    // A generator weft cannot load, or a config.json it cannot read, is for `convert` to
    // refuse with its reason, not an encoder.
    let qwen = folder(
        &json!({"model_type": "qwen2"}),
        &llama_tensors(),
        Dtype::F32,
    );
    assert!(!is_encoder(qwen.path()));
    std::fs::write(qwen.path().join("config.json"), "{ not json").unwrap();
    assert!(!is_encoder(qwen.path()));
    let bert = folder(
        &json!({"architectures": ["BertModel"], "model_type": "bert"}),
        &llama_tensors(),
        Dtype::F32,
    );
    assert!(is_encoder(bert.path()));
    let st = folder(
        &json!({"model_type": "unknown"}),
        &llama_tensors(),
        Dtype::F32,
    );
    std::fs::write(st.path().join("modules.json"), "[]").unwrap();
    assert!(is_encoder(st.path()), "a sentence-transformers folder");
    assert_eq!(folder_of(Path::new("/no/such/model.gguf")), None);
}

#[test]
fn settings_a_config_leaves_out_are_transformers_defaults() {
    // The published multimodal Gemma 3 configs name only a few settings of text_config:
    // transformers' Gemma3TextConfig gives the rest (8 heads, 4 KV heads, head size 256, …),
    // and the vocabulary is the embedding table's.
    let text = json!({"hidden_size": HIDDEN, "intermediate_size": FF, "num_hidden_layers": 1,
                      "num_attention_heads": HEADS, "num_key_value_heads": 1,
                      "head_dim": HEAD_DIM, "sliding_window": 128});
    let sparse = json!({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": text});
    let dir = folder(&sparse, &gemma_tensors("language_model.model."), Dtype::F32);
    let file = GgufFile::from_bytes(convert(dir.path(), WeightType::Q8_0).unwrap()).unwrap();
    assert_eq!(file.opt_f64("gemma3.rope.freq_base").unwrap(), Some(1e6));
    assert_eq!(file.get_u64("gemma3.context_length").unwrap(), 131_072);
    assert_eq!(
        file.tensor("token_embd.weight").unwrap().shape,
        vec![HIDDEN as u64, VOCAB as u64]
    );
    let scale = file.opt_f64("gemma3.attention.scale").unwrap().unwrap();
    assert!((scale - 1.0 / 16.0).abs() < 1e-6, "1/sqrt(256): {scale}");
    // Without head_dim, 256 (not hidden / heads = 32): the q_proj of 64 rows no longer fits.
    let mut no_head_dim = sparse.clone();
    no_head_dim["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("head_dim");
    let e = refusal(no_head_dim, Some(gemma_tensors("language_model.model.")));
    assert!(e.contains("q_proj") && e.contains("[512, 64]"), "{e}");
    // A Mistral config without sliding_window has transformers' 4096: refused.
    let mut mistral = with(llama_config(), "model_type", json!("mistral"));
    mistral["architectures"] = json!(["MistralForCausalLM"]);
    let e = refusal(mistral.clone(), None);
    assert!(e.contains("sliding window"), "{e}");
    let ok = folder(
        &with(mistral, "sliding_window", Value::Null),
        &llama_tensors(),
        Dtype::F32,
    );
    assert!(convert(ok.path(), WeightType::Q8_0).is_ok());
}

#[test]
fn pairs_from_halves_is_llama_cpps_permutation() {
    // One head of 4 rows: RoPE pairs rows (0, 2) and (1, 3) in Hugging Face's layout, (0, 1)
    // and (2, 3) in llama.cpp's.
    let x: Vec<f32> = (0..8).map(|v| v as f32).collect(); // 4 rows × 2 columns
    assert_eq!(
        pairs_from_halves(&x, 1, 4, 2),
        vec![0., 1., 4., 5., 2., 3., 6., 7.]
    );
    // Two heads permute separately.
    let y: Vec<f32> = (0..8).map(|v| v as f32).collect(); // 8 rows × 1 column
    assert_eq!(
        pairs_from_halves(&y, 2, 8, 1),
        vec![0., 2., 1., 3., 4., 6., 5., 7.]
    );
}

#[test]
fn q8_0_blocks_dequantize_to_the_values_within_half_a_step() {
    let x: Vec<f32> = (0..32 * 1100)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 97.0)
        .collect();
    let bytes = to_q8_0(&x);
    assert_eq!(bytes.len(), x.len() / 32 * 34);
    let back = crate::quant::dequantize_to_vec(GgmlType::Q8_0, &bytes).unwrap();
    for (b, (xs, ys)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
        let step = xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (a, y) in xs.iter().zip(ys) {
            // Half a step of rounding, and the f16 rounding of the scale (2^-11 relative).
            let bound = step * 0.5 + a.abs() / 2048.0 + 1e-6;
            assert!((a - y).abs() <= bound, "block {b}: {a} vs {y}");
        }
    }
}
