//! all-MiniLM-L6-v2 (a BERT encoder from safetensors + tokenizer.json) against independent
//! references: token ids from Hugging Face `tokenizers`, sentence vectors from a float64
//! forward (`../shared/reference/minilm.json`, see its README), and a semantic sanity check.

use crate::common;

use std::sync::OnceLock;

use serde_json::Value;
use weft::{EmbedOptions, Embedder, EmbedderConfig, Pooling};

fn embedder() -> &'static Embedder {
    static MODEL: OnceLock<Embedder> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = common::model_path("all-minilm-l6-v2");
        let config = EmbedderConfig {
            n_threads: 2,
            ..EmbedderConfig::default()
        };
        Embedder::open(&path, config).unwrap_or_else(|e| panic!("cannot load MiniLM: {e}"))
    })
}

fn cases(file: &str) -> Vec<Value> {
    let path = match file {
        "minilm.json" => common::reference_dir().join(file),
        _ => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(file),
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("reference JSON");
    v["cases"].as_array().expect("cases").clone()
}

fn ids(case: &Value) -> Vec<u32> {
    case["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|i| i.as_u64().expect("id") as u32)
        .collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Token ids equal Hugging Face `tokenizers`' on the reference texts and on the fixture's
/// accents, CJK, emoji, control characters, long words, truncation and empty strings.
#[test]
fn token_ids_match_hf_tokenizers() {
    let model = embedder();
    let mut checked = 0;
    for file in ["minilm.json", "minilm_tokenize.json"] {
        for case in cases(file) {
            let text = case["text"].as_str().expect("text");
            assert_eq!(model.tokenize(text), ids(&case), "{file}: {text:?}");
            checked += 1;
        }
    }
    assert!(checked > 60, "only {checked} cases");
    // Special tokens written in the text are matched before normalization, as `tokenizers`
    // does (its ids for this text: [101, 102, 7632, 103, 102]).
    assert_eq!(
        model.tokenize("[SEP] hi [MASK]"),
        [101, 102, 7632, 103, 102]
    );
}

/// Sentence vectors have cosine ≥ 0.9999 to the float64 reference.
#[test]
fn embeddings_match_the_reference() {
    let model = embedder();
    let cases = cases("minilm.json");
    let texts: Vec<&str> = cases
        .iter()
        .map(|c| c["text"].as_str().expect("text"))
        .collect();
    let got = model.embed_batch(&texts).expect("embed");
    let mut worst = (1.0f64, "");
    for (case, v) in cases.iter().zip(&got) {
        let want: Vec<f64> = case["embedding"]
            .as_array()
            .expect("embedding")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect();
        assert_eq!(v.len(), want.len());
        let c = cosine(v, &want);
        if c < worst.0 {
            worst = (c, case["text"].as_str().unwrap_or(""));
        }
    }
    eprintln!("worst cosine {:.7} on {:?}", worst.0, worst.1);
    assert!(worst.0 >= 0.9999, "cosine {} on {:?}", worst.0, worst.1);
    // The figure sentence-transformers' documentation prints for this pair.
    let pair = model
        .embed_batch(&["A man is eating food.", "A man is eating a piece of bread."])
        .expect("embed");
    let c: f32 = pair[0].iter().zip(&pair[1]).map(|(a, b)| a * b).sum();
    assert!((c - 0.755).abs() < 0.001, "{c}");
}

/// A text's vector is bit-identical alone and inside batches of other texts of other lengths,
/// whatever call it lands in.
#[test]
fn batch_invariance() {
    let model = embedder();
    let texts = [
        "The cat sat on the mat.",
        "A much longer sentence about nothing in particular, with commas, clauses and more words than the others.",
        "short",
        "Paris is the capital of France.",
    ];
    let together = model.embed_batch(&texts).expect("embed");
    let small_calls = Embedder::open(
        &common::model_path("all-minilm-l6-v2"),
        EmbedderConfig {
            n_threads: 1,
            batch_tokens: 16,
        },
    )
    .expect("load");
    let split = small_calls.embed_batch(&texts).expect("embed");
    for (i, t) in texts.iter().enumerate() {
        let alone = model.embed(t).expect("embed");
        assert_eq!(alone, together[i], "{t:?} alone vs batched");
        assert_eq!(
            split[i], together[i],
            "{t:?} in calls of 16 tokens on 1 thread"
        );
    }
}

/// A watched batch is asked before each model call with the inputs done so far, and stops
/// with `Cancelled` when told to.
#[test]
fn a_watched_batch_reports_its_progress_and_stops_when_told() {
    let small_calls = Embedder::open(
        &common::model_path("all-minilm-l6-v2"),
        EmbedderConfig {
            n_threads: 2,
            batch_tokens: 16,
        },
    )
    .expect("load");
    let inputs: Vec<Vec<u32>> = (0..6)
        .map(|i| small_calls.tokenize(&format!("sentence {i} about the sea")))
        .collect();
    let opts = EmbedOptions::default();
    let mut seen = Vec::new();
    let all = small_calls
        .embed_tokens_watched(&inputs, opts, &mut |done| {
            seen.push(done);
            true
        })
        .expect("embed");
    assert_eq!(all, embedder().embed_tokens(&inputs, opts).expect("plain"));
    // Seven tokens each ([CLS] sentence i about the sea [SEP]): two inputs per 16-token call.
    assert!(inputs.iter().all(|ids| ids.len() == 7), "{inputs:?}");
    assert_eq!(seen, [0, 2, 4]);
    let stopped = small_calls.embed_tokens_watched(&inputs, opts, &mut |done| done < 2);
    assert!(
        matches!(stopped, Err(weft::Error::Cancelled)),
        "{stopped:?}"
    );
}

/// Of 20 query/document pairs, each query's nearest document is its own.
#[test]
fn queries_find_their_documents() {
    let pairs = [
        (
            "How do I bake bread?",
            "Mix flour, water, yeast and salt, let the dough rise, then bake it in a hot oven.",
        ),
        (
            "What is the capital of Japan?",
            "Tokyo is the capital city of Japan.",
        ),
        (
            "How do vaccines work?",
            "Vaccines train the immune system to recognize a pathogen.",
        ),
        (
            "Best way to learn a language",
            "Practising speaking every day with native speakers helps you become fluent.",
        ),
        (
            "Why is the sky blue?",
            "Sunlight is scattered by the atmosphere, and blue light scatters the most.",
        ),
        (
            "How to change a flat tyre",
            "Loosen the wheel nuts, jack up the car, swap the wheel and tighten the nuts.",
        ),
        (
            "Symptoms of the flu",
            "Influenza causes fever, cough, sore throat and muscle aches.",
        ),
        (
            "How does a computer store data?",
            "Hard drives and memory chips hold information as bits.",
        ),
        (
            "Who wrote Hamlet?",
            "Hamlet is a tragedy by William Shakespeare.",
        ),
        (
            "How to keep houseplants alive",
            "Water your indoor plants regularly and give them enough light.",
        ),
        (
            "What do pandas eat?",
            "Giant pandas feed almost entirely on bamboo.",
        ),
        (
            "How to save money",
            "Make a budget, cut unnecessary spending and put part of your income aside.",
        ),
        (
            "When did World War II end?",
            "The Second World War ended in 1945.",
        ),
        (
            "How do airplanes fly?",
            "Wings generate lift as air flows faster over their upper surface.",
        ),
        (
            "Healthy breakfast ideas",
            "Oatmeal with fruit or yogurt with nuts is a nutritious morning meal.",
        ),
        (
            "How to fix a slow laptop",
            "Close background programs and free up disk space to speed up the computer.",
        ),
        (
            "What is photosynthesis?",
            "Plants convert sunlight, water and carbon dioxide into sugar and oxygen.",
        ),
        (
            "Tips for better sleep",
            "Go to bed at the same time every night and avoid screens before sleeping.",
        ),
        (
            "How to train a puppy",
            "Reward your young dog with treats when it obeys commands.",
        ),
        (
            "What causes earthquakes?",
            "Earthquakes happen when tectonic plates suddenly slip along faults.",
        ),
    ];
    let model = embedder();
    let queries: Vec<&str> = pairs.iter().map(|p| p.0).collect();
    let docs: Vec<&str> = pairs.iter().map(|p| p.1).collect();
    let q = model.embed_batch(&queries).expect("embed");
    let d = model.embed_batch(&docs).expect("embed");
    for (i, qv) in q.iter().enumerate() {
        let scores: Vec<f32> = d
            .iter()
            .map(|dv| qv.iter().zip(dv).map(|(a, b)| a * b).sum())
            .collect();
        let best = (0..scores.len())
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
            .unwrap_or(usize::MAX);
        assert_eq!(best, i, "{:?} found {:?}", queries[i], docs.get(best));
    }
}

/// Pooling options: CLS is the first token's row, None gives every token's unit vector, and
/// unnormalized mean pooling is the normalized one scaled.
#[test]
fn pooling_options() {
    let model = embedder();
    let text = "A woman is playing violin.";
    let n = model.tokenize(text).len();
    let rows = model
        .embed_batch_opts(
            &[text],
            EmbedOptions {
                pooling: Pooling::None,
                normalize: false,
                ..EmbedOptions::default()
            },
        )
        .expect("embed")
        .remove(0);
    assert_eq!(rows.len(), n * model.dim());
    let cls = model.embed_with(text, Pooling::Cls).expect("embed");
    let first = &rows[..model.dim()];
    let norm: f32 = first.iter().map(|x| x * x).sum::<f32>().sqrt();
    for (a, b) in cls.iter().zip(first) {
        assert!((a - b / norm).abs() < 1e-6);
    }
    let raw = model
        .embed_batch_opts(
            &[text],
            EmbedOptions {
                pooling: Pooling::Mean,
                normalize: false,
                ..EmbedOptions::default()
            },
        )
        .expect("embed")
        .remove(0);
    let unit = model.embed(text).expect("embed");
    let raw_norm: f32 = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(
        raw_norm > 1.5,
        "a BERT mean is not unit length ({raw_norm})"
    );
    for (a, b) in unit.iter().zip(&raw) {
        assert!((a - b / raw_norm).abs() < 1e-6);
    }
}
