//! The programmable API on the real models: scheduler batching, masks, probes, seeds, errors,
//! and that every page goes back to the pool.

use crate::common;

use futures_util::future::join_all;
use weft::{
    block_on, Brle, Distribution, Engine, EngineConfig, Entropy, Error, Logits, Logprobs, Sampler,
};

/// One engine per test, so page accounting is per test.
fn engine(name: &str, config: EngineConfig) -> Engine {
    common::engine_with(name, config)
}

fn small() -> EngineConfig {
    EngineConfig {
        n_threads: 2,
        kv_tokens: 4096,
        ..EngineConfig::default()
    }
}

fn assert_pool_free(engine: &Engine) {
    let m = engine.metrics();
    assert_eq!(m.kv_pages_used, 0, "KV pages leaked: {m:?}");
}

const PROMPTS: [&str; 16] = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, astronauts",
    "Water boils at",
    "The quick brown fox",
    "My favourite recipe for pancakes",
    "The largest planet in the solar system",
    "To be or not to be,",
    "A haiku about autumn:",
    "SELECT name FROM",
    "The mitochondria is",
    "Rust is a programming language that",
    "Dear Sir or Madam,",
    "The first law of thermodynamics",
];

fn greedy_alone(engine: &Engine, prompt: &str, n: usize) -> Vec<u32> {
    let mut ctx = engine.context();
    ctx.fill(prompt).expect("fill");
    block_on(ctx.generate(Sampler::Argmax).max_tokens(n).collect_tokens()).expect("generate")
}

#[test]
fn concurrent_greedy_equals_alone_and_shares_model_calls() {
    for name in ["smollm2-135m", "gemma3-270m"] {
        let engine = engine(name, small());
        let n = 24;
        let alone: Vec<Vec<u32>> = PROMPTS
            .iter()
            .map(|p| greedy_alone(&engine, p, n))
            .collect();
        let before = engine.metrics();
        // 16 generations polled together on one thread: the scheduler batches their passes.
        let mut ctxs: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let mut c = engine.context();
                c.fill(p).expect("fill");
                c
            })
            .collect();
        let together =
            block_on(join_all(ctxs.iter_mut().map(|c| {
                c.generate(Sampler::Argmax).max_tokens(n).collect_tokens()
            })));
        for (i, (t, a)) in together.into_iter().zip(&alone).enumerate() {
            assert_eq!(
                &t.expect("generate"),
                a,
                "{name}: prompt {i} differs when batched"
            );
        }
        let after = engine.metrics();
        let steps = after.steps - before.steps;
        let passes = after.passes - before.passes;
        let mean = passes as f64 / steps as f64;
        println!("{name}: {passes} passes in {steps} model calls, mean batch {mean:.1}");
        assert!(
            mean > 8.0,
            "{name}: passes were not batched (mean {mean:.2})"
        );
        // 16 threads, each blocking on its own generation: batched as well.
        let before = engine.metrics();
        let threads = std::thread::scope(|s| {
            let handles: Vec<_> = PROMPTS
                .iter()
                .map(|p| s.spawn(|| greedy_alone(&engine, p, n)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect::<Vec<_>>()
        });
        assert_eq!(threads, alone, "{name}: threaded generations differ");
        let after = engine.metrics();
        let mean = (after.passes - before.passes) as f64 / (after.steps - before.steps) as f64;
        println!("{name}: threads: mean batch {mean:.1}");
        assert!(
            mean > 4.0,
            "{name}: threaded passes were not batched (mean {mean:.2})"
        );
        drop(ctxs);
        assert_pool_free(&engine);
    }
}

/// Logits after the last token of `text` in a fresh context.
fn last_logits(engine: &Engine, ids: &[u32]) -> Vec<f32> {
    let mut ctx = engine.context();
    block_on(ctx.prefill(ids)).expect("prefill")
}

