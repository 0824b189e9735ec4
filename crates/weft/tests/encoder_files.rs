//! Encoder model files that are broken — truncated or garbled safetensors, wrong shapes, wrong
//! types, missing tensors, malformed `tokenizer.json` / `config.json` — give typed errors that
//! name the problem, never a panic. A tiny synthetic BERT written here with the `safetensors`
//! crate stands in for a real model (and shows `Embedder::from_bytes` working).

use std::collections::HashMap;

use safetensors::tensor::{Dtype, TensorView};
use weft::{Embedder, EmbedderConfig, Error};

const D: usize = 8;
const FF: usize = 16;
const VOCAB: usize = 12;

const CONFIG: &str = r#"{"model_type": "bert", "vocab_size": 12, "hidden_size": 8,
  "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
  "max_position_embeddings": 16, "type_vocab_size": 2, "hidden_act": "gelu",
  "layer_norm_eps": 1e-12}"#;

/// A WordPiece tokenizer.json over a 12-token vocabulary.
fn tokenizer_json() -> String {
    let words = [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "##s", "on", "mat", ".", "a",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), serde_json::json!(i)))
        .collect();
    let added: Vec<_> = (0..4)
        .map(|i| serde_json::json!({"id": i, "content": words[i], "special": true}))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                        "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    })
    .to_string()
}

/// Every tensor of the tiny BERT with its shape.
fn shapes() -> Vec<(String, Vec<usize>)> {
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![VOCAB, D]),
        ("embeddings.position_embeddings.weight".into(), vec![16, D]),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, D]),
        ("embeddings.LayerNorm.weight".into(), vec![D]),
        ("embeddings.LayerNorm.bias".into(), vec![D]),
    ];
    let p = "encoder.layer.0";
    for (name, shape) in [
        ("attention.self.query", vec![D, D]),
        ("attention.self.key", vec![D, D]),
        ("attention.self.value", vec![D, D]),
        ("attention.output.dense", vec![D, D]),
        ("intermediate.dense", vec![FF, D]),
        ("output.dense", vec![D, FF]),
    ] {
        t.push((format!("{p}.{name}.bias"), vec![shape[0]]));
        t.push((format!("{p}.{name}.weight"), shape));
    }
    for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
        t.push((format!("{p}.{norm}.weight"), vec![D]));
        t.push((format!("{p}.{norm}.bias"), vec![D]));
    }
    t
}

/// The safetensors bytes of the tiny BERT, with `edit` applied to each (name, dtype, shape).
fn model_bytes(edit: impl Fn(&str, &mut Dtype, &mut Vec<usize>) -> bool) -> Vec<u8> {
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (i, (name, mut shape)) in shapes().into_iter().enumerate() {
        let mut dtype = Dtype::F32;
        if !edit(&name, &mut dtype, &mut shape) {
            continue; // dropped
        }
        let n: usize = shape.iter().product();
        let bytes_per = if dtype == Dtype::F16 { 2 } else { 4 };
        let bytes: Vec<u8> = (0..n)
            .flat_map(|j| {
                let v = ((i * 31 + j * 7) % 17) as f32 / 17.0 - 0.5;
                let b = v.to_le_bytes();
                b[..bytes_per].to_vec()
            })
            .collect();
        data.push((name, dtype, shape, bytes));
    }
    let views: HashMap<String, TensorView> = data
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let view = TensorView::new(*dtype, shape.clone(), bytes).expect("consistent view");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize(&views, None).expect("serialize")
}

fn load(model: Vec<u8>, config: &str, tokenizer: &str) -> weft::Result<Embedder> {
    Embedder::from_bytes(model, config, tokenizer, EmbedderConfig::default())
}

fn expect_error(what: &str, result: weft::Result<Embedder>, needle: &str) {
    match result {
        Ok(_) => panic!("{what}: loaded"),
        Err(e) => {
            let msg = e.to_string();
            assert!(matches!(e, Error::Core(_)), "{what}: {e:?}");
            assert!(
                msg.contains(needle),
                "{what}: {msg:?} should mention {needle:?}"
            );
        }
    }
}

