//! Speculative decoding in the generator: greedy output unchanged on llama.cpp's reference
//! cases, sampled output keeps the target distribution, and the options are checked.

use crate::common;

use futures_util::future::join_all;
use weft::{block_on, Distribution, Engine, Error, NgramSpeculator, Sampler};

fn engine(name: &str) -> Engine {
    common::engine(name, 16384)
}

fn reference() -> serde_json::Value {
    let dir = common::reference_dir();
    let text = std::fs::read_to_string(dir.join("greedy.json"))
        .unwrap_or_else(|e| panic!("greedy.json not found in {}: {e}", dir.display()));
    serde_json::from_str(&text).expect("greedy.json")
}

#[test]
fn greedy_with_the_ngram_drafter_equals_greedy_without_it() {
    let refs = reference();
    for (name, key) in [("smollm2-135m", "smollm2"), ("gemma3-270m", "gemma3")] {
        let engine = engine(name);
        let (mut drafted, mut kept) = (0, 0);
        for case in refs["cases"].as_array().expect("cases") {
            if case["model"] != key {
                continue;
            }
            let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).expect("ids");
            let n = case["greedy_ids"].as_array().map_or(32, Vec::len);
            let run = |speculate: bool| {
                let mut ctx = engine.context();
                ctx.fill_tokens(&ids).expect("fill");
                let g = ctx.generate(Sampler::Argmax).max_tokens(n);
                let mut g = if speculate { g.system_speculation() } else { g };
                let mut out = Vec::new();
                while let Some(step) = g.next().expect("next") {
                    out.extend(block_on(step.execute()).expect("step").accepted);
                }
                assert_eq!(out, g.tokens());
                (out, g.speculation_stats())
            };
            let (plain, _) = run(false);
            let (fast, (d, k)) = run(true);
            drafted += d;
            kept += k;
            assert_eq!(
                fast, plain,
                "{name} {:?}: speculation changed greedy output",
                case["prompt"]
            );
        }
        println!("{name}: drafted {drafted}, accepted {kept}");
        assert!(drafted > 0, "{name}: the drafter never proposed anything");
        assert_eq!(engine.metrics().kv_pages_used, 0);
    }
}