#[test]
fn attention_mask_isolates_two_documents_in_one_pass() {
    let engine = engine("smollm2-135m", small());
    let tok = engine.tokenizer();
    let a = tok.encode("The cat sat on the mat because it was tired", true, true);
    let b = tok.encode("Interest rates rose again in March", true, true);
    let (ra, rb) = (last_logits(&engine, &a), last_logits(&engine, &b));
    // One context, one pass: document a at positions 0.., then b at positions 0.., each token
    // of b seeing only b.
    let mut ctx = engine.context();
    let mut fwd = ctx.forward();
    let pa: Vec<u32> = (0..a.len() as u32).collect();
    let pb: Vec<u32> = (0..b.len() as u32).collect();
    fwd.input_at(&a, &pa).input_at(&b, &pb);
    let mut masks = Vec::new();
    for i in 0..a.len() {
        masks.push(Brle::from_runs(vec![0, i as u32 + 1]));
    }
    for j in 0..b.len() {
        masks.push(Brle::from_runs(vec![a.len() as u32, j as u32 + 1]));
    }
    fwd.attention_mask(masks);
    let ha = fwd.probe(a.len() - 1, Logits);
    let hb = fwd.probe(a.len() + b.len() - 1, Logits);
    let out = block_on(fwd.execute()).expect("masked pass");
    for (name, got, want) in [("a", out.logits(ha), &ra), ("b", out.logits(hb), &rb)] {
        let got = got.expect("logits");
        let diff = got
            .iter()
            .zip(want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        println!("document {name}: max |Δlogit| vs its own context = {diff:e}");
        // Same keys and values; only the order keys are visited in (pages) differs.
        assert!(
            diff < 1e-3,
            "document {name} is not isolated: max diff {diff}"
        );
        assert_eq!(
            weft::sampling::argmax(got),
            weft::sampling::argmax(want),
            "document {name}"
        );
    }
    drop(ctx);
    assert_pool_free(&engine);
}

#[test]
fn probes_agree_with_log_softmax_and_entropy() {
    let engine = engine("gemma3-270m", small());
    let mut ctx = engine.context();
    ctx.fill("The capital of France is").expect("fill");
    let mut fwd = ctx.forward();
    let last = fwd.len() - 1;
    let ids = vec![0u32, 1, 100, 5000, 262_143];
    let hl = fwd.probe(last, Logits);
    let hp = fwd.probe(last, Logprobs(ids.clone()));
    let he = fwd.probe(last, Entropy);
    let hd = fwd.probe(
        last,
        Distribution {
            temperature: 1.0,
            k: 0,
        },
    );
    let hk = fwd.probe(
        last,
        Distribution {
            temperature: 1.0,
            k: 5,
        },
    );
    let out = block_on(fwd.execute()).expect("pass");
    let logits = out.logits(hl).expect("logits");
    // Reference computation in f64, straight from the definitions.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = out.logprobs(hp).expect("logprobs");
    for (&id, &got) in ids.iter().zip(lp) {
        let want = logits[id as usize] as f64 - lse;
        assert!(
            (got as f64 - want).abs() < 1e-4,
            "logprob of {id}: {got} vs {want}"
        );
    }
    let entropy: f64 = logits
        .iter()
        .map(|&l| {
            let lp = l as f64 - lse;
            -lp.exp() * lp
        })
        .sum();
    let got = out.entropy(he).expect("entropy") as f64;
    assert!((got - entropy).abs() < 1e-3, "entropy {got} vs {entropy}");
    let (all_ids, probs) = out.distribution(hd).expect("distribution");
    assert_eq!(all_ids.len(), logits.len());
    let total: f64 = probs.iter().map(|&p| p as f64).sum();
    assert!((total - 1.0).abs() < 1e-3, "probabilities sum to {total}");
    let (top, top_p) = out.distribution(hk).expect("top-5");
    assert_eq!(top, &all_ids[..5]);
    for (&id, &p) in top.iter().zip(top_p) {
        let want = (logits[id as usize] as f64 - lse).exp();
        assert!((p as f64 - want).abs() < 1e-5, "p({id}) {p} vs {want}");
    }
    assert!(top_p.windows(2).all(|w| w[0] >= w[1]), "not sorted");
    drop(ctx);
    assert_pool_free(&engine);
}

fn sampled(engine: &Engine, seed: u64) -> Vec<u32> {
    let mut ctx = engine.context();
    ctx.set_seed(seed);
    ctx.fill("Once upon a time").expect("fill");
    let sampler = Sampler::TopP {
        p: 0.95,
        temperature: 1.0,
    };
    block_on(ctx.generate(sampler).max_tokens(24).collect_tokens()).expect("generate")
}

#[test]
fn seeded_sampling_is_reproducible_and_independent_of_the_batch() {
    let engine = engine("smollm2-135m", small());
    let first = sampled(&engine, 7);
    assert_eq!(sampled(&engine, 7), first, "same seed, different tokens");
    assert_ne!(
        sampled(&engine, 8),
        first,
        "different seeds gave the same 24 tokens"
    );
    // The same generation while five other contexts generate with other seeds and prompts.
    let together = std::thread::scope(|s| {
        let others: Vec<_> = (0..5)
            .map(|i| {
                let engine = &engine;
                s.spawn(move || {
                    let mut c = engine.context();
                    c.set_seed(100 + i);
                    c.fill(PROMPTS[i as usize]).expect("fill");
                    let g = c
                        .generate(Sampler::Temperature { temperature: 1.0 })
                        .max_tokens(30);
                    block_on(g.collect_tokens()).expect("other")
                })
            })
            .collect();
        let mine = sampled(&engine, 7);
        others.into_iter().for_each(|h| drop(h.join()));
        mine
    });
    assert_eq!(together, first, "batch composition changed a seeded sample");
    assert_pool_free(&engine);
}

#[test]
fn bad_requests_are_typed_errors_and_leak_nothing() {
    let engine = engine(
        "smollm2-135m",
        EngineConfig {
            n_ctx: Some(64),
            ..small()
        },
    );
    let vocab = engine.info().vocab_size as u32;
    let mut ctx = engine.context();
    // A prompt longer than the context.
    ctx.fill(&"word ".repeat(100)).expect("fill");
    let err = block_on(ctx.forward().execute()).expect_err("too long");
    assert!(
        matches!(err, Error::ContextTooLong { n_ctx: 64, .. }),
        "{err}"
    );
    ctx.truncate(0).expect("clear pending");
    // An id past the vocabulary.
    assert!(matches!(
        ctx.fill_tokens(&[vocab]),
        Err(Error::TokenOutOfVocab { .. })
    ));
    let mut fwd = ctx.forward();
    fwd.input(&[1, vocab + 5]);
    let err = block_on(fwd.execute()).expect_err("bad id");
    assert!(matches!(err, Error::TokenOutOfVocab { .. }), "{err}");
    // A position past the context.
    let mut fwd = ctx.forward();
    fwd.input_at(&[1, 2], &[0, 64]);
    let err = block_on(fwd.execute()).expect_err("bad position");
    assert!(
        matches!(err, Error::PositionOutOfRange { pos: 64, .. }),
        "{err}"
    );
    // The largest position, then tokens after it: refused, not an overflow.
    let mut fwd = ctx.forward();
    fwd.input_at(&[1], &[u32::MAX]).input(&[2, 3]);
    let err = block_on(fwd.execute()).expect_err("bad position");
    assert!(matches!(err, Error::PositionOutOfRange { .. }), "{err}");
    // Positions and tokens of different lengths.
    let mut fwd = ctx.forward();
    fwd.input_at(&[1, 2], &[0]);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::PositionCount { .. })
    ));
    // A sampler index past the inputs.
    let mut fwd = ctx.forward();
    fwd.input(&[1, 2]);
    fwd.sample(&[2], Sampler::Argmax);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::IndexOutOfRange { index: 2, .. })
    ));
    // Malformed masks: wrong logit-mask length, wrong attention-mask length and count.
    let mut fwd = ctx.forward();
    fwd.input(&[1, 2]).mask(Brle::all(10, true));
    assert!(
        matches!(block_on(fwd.execute()), Err(Error::MaskLength { expected, .. }) if expected == vocab as usize)
    );
    let mut fwd = ctx.forward();
    fwd.input(&[1, 2])
        .attention_mask(vec![Brle::all(1, true), Brle::all(3, true)]);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::MaskLength {
            expected: 2,
            got: 3,
            ..
        })
    ));
    let mut fwd = ctx.forward();
    fwd.input(&[1, 2]).attention_mask(vec![Brle::all(1, true)]);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::MaskLength { .. })
    ));
    // A bad sampler and a logit mask that allows nothing.
    let mut fwd = ctx.forward();
    fwd.input(&[1]);
    fwd.sample(
        &[0],
        Sampler::TopP {
            p: 1.5,
            temperature: 1.0,
        },
    );
    assert!(matches!(block_on(fwd.execute()), Err(Error::Sampler(_))));
    let mut fwd = ctx.forward();
    fwd.input(&[1]).mask(Brle::all(vocab as usize, false));
    fwd.sample(&[0], Sampler::Argmax);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::NothingAllowed)
    ));
    assert_eq!(
        ctx.len(),
        0,
        "a failed pass must leave the context as it was"
    );
    // Nothing ran: an empty pass is an error too. After all that the context still works.
    assert!(matches!(
        block_on(ctx.forward().execute()),
        Err(Error::EmptyPass)
    ));
    ctx.fill("Hello").expect("fill");
    let logits = block_on(ctx.flush_logits()).expect("still usable");
    assert_eq!(logits.len(), vocab as usize);
    assert!(matches!(
        ctx.truncate(99),
        Err(Error::TruncateTooLong { .. })
    ));
    drop(ctx);
    assert_pool_free(&engine);
}