#[test]
fn a_tiny_bert_loads_from_bytes_and_embeds() {
    let model = load(model_bytes(|_, _, _| true), CONFIG, &tokenizer_json()).expect("loads");
    assert_eq!(model.tokenize("The cats sat."), [2, 4, 5, 7, 6, 10, 3]);
    let v = model.embed("the cat sat on the mat.").expect("embeds");
    assert_eq!(v.len(), D);
    let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5);
    // Out-of-vocabulary ids and over-long inputs are refused, not run.
    assert!(matches!(
        model.embed_tokens(&[vec![2, 99, 3]], Default::default()),
        Err(Error::TokenOutOfVocab { id: 99, .. })
    ));
    assert!(matches!(
        model.embed_tokens(&[vec![4; 17]], Default::default()),
        Err(Error::ContextTooLong { len: 17, n_ctx: 16 })
    ));
    assert!(matches!(
        model.embed_tokens(&[vec![]], Default::default()),
        Err(Error::EmptyPass)
    ));
}

#[test]
fn broken_safetensors_give_typed_errors() {
    let tok = tokenizer_json();
    let good = model_bytes(|_, _, _| true);
    // Cut anywhere: the header, the table, the data.
    for cut in [0, 1, 7, 8, 9, 50, good.len() / 2, good.len() - 1] {
        expect_error(
            &format!("cut at {cut}"),
            load(good[..cut].to_vec(), CONFIG, &tok),
            "",
        );
    }
    // A header length pointing past the end, and garbage.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_error("huge header", load(huge, CONFIG, &tok), "safetensors");
    expect_error(
        "garbage",
        load(b"not a model at all".to_vec(), CONFIG, &tok),
        "safetensors",
    );
    let q = "encoder.layer.0.attention.self.query.weight";
    let wrong_shape = model_bytes(|n, _, s| {
        if n == q {
            *s = vec![D, D + 1];
        }
        true
    });
    expect_error("wrong shape", load(wrong_shape, CONFIG, &tok), q);
    let wrong_dtype = model_bytes(|n, d, _| {
        if n == q {
            *d = Dtype::I32;
        }
        true
    });
    expect_error("wrong dtype", load(wrong_dtype, CONFIG, &tok), "I32");
    let missing = model_bytes(|n, _, _| n != "encoder.layer.0.output.LayerNorm.bias");
    expect_error(
        "missing",
        load(missing, CONFIG, &tok),
        "output.LayerNorm.bias",
    );
    // F16 weights are fine.
    let half = model_bytes(|_, d, _| {
        *d = Dtype::F16;
        true
    });
    assert!(load(half, CONFIG, &tok).is_ok());
}

#[test]
fn broken_configs_and_tokenizers_give_typed_errors() {
    let tok = tokenizer_json();
    let model = || model_bytes(|_, _, _| true);
    for (what, config, needle) in [
        ("empty", "", "config.json"),
        ("not json", "{", "config.json"),
        (
            "odd heads",
            &CONFIG.replace("\"num_attention_heads\": 2", "\"num_attention_heads\": 3"),
            "heads",
        ),
        (
            "negative",
            &CONFIG.replace("\"hidden_size\": 8", "\"hidden_size\": -8"),
            "hidden_size",
        ),
        ("relu", &CONFIG.replace("gelu", "relu"), "hidden_act"),
        (
            "one position",
            &CONFIG.replace(
                "\"max_position_embeddings\": 16",
                "\"max_position_embeddings\": 1",
            ),
            "max_position_embeddings",
        ),
        (
            "roberta",
            &CONFIG.replace("\"bert\"", "\"roberta\""),
            "roberta",
        ),
        (
            "wider",
            &CONFIG.replace("\"hidden_size\": 8", "\"hidden_size\": 16"),
            "shape",
        ),
    ] {
        expect_error(what, load(model(), config, &tok), needle);
    }
    let edit = |from: &str, to: &str| tok.replacen(from, to, 1);
    for (what, tokenizer, needle) in [
        ("empty", String::new(), "tokenizer.json"),
        ("cut", tok[..tok.len() / 2].to_string(), "tokenizer.json"),
        (
            "BPE",
            edit("\"type\":\"WordPiece\"", "\"type\":\"BPE\""),
            "BPE",
        ),
        (
            "unknown normalizer",
            edit("BertNormalizer", "Lowercase"),
            "Lowercase",
        ),
        (
            "no unk",
            edit("\"unk_token\":\"[UNK]\"", "\"unk_token\":\"<unk>\""),
            "<unk>",
        ),
        ("id past the vocab", edit("\"mat\":9", "\"mat\":99"), "mat"),
        (
            "added token mismatch",
            edit("\"content\":\"[SEP]\"", "\"content\":\"[END]\""),
            "[END]",
        ),
    ] {
        expect_error(what, load(model(), CONFIG, &tokenizer), needle);
    }
}

