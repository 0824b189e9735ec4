//! Sentences per second of `embed_batch` over 1,000 sentences of 5 to 60 words (a fixed
//! pseudo-random mix, the same every run), as the README reports it.
//!
//! ```text
//! cargo run --release --example embed_throughput -- [MODEL] [THREADS]
//! ```
//! MODEL is a known name or a path (default `all-minilm-l6-v2`); a GGUF decoder runs through
//! `Engine::embed_batch_opts`, an encoder folder through `Embedder::embed_batch_opts`.

use std::time::Instant;

use weft::{EmbedOptions, EngineConfig, Hub, NoProgress};

const WORDS: &[&str] = &[
    "the", "a", "model", "reads", "every", "sentence", "and", "writes", "one", "vector", "for",
    "it", "while", "small", "machines", "run", "quickly", "on", "two", "cores", "river", "stone",
    "music", "quietly", "garden", "window", "market", "seven", "yellow", "question", "answer",
    "between", "under", "bright", "winter", "morning", "city", "language", "number", "bread",
];

/// 1,000 sentences of 5 to 60 words from a fixed linear congruential generator.
fn sentences() -> Vec<String> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        ((state >> 33) as usize) % n
    };
    (0..1000)
        .map(|_| {
            let len = 5 + next(56);
            let words: Vec<&str> = (0..len).map(|_| WORDS[next(WORDS.len())]).collect();
            format!("{}.", words.join(" "))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .unwrap_or_else(|| "all-minilm-l6-v2".to_string());
    let threads: usize = args.next().map_or(Ok(2), |t| t.parse())?;
    let path = Hub::from_env()?.resolve(&model, &mut NoProgress)?;
    let texts = sentences();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let config = EngineConfig {
        n_threads: threads,
        ..EngineConfig::default()
    };
    let embedder = weft::open_embedding_model(&path, config)?;
    let tokens: usize = refs.iter().map(|t| embedder.input_ids(t).len()).sum();
    println!("{} sentences, {tokens} tokens", refs.len());
    let opts = EmbedOptions {
        pooling: embedder.default_pooling(),
        ..EmbedOptions::default()
    };
    let run = || embedder.embed_texts(&refs, opts);
    let mut rates = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let v = run()?;
        let secs = start.elapsed().as_secs_f64();
        rates.push(v.len() as f64 / secs);
        println!(
            "{} vectors in {secs:.2} s: {:.1} sentences/s",
            v.len(),
            v.len() as f64 / secs
        );
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "median: {:.1} sentences/s ({model}, {threads} threads)",
        rates[1]
    );
    Ok(())
}