#[test]
fn manual_stepping_fork_truncate_and_text_stream() {
    let engine = engine("smollm2-135m", small());
    let mut ctx = engine.context();
    ctx.fill("The capital of France is").expect("fill");
    let prompt_len = ctx.pending().len();
    let auto = {
        let mut fork = ctx.fork().expect("fork");
        block_on(
            fork.generate(Sampler::Argmax)
                .max_tokens(8)
                .collect_tokens(),
        )
        .expect("auto")
    };
    // A step probe past the step's positions names them from the sampled one.
    {
        let mut fork = ctx.fork().expect("fork");
        let mut g = fork.generate(Sampler::Argmax).max_tokens(8);
        let mut step = g.next().expect("next").expect("a step");
        step.probe(1, Entropy);
        let refused = block_on(step.execute());
        assert!(
            matches!(&refused, Err(Error::Config(m)) if m.contains("index 1") && m.contains("1 position")),
            "{refused:?}"
        );
    }
    // Tokens accepted by hand must fit in the context: more are refused, none taken.
    {
        let mut fork = ctx.fork().expect("fork");
        let mut g = fork.generate(Sampler::Argmax).max_tokens(usize::MAX);
        let refused = g.accept(&vec![5; engine.n_ctx() + 1]);
        assert!(
            matches!(refused, Err(Error::ContextTooLong { .. })),
            "{refused:?}"
        );
        assert_eq!(g.tokens_generated(), 0);
        g.accept(&[5, 5]).expect("room for two");
        assert_eq!(g.tokens_generated(), 2);
    }
    // Manual stepping: pick the argmax of the Logits probe ourselves.
    let mut g = ctx.generate(Sampler::Argmax).max_tokens(8);
    let ent = g.probe_each_step(0, Entropy);
    let mut manual = Vec::new();
    while let Some(mut step) = g.next().expect("next") {
        step.clear_sampler();
        let h = step.probe(0, Logits);
        let out = block_on(step.execute()).expect("step");
        assert!(out.token.is_none());
        assert!(out.entropy(ent).expect("entropy") >= 0.0);
        let t = weft::sampling::argmax(out.logits(h).expect("logits"));
        manual.push(t);
        g.accept(&[t]).expect("an id of the vocabulary");
    }
    assert_eq!(g.tokens_generated(), 8);
    // An id past the vocabulary is refused and taken by nothing.
    let vocab = g.context().engine().info().vocab_size as u32;
    let refused = g.accept(&[vocab + 1]);
    assert!(
        matches!(refused, Err(Error::TokenOutOfVocab { .. })),
        "{refused:?}"
    );
    assert_eq!(g.tokens_generated(), 8);
    drop(g);
    assert_eq!(
        manual, auto,
        "manual stepping must equal the automatic loop"
    );
    // A fork taken mid-generation holds every token accepted so far, the one not run yet
    // included: greedy from there gives the rest of the same output.
    {
        let mut fork_src = ctx.fork().expect("fork");
        fork_src.truncate(prompt_len).expect("truncate");
        let mut g = fork_src.generate(Sampler::Argmax).max_tokens(8);
        for _ in 0..3 {
            let step = g.next().expect("next").expect("a step");
            block_on(step.execute()).expect("step");
        }
        let mut branch = g.fork_context().expect("fork_context");
        assert_eq!(branch.len() + branch.pending().len(), prompt_len + 3);
        let rest = block_on(
            branch
                .generate(Sampler::Argmax)
                .max_tokens(5)
                .collect_tokens(),
        )
        .expect("branch");
        assert_eq!(rest, auto[3..], "the branch's greedy continuation");
    }
    // The context holds prompt + 8 tokens (the last one pending).
    assert_eq!(ctx.len() + ctx.pending().len(), prompt_len + 8);
    // Fork shares pages: a fork costs at most one page per KV group.
    let used = engine.metrics().kv_pages_used;
    let f = ctx.fork().expect("fork");
    assert!(engine.metrics().kv_pages_used <= used + 1);
    drop(f);
    // Rewind to the prompt and regenerate: the same tokens.
    ctx.truncate(prompt_len).expect("truncate");
    let again =
        block_on(ctx.generate(Sampler::Argmax).max_tokens(8).collect_tokens()).expect("again");
    assert_eq!(again, auto);
    // The text stream concatenates to collect_text, and stop strings cut the text.
    ctx.truncate(prompt_len).expect("truncate");
    let mut fork = ctx.fork().expect("fork");
    let text =
        block_on(fork.generate(Sampler::Argmax).max_tokens(12).collect_text()).expect("text");
    let mut g = ctx.generate(Sampler::Argmax).max_tokens(12);
    let mut streamed = String::new();
    while let Some(delta) = block_on(g.next_text()).expect("stream") {
        streamed.push_str(&delta);
    }
    assert_eq!(streamed, text);
    drop(g);
    let word: String = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_string();
    ctx.truncate(prompt_len).expect("truncate");
    let cut = block_on(
        ctx.generate(Sampler::Argmax)
            .max_tokens(12)
            .stop_string(&word)
            .collect_text(),
    )
    .expect("stop string");
    assert_eq!(
        cut,
        text[..text.find(&word).expect("word")],
        "stop string cut"
    );
    drop((ctx, fork));
    assert_pool_free(&engine);
}

