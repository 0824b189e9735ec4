//! The automatic prefix cache on the real models: outputs are bit-identical with and without
//! it (a finished context's pages reused, and a live context's pages shared); cached pages
//! count as free and are evicted when the pool needs them; passes under a custom attention
//! mask are never shared.

use crate::common;

use weft::{block_on, Brle, Engine, EngineConfig, Sampler};

const PROMPT: &str = "The loom is one of the oldest machines people have built. A weaver \
stretches the warp threads tight on a frame and passes the weft thread over and under them, \
row after row, beating each row down with a comb so that the cloth grows dense and even. \
Patterns come from which warp threads are lifted for each pass of the shuttle.";

fn engine(model: &str, kv_tokens: usize, prefix_cache: bool) -> Engine {
    common::engine_with(
        model,
        EngineConfig {
            n_threads: 2,
            kv_tokens,
            prefix_cache,
            ..EngineConfig::default()
        },
    )
}

/// The logits after `prompt` and the next 12 greedy tokens.
fn run(engine: &Engine, prompt: &str) -> (Vec<f32>, Vec<u32>) {
    let mut ctx = engine.context();
    ctx.fill(prompt).expect("fill");
    finish(ctx)
}

/// [`run`] from token ids.
fn run_ids(engine: &Engine, ids: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let mut ctx = engine.context();
    ctx.fill_tokens(ids).expect("fill");
    finish(ctx)
}

fn finish(mut ctx: weft::Context) -> (Vec<f32>, Vec<u32>) {
    let logits = block_on(ctx.flush_logits()).expect("prefill");
    let gen = ctx.generate(Sampler::Argmax).max_tokens(12).ignore_eos();
    let tokens = block_on(gen.collect_tokens()).expect("generate");
    (logits, tokens)
}

fn bit_identical_on(model: &str) {
    let on = engine(model, 4096, true);
    let off = engine(model, 4096, false);
    assert!(on.tokenize(PROMPT).len() > 2 * weft::kv::PAGE_SIZE);
    let longer = format!("{PROMPT} Looms were among the first machines run by punched cards.");
    for prompt in [PROMPT, PROMPT, longer.as_str()] {
        let (a, ta) = run(&on, prompt);
        let (b, tb) = run(&off, prompt);
        assert!(a == b, "{model}: logits differ with the prefix cache");
        assert_eq!(
            ta, tb,
            "{model}: greedy tokens differ with the prefix cache"
        );
    }
    let m = on.metrics();
    assert!(
        m.prefix_hit_tokens >= 2 * 2 * weft::kv::PAGE_SIZE as u64,
        "{model}: the second and third prompts reuse the first's pages: {m:?}"
    );
    assert_eq!(off.metrics().prefix_hit_tokens, 0);
    // A live context's pages are shared too, and both contexts go on as if alone.
    let mut first = on.context();
    first.fill(PROMPT).expect("fill");
    let la = block_on(first.flush_logits()).expect("prefill");
    let hits = on.metrics().prefix_hit_tokens;
    let (lb, tb) = run(&on, PROMPT);
    assert!(on.metrics().prefix_hit_tokens > hits);
    let ta = block_on(
        first
            .generate(Sampler::Argmax)
            .max_tokens(12)
            .ignore_eos()
            .collect_tokens(),
    )
    .expect("generate");
    let (lr, tr) = run(&off, PROMPT);
    assert!(
        la == lr && lb == lr,
        "{model}: shared live pages changed the logits"
    );
    assert_eq!((ta, tb), (tr.clone(), tr));
    drop(first);
    // Cached pages of finished contexts count as free.
    assert_eq!(on.metrics().kv_pages_used, 0);
    assert_eq!(off.metrics().kv_pages_used, 0);
}

#[test]
fn outputs_are_bit_identical_with_and_without_the_cache_smollm2() {
    bit_identical_on("smollm2-135m");
}

#[test]
fn outputs_are_bit_identical_with_and_without_the_cache_gemma3() {
    bit_identical_on("gemma3-270m");
}

