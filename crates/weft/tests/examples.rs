//! Runs every example in `examples/` on the real model and checks what it claims.

use crate::common;

#[path = "../examples/chat_sessions.rs"]
mod chat_sessions;
#[path = "../examples/multiple_choice.rs"]
mod multiple_choice;
#[path = "../examples/session.rs"]
mod session;
#[path = "../examples/shared_prefix.rs"]
mod shared_prefix;
#[path = "../examples/tree_search.rs"]
mod tree_search;
#[path = "../examples/two_documents.rs"]
mod two_documents;
#[path = "../examples/watermark.rs"]
mod watermark;

use std::sync::OnceLock;

use weft::rollout::{generate_batch, generate_batch_streaming, RolloutRequest};
use weft::{block_on, Engine, Sampler};

/// One engine for the examples (fetched once).
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| common::engine("smollm2-135m", 8192))
}

#[test]
fn multiple_choice_picks_the_right_capital() {
    let answers = [" London", " Paris", " Berlin", " Madrid"];
    let (best, scores) =
        multiple_choice::run(engine(), "The capital of France is", &answers).expect("score");
    println!("{scores:?}");
    assert_eq!(best, 1, "scores {scores:?}");
    assert!(scores.iter().all(|s| s.is_finite() && *s < 0.0));
}

#[test]
fn watermark_is_detectable() {
    let (first, ids) = watermark::run(
        engine(),
        "Write a short story about a lighthouse.",
        48,
        4.0,
        3,
    )
    .expect("watermark");
    assert_eq!(ids.len(), 48, "the example never ends a text early");
    let marked = watermark::green_fraction(first, &ids);
    // The same prompt without the bonus: about half the tokens are green by chance.
    let (first, plain) = watermark::run(
        engine(),
        "Write a short story about a lighthouse.",
        48,
        0.0,
        3,
    )
    .expect("plain");
    assert_eq!(plain.len(), 48);
    let unmarked = watermark::green_fraction(first, &plain);
    println!(
        "green fraction: watermarked {marked:.2} of {}, plain {unmarked:.2} of {}",
        ids.len(),
        plain.len()
    );
    assert!(marked > 0.8, "watermark too weak: {marked}");
    assert!(
        unmarked < 0.75,
        "unwatermarked text looks watermarked: {unmarked}"
    );
}

#[test]
fn two_documents_match_their_own_contexts() {
    let (a, b) = ("The recipe needs two cups of", "The stock market fell by");
    let (la, lb) = two_documents::run(engine(), a, b).expect("masked pass");
    for (text, got) in [(a, la), (b, lb)] {
        let mut ctx = engine().context();
        ctx.fill(text).expect("fill");
        let want = block_on(ctx.flush_logits()).expect("alone");
        let diff = got
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-3, "{text:?}: max diff {diff}");
    }
}

#[test]
fn tree_search_beats_greedy_or_equals_it() {
    let prompt = "The best way to learn a language is";
    let beams = tree_search::run(engine(), prompt, 3, 5).expect("beam search");
    assert_eq!(beams.len(), 3);
    assert!(
        beams.windows(2).all(|w| w[0].1 >= w[1].1),
        "beams not sorted"
    );
    // Score greedy's continuation the same way: beam search never does worse.
    let mut ctx = engine().context();
    ctx.fill(prompt).expect("fill");
    let greedy =
        block_on(ctx.generate(Sampler::Argmax).max_tokens(5).collect_tokens()).expect("greedy");
    let mut q = engine().context();
    q.fill(prompt).expect("fill");
    block_on(q.flush_logits()).expect("prefill");
    let text = engine().detokenize(&greedy).expect("text");
    let greedy_score = multiple_choice::score(&q, &text).expect("score");
    println!("beam {:.3} vs greedy {greedy_score:.3}", beams[0].1);
    assert!(beams[0].1 >= greedy_score - 1e-3);
}

#[test]
fn sixteen_chat_sessions_on_one_engine() {
    let questions: Vec<String> = (1..=16).map(|i| format!("What is {i} times 7?")).collect();
    let before = engine().metrics();
    let replies = chat_sessions::run(engine(), &questions, 24).expect("chat");
    assert_eq!(replies.len(), 16);
    assert!(replies.iter().all(|[a, b]| !a.is_empty() && !b.is_empty()));
    // Each session alone gives the same replies (greedy, batch-invariant engine).
    let alone = chat_sessions::run(engine(), &questions[3..4], 24).expect("alone");
    assert_eq!(alone[0], replies[3]);
    let after = engine().metrics();
    let mean = (after.passes - before.passes) as f64 / (after.steps - before.steps) as f64;
    println!("mean batch {mean:.1}");
    assert!(mean > 2.0, "sessions did not share model calls: {mean}");
}