#[test]
fn a_prompt_failing_in_a_later_chunk_leaves_nothing_behind() {
    // Two pages of 32 tokens in all, 16-token steps: a 60-token prompt beside a context
    // holding one page runs out of pages in its third chunk.
    let engine = engine(
        "smollm2-135m",
        EngineConfig {
            kv_tokens: 64,
            step_tokens: 16,
            ..small()
        },
    );
    let mut a = engine.context();
    block_on(a.prefill(&[1; 20])).expect("a");
    let mut b = engine.context();
    let words = engine.tokenize(&"one two three four five six seven eight nine ten ".repeat(6));
    let err = block_on(b.prefill(&words[..60])).expect_err("no pages left");
    assert!(matches!(err, Error::Core(_)), "{err}");
    assert_eq!(b.len(), 0);
    assert_eq!(
        engine.metrics().kv_pages_used,
        1,
        "the failed prompt kept pages"
    );
    // The failed tokens are back in the pending buffer (nothing is lost); clear them.
    assert_eq!(b.pending().len(), 60);
    b.truncate(0).expect("clear");
    // The context works afterwards and gives the logits a fresh context gives.
    let got = block_on(b.prefill(&words[..20])).expect("retry");
    drop(a);
    let want = last_logits(&engine, &words[..20]);
    assert_eq!(got, want);
    drop(b);
    assert_pool_free(&engine);
}

