//! Embeddings from the GGUF models against llama.cpp's `llama-embedding`
//! (`shared/reference/embeddings.json`: `--pooling mean|last|cls`, L2-normalized, one text per
//! run); a text's vector is bit-identical alone or in a batch; hidden states come without the
//! LM head.
//!
//! How close is close. `llama-embedding` splits its prompt at newlines (`--embd-separator`
//! defaults to "\n") and the file holds the first part's vector, so a text with a newline is
//! compared up to its first newline. SmolLM2 is within cosine 0.999 of every case. For Gemma 3,
//! llama.cpp itself does not reproduce the file to 0.999: its own `llama-server --embeddings`
//! at the same commit on the development machine reaches 0.99778 (last) and 0.99878 (mean) on
//! it, as activations are quantized to 8 bits and the 262k-vocabulary model's last hidden
//! state is sensitive; the Gemma bar is that shortfall with 2x headroom, 0.995.

use crate::common;

use weft::{EmbedOptions, Engine, Pooling};

fn engine(model: &str) -> Engine {
    common::engine(model, 4096)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn matches_llama_embedding(model: &str, key: &str, bar: f64) {
    let engine = engine(model);
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::reference_dir().join("embeddings.json")).unwrap(),
    )
    .unwrap();
    let cases: Vec<&serde_json::Value> = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["model"] == key)
        .collect();
    assert!(cases.len() >= 12, "reference lost its {key} cases");
    let mut worst = 1.0f64;
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        // What llama-embedding embedded: the text up to its first newline (see above).
        let text = text.split('\n').next().unwrap_or(text);
        let pooling: Pooling = case["pooling"].as_str().unwrap().parse().unwrap();
        let want: Vec<f32> = case["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let got = engine.embed_with(text, pooling).unwrap();
        assert_eq!(got.len(), want.len());
        let c = cosine(&got, &want);
        worst = worst.min(c);
        eprintln!("{key} {pooling:?} {text:?}: cosine {c:.6}");
    }
    eprintln!(
        "{key}: worst cosine to llama-embedding {worst:.6} over {} cases",
        cases.len()
    );
    assert!(worst >= bar, "{key}: worst cosine {worst} (bar {bar})");
}

#[test]
fn smollm2_matches_llama_embedding() {
    matches_llama_embedding("smollm2-135m", "smollm2", 0.999);
}

#[test]
fn gemma3_matches_llama_embedding() {
    matches_llama_embedding("gemma3-270m", "gemma3", 0.995);
}