#[test]
fn batch_rollouts_with_per_request_options() {
    let e = engine();
    let newline = e.tokenize("\n");
    let mut reqs: Vec<RolloutRequest> =
        ["Once upon a time", "List three fruits:", "def add(a, b):"]
            .iter()
            .enumerate()
            .map(|(i, p)| RolloutRequest {
                max_tokens: 16 + 4 * i,
                seed: i as u64,
                ..RolloutRequest::new(
                    *p,
                    Sampler::TopKTopP {
                        k: 40,
                        p: 0.9,
                        temperature: 0.8,
                    },
                )
            })
            .collect();
    reqs[1].stop_sequences.push(newline.clone());
    reqs.push(RolloutRequest::new(
        "The capital of France is",
        Sampler::Argmax,
    ));
    let out = block_on(generate_batch(e, &reqs)).expect("rollouts");
    assert_eq!(out.len(), 4);
    for (r, q) in out.iter().zip(&reqs) {
        assert!(r.tokens.len() <= q.max_tokens);
        let weft::rollout::Prompt::Text(text) = &q.prompt else {
            panic!("text prompts")
        };
        assert_eq!(
            r.prompt_tokens,
            e.context().engine().tokenizer().encode(text, true, true)
        );
    }
    if out[1].tokens.len() < reqs[1].max_tokens {
        assert!(out[1].tokens.ends_with(&newline) || out[1].stop.is_some());
    }
    // Same seeds, same rollouts; the greedy one equals a plain generation.
    let again = block_on(generate_batch(e, &reqs)).expect("again");
    assert_eq!(again, out);
    let mut ctx = e.context();
    ctx.fill("The capital of France is").expect("fill");
    let greedy = block_on(
        ctx.generate(Sampler::Argmax)
            .max_tokens(128)
            .collect_tokens(),
    )
    .expect("greedy");
    assert_eq!(out[3].tokens, greedy);
    // Streaming: partial results every 4 tokens, each a prefix of the final result.
    let mut partials = Vec::new();
    let last = block_on(generate_batch_streaming(e, &reqs[..3], 4, |p| {
        partials.push(p.to_vec())
    }))
    .expect("streaming");
    assert_eq!(last, out[..3]);
    assert!(!partials.is_empty());
    for p in &partials {
        for (part, full) in p.iter().zip(&last) {
            assert!(full.tokens.starts_with(&part.tokens));
            assert!(part.stop.is_none());
        }
    }
}

#[test]
fn shared_prefix_is_prefilled_once() {
    // A fresh engine: the cache must start empty for the first request to miss.
    let engine = common::engine("smollm2-135m", 8192);
    let system = shared_prefix::system_prompt(&engine, 1500);
    let questions = shared_prefix::questions();
    let requests = shared_prefix::run(&engine, &system, &questions, 8).expect("requests");
    let first = &requests[0];
    assert!(first.prompt_tokens >= 1500, "{first:?}");
    assert_eq!(first.cached_tokens, 0);
    assert!(first.prefilled as usize >= first.prompt_tokens - 1);
    for (i, r) in requests.iter().enumerate().skip(1) {
        // Everything up to the last whole page of the system prompt comes from the cache; the
        // request prefills its question, the chat markers and the partial page before them.
        assert!(r.cached_tokens >= 1440, "request {}: {r:?}", i + 1);
        assert!(
            (r.prefilled as usize) < 80,
            "request {} prefilled {} tokens",
            i + 1,
            r.prefilled
        );
    }
    // The same replies as without the cache (the first request ran without any: compare two
    // that used it).
    let cold = common::engine_with(
        "smollm2-135m",
        weft::EngineConfig {
            n_threads: 2,
            prefix_cache: false,
            ..weft::EngineConfig::default()
        },
    );
    let uncached = shared_prefix::run(&cold, &system, &questions[1..3], 8).expect("uncached");
    for (a, b) in requests[1..].iter().zip(&uncached) {
        assert_eq!(a.reply, b.reply);
    }
}

#[test]
fn session_resumes_on_a_new_engine() {
    let path = std::env::temp_dir().join(format!("weft-session-{}.bin", std::process::id()));
    let load = || Ok(common::engine("smollm2-135m", 4096));
    let (whole, resumed) =
        session::run(load, "Explain how a loom works.", 16, 48, &path).expect("session");
    let _ = std::fs::remove_file(&path);
    assert!(!whole.is_empty());
    assert_eq!(whole, resumed);
}