#[test]
fn a_dropped_execute_future_settles_before_the_next_pass() {
    use futures_util::FutureExt;
    let engine = engine("smollm2-135m", small());
    let ids = engine.tokenize("The quick brown fox jumps over the lazy dog");
    let want = last_logits(&engine, &ids);
    let mut ctx = engine.context();
    ctx.fill_tokens(&ids[..5]).expect("fill");
    let mut fwd = ctx.forward();
    fwd.input(&ids[5..8]);
    // Submitted, then abandoned.
    drop(fwd.execute().now_or_never());
    let got = block_on(ctx.prefill(&ids[8..])).expect("next pass");
    assert_eq!(ctx.len(), ids.len());
    assert_eq!(got, want);
    drop(ctx);
    assert_pool_free(&engine);
}

/// Makes `fwd` fail once the model has run it: its logit mask allows only id 7, which a -inf
/// bias then bans, so the sampler of its last token finds nothing (`NothingAllowed`).
fn fail_after_running(fwd: &mut weft::Forward<'_>, vocab: usize) {
    let last = fwd.len() - 1;
    fwd.mask(weft::Brle::only(vocab, &[7]))
        .logit_bias(&[(7, f32::NEG_INFINITY)]);
    let _ = fwd.sample(&[last], Sampler::Argmax);
}