#[test]
fn a_text_embeds_the_same_alone_or_in_a_batch() {
    let engine = engine("smollm2-135m");
    let texts = [
        "The cat sat on the mat.",
        "Paris is the capital of France.",
        "def add(a, b):\n    return a + b",
        "A much longer sentence about looms, weaving, warp and weft threads and the history of cloth.",
    ];
    for pooling in [Pooling::Mean, Pooling::Max, Pooling::Last, Pooling::Cls] {
        let batch = engine.embed_batch_with(&texts, pooling).unwrap();
        for (t, v) in texts.iter().zip(&batch) {
            assert!(
                engine.embed_with(t, pooling).unwrap() == *v,
                "{pooling:?} {t:?}"
            );
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4);
        }
    }
    // Per-token vectors, not normalized: as many rows as tokens, the last one equals `Last`
    // before normalization up to scale.
    let rows = engine
        .embed_batch_opts(
            &[texts[0]],
            EmbedOptions {
                pooling: Pooling::None,
                normalize: false,
                ..EmbedOptions::default()
            },
        )
        .unwrap()
        .remove(0);
    let d = engine.info().n_embd;
    let n = engine.tokenize(texts[0]).len();
    assert_eq!(rows.len(), n * d);
    let last = engine.embed_with(texts[0], Pooling::Last).unwrap();
    assert!(cosine(&rows[(n - 1) * d..], &last) > 0.999_999);
    // Similar sentences are closer than unrelated ones.
    let e = engine
        .embed_batch(&[
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The stock market fell sharply today.",
        ])
        .unwrap();
    assert!(cosine(&e[0], &e[1]) > cosine(&e[0], &e[2]));
    let empty = engine.embed_batch(&["fine", ""]);
    assert!(
        matches!(&empty, Err(weft::Error::Config(m)) if m.contains("input 1 has no tokens")),
        "{empty:?}"
    );
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn a_batch_larger_than_the_kv_pool_is_embedded_in_groups() {
    let engine = common::engine("smollm2-135m", 1024);
    let texts: Vec<String> = (0..200)
        .map(|i| format!("Sentence number {i} is about weaving, looms and thread."))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let all = engine.embed_batch(&refs).unwrap();
    assert_eq!(all.len(), 200);
    for i in [0, 57, 199] {
        assert!(engine.embed(&texts[i]).unwrap() == all[i], "text {i}");
    }
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn a_watched_batch_reports_its_progress_and_stops_when_told() {
    // Groups of 4096 tokens at most, counted in whole 32-token pages: 400 texts of one page
    // each go in groups of 128.
    let engine = common::engine("smollm2-135m", 16384);
    let inputs: Vec<Vec<u32>> = (0..400)
        .map(|i| {
            engine.tokenize(&format!(
                "Sentence number {i} is about weaving, looms and thread."
            ))
        })
        .collect();
    let opts = weft::EmbedOptions::default();
    let mut seen = Vec::new();
    let all = engine
        .embed_tokens_watched(&inputs, opts, &mut |done| {
            seen.push(done);
            true
        })
        .expect("embed");
    assert_eq!(all, engine.embed_tokens(&inputs, opts).expect("plain"));
    assert!(inputs.iter().all(|ids| ids.len() <= 32));
    assert_eq!(seen, [0, 128, 256, 384]);
    // Told to stop at the third group: Cancelled, fewer passes run, and no page kept.
    let passes = engine.metrics().passes;
    let mut asked = 0;
    let stopped = engine.embed_tokens_watched(&inputs, opts, &mut |_| {
        asked += 1;
        asked < 3
    });
    assert!(
        matches!(stopped, Err(weft::Error::Cancelled)),
        "{stopped:?}"
    );
    let ran = engine.metrics().passes - passes;
    assert_eq!(ran, 256);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// SmolLM2 on a pool of 16 KV pages (512 tokens), without the prefix cache.
fn sixteen_pages() -> weft::Engine {
    common::engine_with(
        "smollm2-135m",
        weft::EngineConfig {
            n_threads: 2,
            kv_tokens: 512,
            n_ctx: Some(512),
            prefix_cache: false,
            ..weft::EngineConfig::default()
        },
    )
}

#[test]
fn a_batch_waiting_for_kv_pages_asks_its_watcher() {
    // A context holds most of a 16-page pool: a 11-page text waits for it (30 s at most),
    // asking the watcher between tries; told to stop, it stops at once.
    let engine = sixteen_pages();
    let mut holder = engine.context();
    holder
        .fill(&"A long text that holds pages. ".repeat(40))
        .expect("fill");
    weft::block_on(holder.forward().execute()).expect("prefill");
    let text = (0..30)
        .map(|i| format!("Sentence {i} of the text to embed."))
        .collect::<Vec<_>>()
        .join(" ");
    let inputs = vec![engine.tokenize(&text)];
    let started = std::time::Instant::now();
    let mut asked = 0;
    let stopped = engine.embed_tokens_watched(&inputs, weft::EmbedOptions::default(), &mut |_| {
        asked += 1;
        asked < 4
    });
    assert!(
        matches!(stopped, Err(weft::Error::Cancelled)),
        "{stopped:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    drop(holder);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn threads_embedding_on_a_small_cache_take_turns() {
    // Four threads whose texts (11 pages each) do not fit the 16-page pool together: each
    // waits for the pages the others give back (three of four failed with KvCacheFull).
    let engine = sixteen_pages();
    let texts: Vec<String> = (0..4)
        .map(|j| {
            (0..30)
                .map(|i| format!("Sentence {i} of text {j} to embed."))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let alone = engine.embed_batch(&refs).expect("alone");
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| engine.embed_batch(&refs)))
            .collect();
        for r in runs {
            assert_eq!(r.join().expect("thread").expect("embed"), alone);
        }
    });
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn a_gguf_s_pooling_type_is_its_default_pooling() {
    // An embedding GGUF names its pooling (`<arch>.pooling_type`, llama.cpp's key): SmolLM2
    // rewritten with 3 (last token) pools the last token by default (it was mean-pooled).
    use weft::gguf::{GgufFile, GgufWriter, Value};
    use weft::EmbeddingModel;
    let file = GgufFile::open(common::model_path("smollm2-135m")).expect("open");
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.metadata(key, value.clone());
    }
    w.metadata("llama.pooling_type", Value::U32(3));
    for t in file.tensors() {
        w.tensor(&t.name, t.dtype, &t.shape, file.tensor_data(t).to_vec());
    }
    let dir = weft_testkit::target_dir().join("tmp");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("smollm2-pooling-last.gguf");
    std::fs::write(&path, w.into_bytes()).expect("write");
    let last = Engine::open(&path, weft::EngineConfig::default()).expect("load");
    assert_eq!(last.default_pooling(), Pooling::Last);
    let text = "A man is eating food.";
    let opts = EmbedOptions {
        pooling: last.default_pooling(),
        ..EmbedOptions::default()
    };
    let got = last.embed_texts(&[text], opts).expect("embed");
    assert_eq!(got[0], last.embed_with(text, Pooling::Last).expect("last"));
    // Without the key: mean.
    assert_eq!(engine("smollm2-135m").default_pooling(), Pooling::Mean);
    std::fs::remove_file(&path).ok();
}