/// A sentence-transformers folder of the tiny BERT with these `modules.json` and pooling
/// `config.json` (at `pooling_path`).
fn folder(
    name: &str,
    modules: Option<&str>,
    pooling_path: &str,
    pooling: &str,
) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-st-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join(pooling_path)).expect("mkdir");
    std::fs::write(dir.join("model.safetensors"), model_bytes(|_, _, _| true)).expect("write");
    std::fs::write(dir.join("config.json"), CONFIG).expect("write");
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).expect("write");
    std::fs::write(dir.join(pooling_path).join("config.json"), pooling).expect("write");
    if let Some(m) = modules {
        std::fs::write(dir.join("modules.json"), m).expect("write");
    }
    dir
}

#[test]
fn a_folder_s_modules_and_pooling_are_followed_or_refused() {
    let open = |dir: &std::path::Path| Embedder::open(dir, EmbedderConfig::default());
    let modules = |pooling: &str, extra: &str| {
        format!(
            r#"[{{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}},
               {{"idx": 1, "name": "1", "path": "{pooling}", "type": "sentence_transformers.models.Pooling"}}{extra}]"#
        )
    };
    let mode = |m: &str| format!(r#"{{"word_embedding_dimension": 8, "{m}": true}}"#);
    // The pooling module's folder comes from modules.json, and each mode is the model's own.
    for (m, want) in [
        ("pooling_mode_mean_tokens", weft::Pooling::Mean),
        ("pooling_mode_cls_token", weft::Pooling::Cls),
        ("pooling_mode_max_tokens", weft::Pooling::Max),
        ("pooling_mode_lasttoken", weft::Pooling::Last),
    ] {
        let dir = folder(m, Some(&modules("pool", "")), "pool", &mode(m));
        assert_eq!(open(&dir).expect(m).pooling(), want, "{m}");
        std::fs::remove_dir_all(&dir).ok();
    }
    // What weft does not compute is refused, not silently replaced (the vectors would differ
    // from the model's): a Dense projection, and pooling modes it lacks.
    let dense = r#", {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}"#;
    let dir = folder(
        "dense",
        Some(&modules("1_Pooling", dense)),
        "1_Pooling",
        &mode("pooling_mode_mean_tokens"),
    );
    expect_error("a Dense module", open(&dir), "\"Dense\" module (2_Dense)");
    std::fs::remove_dir_all(&dir).ok();
    let dir = folder(
        "sqrt",
        None,
        "1_Pooling",
        &mode("pooling_mode_mean_sqrt_len_tokens"),
    );
    expect_error(
        "mean_sqrt_len",
        open(&dir),
        "pooling_mode_mean_sqrt_len_tokens",
    );
    std::fs::remove_dir_all(&dir).ok();
    let both = r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#;
    let dir = folder("both", None, "1_Pooling", both);
    expect_error(
        "two modes at once",
        open(&dir),
        "pooling_mode_mean_tokens + pooling_mode_cls_token",
    );
    std::fs::remove_dir_all(&dir).ok();
}