/// A dropped `execute` whose pass then fails in the scheduler (its mask allows only a banned
/// id): the context gives its pending tokens back, as an awaited failure does, and the next
/// pass runs them (they were lost, and the next token ran at position 0).
#[test]
fn a_dropped_execute_future_whose_pass_fails_keeps_the_pending_tokens() {
    use futures_util::FutureExt;
    let engine = engine("smollm2-135m", small());
    let ids = engine.tokenize("Alice went to the market to buy apples, pears and plums.");
    let want = last_logits(&engine, &ids);
    let mut ctx = engine.context();
    ctx.fill_tokens(&ids[..ids.len() - 1]).expect("fill");
    let vocab = engine.info().vocab_size;
    let mut fwd = ctx.forward();
    fail_after_running(&mut fwd, vocab);
    drop(fwd.execute().now_or_never());
    // A fork taken before the context settles gets the pending tokens back too.
    let mut fork = ctx.fork().expect("fork");
    assert_eq!((fork.len(), fork.pending()), (0, &ids[..ids.len() - 1]));
    let got = block_on(ctx.prefill(&ids[ids.len() - 1..])).expect("next pass");
    assert_eq!(ctx.tokens(), &ids[..]);
    assert_eq!(got, want);
    assert_eq!(
        block_on(fork.prefill(&ids[ids.len() - 1..])).expect("the fork's pass"),
        want
    );
    drop((ctx, fork));
    assert_pool_free(&engine);
}