#[test]
fn cached_pages_are_evicted_when_the_pool_needs_them() {
    // 8 pages: each prompt below takes 3 to 4, so the cache must give pages back.
    let on = engine("smollm2-135m", 256, true);
    let off = engine("smollm2-135m", 256, false);
    for i in 0..6 {
        let prompt = format!("Story number {i}. {PROMPT}");
        let (a, ta) = run(&on, &prompt);
        let (b, tb) = run(&off, &prompt);
        assert!(a == b && ta == tb, "prompt {i} differs");
    }
    let m = on.metrics();
    assert!(m.prefix_evictions > 0, "{m:?}");
    assert_eq!(m.kv_pages_used, 0);
    assert_eq!(m.kv_pages_free, 8);
}

#[test]
fn masked_passes_are_never_shared() {
    let on = engine("smollm2-135m", 4096, true);
    let ids = on.tokenize(PROMPT);
    let n = ids.len();
    {
        // The causal mask written out: the pages are the same, but were written under a mask.
        let mut ctx = on.context();
        ctx.fill_tokens(&ids).expect("fill");
        let masks = (0..n).map(|i| Brle::all(i + 1, true)).collect();
        let mut fwd = ctx.forward();
        fwd.attention_mask(masks);
        block_on(fwd.execute()).expect("masked pass");
    }
    let (_, _) = run_ids(&on, &ids);
    assert_eq!(
        on.metrics().prefix_hit_tokens,
        0,
        "masked pages were shared"
    );
    // The plain run published its pages: the next one hits.
    let (_, _) = run_ids(&on, &ids);
    assert!(on.metrics().prefix_hit_tokens > 0);
}

#[test]
fn a_prefix_across_gemmas_sliding_window_is_bit_identical() {
    // Over 700 tokens: past Gemma 3's 512-token sliding window, prefilled in two chunks.
    let long = [PROMPT; 14].join(" ");
    let on = engine("gemma3-270m", 4096, true);
    let off = engine("gemma3-270m", 4096, false);
    assert!(on.tokenize(&long).len() > 700);
    let question = format!("{long} What is the weft?");
    for prompt in [long.as_str(), question.as_str()] {
        let (a, ta) = run(&on, prompt);
        let (b, tb) = run(&off, prompt);
        assert!(
            a == b && ta == tb,
            "logits or tokens differ across the window"
        );
    }
    assert!(on.metrics().prefix_hit_tokens >= 640, "{:?}", on.metrics());
    assert_eq!(on.metrics().kv_pages_used, 0);
}

#[test]
fn a_batch_of_one_prompt_computes_its_pages_once() {
    // Eight rollouts of one prompt, queued together behind a 1536-token prefill (three full
    // steps of 512 tokens): the first computes the prompt's whole pages, the other seven sit
    // out that step and attach them (all eight computed them: each looked in the cache as
    // the step began, before any had run). The rollouts are those of an engine without the
    // cache.
    use weft::rollout::{generate_batch, RolloutRequest};
    let prompt = [PROMPT; 3].join(" ");
    let on = engine("smollm2-135m", 8192, true);
    let off = engine("smollm2-135m", 8192, false);
    let n = on.tokenize(&prompt).len();
    let pages = (n - 1) / weft::kv::PAGE_SIZE * weft::kv::PAGE_SIZE;
    assert!(
        pages >= 4 * weft::kv::PAGE_SIZE && 2 * n <= 512,
        "{n} tokens"
    );
    let requests: Vec<RolloutRequest> = (0..8)
        .map(|i| {
            let sampler = Sampler::TopK {
                k: 40,
                temperature: 0.9,
            };
            let mut r = RolloutRequest::new(prompt.as_str(), sampler);
            r.max_tokens = 16;
            r.seed = 100 + i;
            r
        })
        .collect();
    let mut blocker = on.context();
    blocker.fill_tokens(&[1000; 1536]).expect("fill");
    let (blocked, got) = block_on(futures_util::future::join(
        blocker.forward().execute(),
        generate_batch(&on, &requests),
    ));
    blocked.expect("the blocker's prefill");
    let want = block_on(generate_batch(&off, &requests)).expect("batch");
    for (g, w) in got.expect("batch").iter().zip(&want) {
        assert_eq!(g.tokens, w.tokens);
    }
    let m = on.metrics();
    assert_eq!(m.prefix_hit_tokens, 7 * pages as u64, "{m:?}");
    drop(blocker);
    assert_eq!(on.metrics().kv_pages_used, 0);
}