#[test]
fn a_generation_stopped_on_a_draft_leaves_its_context_as_without_drafts() {
    let engine = engine("smollm2-135m");
    let prompt = "List the numbers: one, two, three, four, five, six, seven, eight, nine, ten. \
                  Again: one, two, three, four,";
    for stop in [" six,", " seven", " nine"] {
        let run = |speculate: bool| {
            let mut ctx = engine.context();
            ctx.fill(prompt).expect("fill");
            let g = ctx
                .generate(Sampler::Argmax)
                .max_tokens(40)
                .stop_string(stop);
            let g = if speculate { g.system_speculation() } else { g };
            let text = block_on(g.collect_text()).expect("generate");
            (text, ctx.tokens().to_vec(), ctx.pending().to_vec())
        };
        let (plain, fast) = (run(false), run(true));
        assert_eq!(
            fast, plain,
            "stop {stop:?}: the context differs with drafts"
        );
        assert_eq!(
            plain.2.len(),
            1,
            "the last token waits in the pending buffer"
        );
    }
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn greedy_speculation_accepts_drafts_when_the_output_copies_the_input() {
    let engine = engine("smollm2-135m");
    let code = "fn add(a: i32, b: i32) -> i32 {\n    let sum = a + b;\n    println!(\"{}\", sum);\n    sum\n}\n";
    // One worked copy before the asked one: with the instruction alone, the first token is a
    // near-tie in llama.cpp too ("fn" -1.60 vs "let" -1.63), and a model that starts with
    // anything but "fn" does not copy. With the worked copy, llama.cpp's greedy top-2 margin
    // stays above 1.2 for the first 40 tokens.
    let prompt = format!(
        "Copy this code exactly.\n```rust\n{code}```\nCopy:\n```rust\n{code}```\nCopy:\n```rust\n"
    );
    let run = |speculate: bool| {
        let mut ctx = engine.context();
        ctx.fill(&prompt).expect("fill");
        let g = ctx.generate(Sampler::Argmax).max_tokens(48);
        let mut g = if speculate { g.system_speculation() } else { g };
        let mut steps = 0;
        while let Some(step) = g.next().expect("next") {
            block_on(step.execute()).expect("step");
            steps += 1;
        }
        (g.tokens().to_vec(), steps, g.speculation_stats())
    };
    let (plain, plain_steps, _) = run(false);
    let (fast, fast_steps, (drafted, accepted)) = run(true);
    assert_eq!(fast, plain);
    println!("steps {plain_steps} → {fast_steps}; drafted {drafted}, accepted {accepted}");
    assert!(
        accepted * 2 > drafted,
        "acceptance {accepted}/{drafted} on a copying task"
    );
    assert!(
        fast_steps * 2 < plain_steps,
        "speculation saved too few steps"
    );
}

/// A draft model's speculator runs passes of its own context from inside the target's step
/// (nested `block_on`). With the target's own weights as the draft, batch invariance makes
/// every draft token the target's greedy choice: all are kept, and the output is unchanged.
#[test]
fn a_draft_model_speculator_runs_its_own_passes_inside_each_step() {
    let refs = reference();
    let target = engine("smollm2-135m");
    let other = engine("smollm2-135m");
    for draft_engine in [&other, &target] {
        let (mut drafted, mut kept, mut steps, mut tokens) = (0, 0, 0, 0);
        for case in refs["cases"].as_array().expect("cases") {
            if case["model"] != "smollm2" {
                continue;
            }
            let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).expect("ids");
            let n = case["greedy_ids"].as_array().map_or(32, Vec::len);
            let run = |speculate: bool| {
                let mut ctx = target.context();
                ctx.fill_tokens(&ids).expect("fill");
                let g = ctx.generate(Sampler::Argmax).max_tokens(n).ignore_eos();
                let mut g = match speculate {
                    true => g
                        .speculator(weft::DraftModel::new(draft_engine.context()))
                        .draft_len(4),
                    false => g,
                };
                let mut steps = 0;
                while let Some(step) = g.next().expect("next") {
                    block_on(step.execute()).expect("step");
                    steps += 1;
                }
                (g.tokens().to_vec(), steps, g.speculation_stats())
            };
            let (plain, _, _) = run(false);
            let (fast, s, (d, k)) = run(true);
            assert_eq!(
                fast, plain,
                "{:?}: the draft changed the output",
                case["prompt"]
            );
            drafted += d;
            kept += k;
            steps += s;
            tokens += fast.len();
        }
        println!("drafted {drafted}, kept {kept}, {tokens} tokens in {steps} steps");
        assert!(drafted > 0);
        assert_eq!(
            kept, drafted,
            "the same weights disagreed with their own draft"
        );
        assert!(steps * 3 < tokens, "{tokens} tokens took {steps} steps");
    }
    assert_eq!(target.metrics().kv_pages_used, 0);
    assert_eq!(other.metrics().kv_pages_used, 0);
}

/// Exact next-token probabilities after `ids` (temperature 1, whole vocabulary).
fn exact(engine: &Engine, ids: &[u32]) -> Vec<(u32, f64)> {
    let mut ctx = engine.context();
    ctx.fill_tokens(ids).expect("fill");
    let mut fwd = ctx.forward();
    let h = fwd.probe(
        fwd.len() - 1,
        Distribution {
            temperature: 1.0,
            k: 0,
        },
    );
    let out = block_on(fwd.execute()).expect("probe");
    let (ids, p) = out.distribution(h).expect("distribution");
    ids.iter()
        .zip(p)
        .map(|(&i, &p)| (i, f64::from(p)))
        .collect()
}