/// A long pass on Gemma 3 runs in chunks, and after each its sliding-window layers give back
/// pages two windows behind: when the pass then fails (here: a logit mask that allows no
/// token), the cache cannot go back to where the pass began. The context keeps what the cache
/// holds (it forgot the pass while the cache kept it, and every later pass failed), and goes
/// on from there.
#[test]
fn a_chunked_pass_that_fails_on_a_sliding_window_model_leaves_context_and_cache_agreeing() {
    let engine = engine("gemma3-270m", small());
    let text = "The loom's shuttle carries the weft across the warp. ".repeat(120);
    let ids = engine.tokenize(&text);
    assert!(ids.len() > 1300, "{}", ids.len());
    // 100 tokens run, 1,200 more filled: a pass of three chunks.
    let started = || {
        let mut ctx = engine.context();
        ctx.fill_tokens(&ids[..100]).expect("fill");
        block_on(ctx.flush_logits()).expect("the first 100 tokens");
        ctx.fill_tokens(&ids[100..1300]).expect("fill");
        ctx
    };
    let vocab = engine.info().vocab_size;
    let mut ctx = started();
    let mut fwd = ctx.forward();
    fail_after_running(&mut fwd, vocab);
    let e = block_on(fwd.execute()).unwrap_err();
    assert!(matches!(e, weft::Error::NothingAllowed), "{e}");
    assert_eq!((ctx.len(), ctx.pending().len()), (1300, 0));
    assert_eq!(ctx.tokens(), &ids[..1300]);
    ctx.fill_tokens(&ids[1300..1301]).expect("fill");
    let want = {
        let mut fresh = engine.context();
        fresh.fill_tokens(&ids[..1301]).expect("fill");
        block_on(fresh.flush_logits()).expect("the reference")
    };
    let got = block_on(ctx.flush_logits()).expect("the next pass runs");
    assert_eq!(got, want);
    drop(ctx);

    // The same with the pass's future dropped: the next operation (or a fork before it)
    // finds the context as the cache holds it.
    use futures_util::FutureExt;
    let mut ctx = started();
    let mut fwd = ctx.forward();
    fail_after_running(&mut fwd, vocab);
    drop(fwd.execute().now_or_never());
    let mut fork = ctx.fork().expect("fork");
    ctx.fill_tokens(&ids[1300..1301]).expect("fill");
    fork.fill_tokens(&ids[1300..1301]).expect("fill");
    assert_eq!((ctx.len(), ctx.pending().len()), (1300, 1));
    assert_eq!(block_on(ctx.flush_logits()).expect("the next pass"), want);
    assert_eq!(
        block_on(fork.flush_logits()).expect("the fork's pass"),
        want
    );
    drop((ctx, fork));
    assert_pool_free(&engine);
}

/// Gemma 3's sliding-window layers give back pages two windows behind the highest position. A
/// token placed back among tokens whose keys went that way is an error (it saw them as
/// nothing, silently), and the context stays as it was.
#[test]
fn a_token_placed_behind_released_window_pages_is_an_error() {
    let engine = engine("gemma3-270m", small());
    let text = "The loom's shuttle carries the weft across the warp. ".repeat(60);
    let ids = engine.tokenize(&text);
    let mut ctx = engine.context();
    ctx.fill_tokens(&ids[..700]).expect("fill");
    block_on(ctx.flush_logits()).expect("prefill");
    let mut fwd = ctx.forward();
    fwd.input_at(&ids[700..701], &[4000]);
    block_on(fwd.execute()).expect("a token far ahead");
    let (len, pages) = (ctx.len(), engine.metrics().kv_pages_used);
    let mut fwd = ctx.forward();
    fwd.input_at(&ids[701..702], &[700]);
    let e = block_on(fwd.execute()).unwrap_err();
    assert!(
        e.to_string()
            .contains("sliding-window layers have already released keys"),
        "{e}"
    );
    assert_eq!((ctx.len(), engine.metrics().kv_pages_used), (len, pages));
    drop(ctx);
    assert_pool_free(&engine);
}

/// A pass whose positions go back (a token placed at an earlier position after others): what
/// a token sees does not depend on where the scheduler cuts the pass (512 tokens a step here).
/// Token 100 sees the token put at position 100 at the pass's end, in a pass of 300 tokens as
/// in one of 600.
#[test]
fn a_pass_with_positions_going_back_does_not_depend_on_its_cuts() {
    let engine = engine("smollm2-135m", small());
    let text = "The loom's shuttle carries the weft across the warp. ".repeat(60);
    let ids = engine.tokenize(&text);
    let x = engine.tokenize(" Dragons")[0];
    let at_100 = |n: usize| {
        let mut ctx = engine.context();
        let mut fwd = ctx.forward();
        fwd.input(&ids[..n]).input_at(&[x], &[100]);
        let h = fwd.probe(100, Logits);
        block_on(fwd.execute())
            .expect("pass")
            .logits(h)
            .expect("logits")
            .to_vec()
    };
    let (short, long) = (at_100(300), at_100(600));
    assert!(short == long, "the token at 100 saw different slots");
    assert!(
        short != last_logits(&engine, &ids[..101]),
        "it did not see the late token"
    );
    assert_pool_free(&engine);
}

/// Per-index logit masks: each sampled position chooses within its own set (the masked
/// argmax of the position's logits), and masks of the wrong count or length are refused.
#[test]
fn samplers_take_one_logit_mask_per_index() {
    let engine = engine("smollm2-135m", small());
    let vocab = engine.info().vocab_size;
    let mut ctx = engine.context();
    ctx.fill("One, two, three,").expect("fill");
    let draft = engine.tokenize(" four, five");
    let mut fwd = ctx.forward();
    fwd.input(&draft);
    let n = fwd.len();
    let indices: Vec<usize> = (n - 3..n).collect();
    let probes: Vec<_> = indices.iter().map(|&i| fwd.probe(i, Logits)).collect();
    // Each set: two arbitrary tokens (unlikely to hold the unmasked argmax); the pick must be
    // the one of the two with the higher logit.
    let sets: Vec<[u32; 2]> = vec![[11, 2000], [30, 700], [4000, 12]];
    let masks = sets
        .iter()
        .map(|set| {
            let mut m = weft::TokenMask::none(vocab);
            set.iter().for_each(|&t| m.allow(t));
            m
        })
        .collect();
    let h = fwd.sample_with_masks(&indices, Sampler::Argmax, masks);
    let out = block_on(fwd.execute()).expect("pass");
    let got = out.tokens(h).expect("sampled").to_vec();
    for ((set, p), t) in sets.iter().zip(&probes).zip(&got) {
        let logits = out.logits(*p).expect("logits");
        let best = *set
            .iter()
            .max_by(|&&a, &&b| logits[a as usize].total_cmp(&logits[b as usize]))
            .expect("a set");
        assert_eq!(*t, best, "the masked argmax of {set:?}");
    }
    ctx.truncate(0).expect("truncate");
    ctx.fill("Hello").expect("fill");
    let mut fwd = ctx.forward();
    fwd.sample_with_masks(&[0], Sampler::Argmax, Vec::new());
    let err = block_on(fwd.execute()).expect_err("no mask for the index");
    assert!(
        matches!(
            err,
            Error::MaskLength {
                expected: 1,
                got: 0,
                ..
            }
        ),
        "{err}"
    );
    let mut fwd = ctx.forward();
    fwd.sample_with_masks(&[0], Sampler::Argmax, vec![weft::TokenMask::all(5)]);
    let err = block_on(fwd.execute()).expect_err("a short mask");
    assert!(matches!(err, Error::MaskLength { got: 5, .. }), "{err}");
    drop(ctx);
    assert_pool_free(&engine);
}