#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    let engine = engine("smollm2-135m");
    let prompt = engine.tokenize("one two three four five one two three four five one two three");
    // Exact joint distribution of the first two tokens, for the likeliest first tokens.
    let first = exact(&engine, &prompt);
    let mut cells: Vec<((u32, u32), f64)> = Vec::new();
    for &(t1, p1) in first.iter().take(3) {
        let mut ids = prompt.clone();
        ids.push(t1);
        for &(t2, p2) in exact(&engine, &ids).iter().take(3) {
            cells.push(((t1, t2), p1 * p2));
        }
    }
    let covered: f64 = cells.iter().map(|c| c.1).sum();
    // Speculative samples: many seeds, generated concurrently.
    let n = 400;
    let mut ctxs: Vec<_> = (0..n)
        .map(|seed| {
            let mut c = engine.context();
            c.set_seed(seed);
            c.fill_tokens(&prompt).expect("fill");
            c
        })
        .collect();
    let runs = block_on(join_all(ctxs.iter_mut().map(|c| async move {
        let mut g = c
            .generate(Sampler::Temperature { temperature: 1.0 })
            .max_tokens(2)
            .stop(&[])
            .system_speculation();
        while let Some(step) = g.next()? {
            step.execute().await?;
        }
        Ok::<_, Error>((g.tokens().to_vec(), g.speculation_stats()))
    })));
    let mut counts = vec![0usize; cells.len()];
    let (mut other, mut drafted, mut accepted) = (0usize, 0, 0);
    for r in runs {
        let (tokens, (d, a)) = r.expect("generation");
        drafted += d;
        accepted += a;
        match cells
            .iter()
            .position(|c| tokens.len() == 2 && c.0 == (tokens[0], tokens[1]))
        {
            Some(i) => counts[i] += 1,
            None => other += 1,
        }
    }
    assert!(
        accepted > 0,
        "no draft was ever accepted (drafted {drafted})"
    );
    // Pearson's chi-square over the cells and the rest.
    let mut chi2 = 0.0;
    for (c, &k) in cells.iter().zip(&counts) {
        let e = c.1 * n as f64;
        chi2 += (k as f64 - e).powi(2) / e;
        println!("{:?}: expected {e:.1}, got {k}", c.0);
    }
    let e_other = (1.0 - covered) * n as f64;
    if e_other > 1.0 {
        chi2 += (other as f64 - e_other).powi(2) / e_other;
    }
    println!(
        "chi2 = {chi2:.2} over {} cells; drafted {drafted}, accepted {accepted}",
        cells.len() + 1
    );
    // 9 degrees of freedom: P(chi2 > 27.88) = 0.001.
    assert!(
        chi2 < 27.88,
        "speculative samples do not follow the target distribution"
    );
}

#[test]
fn speculator_and_system_speculation_are_exclusive() {
    let engine = engine("smollm2-135m");
    let mut ctx = engine.context();
    ctx.fill("Hello").expect("fill");
    let steps_before = engine.metrics().steps;
    let mut g = ctx
        .generate(Sampler::Argmax)
        .speculator(NgramSpeculator::default())
        .system_speculation();
    assert!(matches!(g.next(), Err(Error::Config(_))));
    assert!(g.next().expect("stopped").is_none());
    drop(g);
    assert_eq!(engine.metrics().steps, steps_before, "a pass ran");
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn greedy_speculation_with_penalties_equals_greedy_without() {
    let engine = engine("smollm2-135m");
    let prompt = "Repeat after me: alpha beta gamma delta, alpha beta gamma delta, alpha beta";
    let penalties = weft::Penalties {
        repetition: 1.3,
        ..weft::Penalties::default()
    };
    let run = |speculate: bool| {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        let g = ctx
            .generate(Sampler::Argmax)
            .max_tokens(24)
            .penalties(penalties.clone());
        let g = if speculate { g.system_speculation() } else { g };
        block_on(g.collect_tokens()).expect("generate")
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn a_dropped_step_future_is_undone_by_the_next_step() {
    use futures_util::FutureExt;
    let engine = engine("smollm2-135m");
    let prompt = "The capital of France is Paris. The capital of France is";
    let plain = {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        block_on(
            ctx.generate(Sampler::Argmax)
                .max_tokens(10)
                .collect_tokens(),
        )
        .expect("plain")
    };
    let mut ctx = engine.context();
    ctx.fill(prompt).expect("fill");
    let mut g = ctx
        .generate(Sampler::Argmax)
        .max_tokens(10)
        .system_speculation();
    let mut out = Vec::new();
    for i in 0.. {
        let Some(step) = g.next().expect("next") else {
            break;
        };
        if i % 2 == 0 {
            // Submit the pass, then drop the future before it completes.
            if let Some(r) = step.execute().now_or_never() {
                out.extend(r.expect("step").accepted);
            }
        } else {
            out.extend(block_on(step.execute()).expect("step").accepted);
        }
    }
    assert_eq!(out, plain, "an abandoned step changed the output");
    drop(g);
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// A generator dropped right after one of its steps' futures (a timeout around a generation,
/// with drafts in the step's pass): the context keeps the accepted tokens, not the drafts the
/// step only tried.
#[test]
fn a_generator_dropped_with_its_step_leaves_only_accepted_tokens() {
    use futures_util::FutureExt;
    let engine = engine("smollm2-135m");
    with_a_step_in_flight(|| {
        let mut ctx = engine.context();
        ctx.fill("The capital of France is Paris. The capital of France is")
            .expect("fill");
        let prompt = ctx.pending().to_vec();
        let accepted = {
            let mut g = ctx
                .generate(Sampler::Argmax)
                .max_tokens(10)
                .system_speculation();
            let step = g.next().expect("next").expect("a step");
            block_on(step.execute()).expect("first step");
            let step = g.next().expect("next").expect("a step");
            if step.execute().now_or_never().is_some() {
                return false;
            }
            g.tokens().to_vec()
        };
        assert_eq!(accepted.len(), 1);
        let fork = ctx.fork().expect("fork");
        block_on(ctx.flush_logits()).expect("the accepted token runs again");
        assert_eq!(ctx.tokens(), [&prompt[..], &accepted].concat());
        // A fork taken before that starts where the step did as well.
        assert_eq!((fork.len(), fork.pending()), (prompt.len(), &accepted[..]));
        drop((fork, ctx));
        assert_eq!(engine.metrics().kv_pages_used, 0);
        true
    });
}

/// Runs `case` until the step future it drops was still in flight then: it returns `false`
/// when the scheduler finished the step's pass within the future's one poll (a busy machine
/// may preempt the test's thread that long), a run that tests nothing. At most five runs.
fn with_a_step_in_flight(mut case: impl FnMut() -> bool) {
    for _ in 0..5 {
        if case() {
            return;
        }
    }
    panic!("five times the step's pass finished within the future's first poll");
}

/// Tokens accepted after a step whose future was dropped come after that step's input: the
/// next step runs both (the dropped one is undone first, as `next` undoes it).
#[test]
fn tokens_accepted_after_a_dropped_step_run_after_its_input() {
    use futures_util::FutureExt;
    let engine = engine("smollm2-135m");
    with_a_step_in_flight(|| {
        let mut ctx = engine.context();
        ctx.fill("The capital of France is").expect("fill");
        let mut g = ctx.generate(Sampler::Argmax).max_tokens(8);
        let step = g.next().expect("next").expect("a step");
        block_on(step.execute()).expect("first step");
        let first = g.tokens().to_vec();
        assert_eq!(first.len(), 1);
        let step = g.next().expect("next").expect("a step");
        if step.execute().now_or_never().is_some() {
            return false;
        }
        let chosen = engine.tokenize(" the")[0];
        g.accept(&[chosen]).expect("accept");
        assert_eq!(g.tokens(), [first[0], chosen]);
        let step = g.next().expect("next").expect("a step");
        block_on(step.execute()).expect("step after");
        let run = g.context().tokens();
        assert_eq!(run[run.len() - 2..], [first[0], chosen], "{run:?}");
        true
    });
}

/// Drafts that would cross a rule of the step: `min_tokens` (whose ban on the stop ids holds
/// at every position of a step) and a constraint a draft token completes (the position after it
/// allows only an end of sequence, which `min_tokens` bans). Greedy output and stop reason
/// are the same as without a drafter, and neither is an error.
#[test]
fn drafts_respect_min_tokens_and_a_constraint_they_complete() {
    let engine = engine("smollm2-135m");
    let comma = engine.tokenizer().encode(",", false, false)[0];
    // (prompt, stop ids, schema, min_tokens, max_tokens) with or without drafts.
    let run = |prompt: &str,
               stops: &[u32],
               schema: Option<&serde_json::Value>,
               (min, max): (usize, usize),
               speculate: bool| {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        let mut g = ctx
            .generate(Sampler::Argmax)
            .stop(stops)
            .min_tokens(min)
            .max_tokens(max);
        if let Some(s) = schema {
            g = g.constrain_with(weft::Schema::JsonSchema(s.clone()));
        }
        if speculate {
            g = g.system_speculation();
        }
        while let Some(step) = g.next().expect("next") {
            block_on(step.execute()).expect("step");
        }
        (g.tokens().to_vec(), g.stop_reason().cloned())
    };
    let list = "List: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple,";
    let plain = run(list, &[comma], None, (1, 20), false);
    assert_eq!(plain.1, Some(weft::StopReason::StopToken(comma)));
    let fast = run(list, &[comma], None, (1, 20), true);
    assert_eq!(fast, plain, "min_tokens with drafts");

    let json = "Output: {\"a\": 1}\nOutput: {\"a\": 1}\nOutput: {\"a\": 1}\nOutput: ";
    let schema = serde_json::json!({
        "type": "object", "properties": {"a": {"type": "integer"}},
        "required": ["a"], "additionalProperties": false,
    });
    let plain = run(json, &[], Some(&schema), (20, 40), false);
    assert_eq!(plain.1, Some(weft::StopReason::Constraint));
    let fast = run(json, &[], Some(&schema), (20, 40), true);
    assert_eq!(fast, plain, "a constraint completed by a draft");
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// A generation banning an id with a `-inf` bias is saved and resumed (JSON has no infinity).
#[test]
fn a_generation_with_a_banned_id_is_saved_and_resumed() {
    let engine = engine("smollm2-135m");
    let banned = engine.tokenizer().encode(" the", false, false)[0];
    let mut ctx = engine.context();
    ctx.fill("Tell me about the sea and the sky.")
        .expect("fill");
    let mut g = ctx
        .generate(Sampler::Argmax)
        .max_tokens(24)
        .logit_bias(&[(banned, f32::NEG_INFINITY)]);
    for _ in 0..4 {
        let step = g.next().expect("next").expect("a step");
        block_on(step.execute()).expect("step");
    }
    let bytes = g.snapshot().expect("snapshot");
    let whole = block_on(g.collect_tokens()).expect("rest");
    let mut resumed = engine.resume(&bytes).expect("resume");
    let again = block_on(
        resumed
            .resume_generator()
            .expect("generator")
            .collect_tokens(),
    )
    .expect("resumed rest");
    assert_eq!(again, whole);
    assert!(!whole.contains(&banned));
}

/// Drafts `len` copies of one token on its first call only: a guess that is rejected.
struct Stubborn {
    token: u32,
    len: usize,
}

impl weft::Speculator for Stubborn {
    fn draft(&mut self, _tokens: &[u32], max: usize) -> Vec<u32> {
        let draft = vec![self.token; self.len.min(max)];
        self.len = 0;
        draft
    }
}

#[test]
fn drafts_longer_than_a_sliding_window_are_rejected_without_losing_keys() {
    // Gemma 3's local layers see 512 positions. A rejected draft of more than a window must
    // not have the cache give back pages the rolled-back position still needs.
    let engine = engine("gemma3-270m");
    let prompt = "Write a long story about a lighthouse keeper and the sea.";
    let run = |draft: Option<usize>| {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        let g = ctx.generate(Sampler::Argmax).max_tokens(2000);
        let mut g = match draft {
            Some(len) => g.speculator(Stubborn { token: 7, len }).draft_len(len),
            None => g,
        };
        let mut out = Vec::new();
        while out.len() < 8 {
            let step = g.next().expect("next").expect("a step");
            out.extend(block_on(step.execute()).expect("step").accepted);
        }
        out
    };
    let plain = run(None);
    assert_eq!(run(Some(1100)), plain);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}
