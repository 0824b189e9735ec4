//! The generation surface the seeds promise, on the real models: exact-length generation,
//! stop rules as one value, engine defaults, the horizon hint, reading outputs by handle,
//! `Rewindable`, and rollouts from ids / padded batches with seed 003's padded output.

use crate::common;

use std::time::Duration;

use weft::rollout::{generate_batch, padded, padded_left_prompts, Prompt, RolloutRequest};
use weft::{
    block_on, Distribution, Engine, EngineConfig, Entropy, Error, GenerationDefaults, Hidden,
    Logits, Logprob, Logprobs, Rewindable, Sampler, StopReason, StopRules,
};

fn config() -> EngineConfig {
    EngineConfig {
        n_threads: 2,
        kv_tokens: 4096,
        ..EngineConfig::default()
    }
}

/// A chat turn (SmolLM2's markup, no system prompt) the model answers in about ten tokens
/// and then ends with `<|im_end|>`.
const CHAT: &str =
    "<|im_start|>user\nReply with one word: hello<|im_end|>\n<|im_start|>assistant\n";

fn chat_prompt(engine: &Engine) -> weft::Context {
    let mut ctx = engine.context();
    ctx.fill(CHAT).expect("chat");
    ctx
}

#[test]
fn ignore_eos_generates_exactly_n_tokens_past_the_end_of_turn() {
    let engine = common::engine_with("smollm2-135m", config());
    // Without it, greedy generation ends early on the model's end of turn (so this test can
    // tell the two apart).
    let mut ctx = chat_prompt(&engine);
    let mut gen = ctx.generate(Sampler::Argmax).max_tokens(48);
    while let Some(step) = gen.next().expect("step") {
        block_on(step.execute()).expect("execute");
    }
    let short = gen.tokens().to_vec();
    let Some(StopReason::StopToken(eos)) = gen.stop_reason().cloned() else {
        panic!("expected an end of turn, got {:?}", gen.stop_reason());
    };
    assert!(short.len() < 48 && engine.stop_tokens().contains(&eos));

    // With it: exactly 48 tokens, the same ones up to the end of turn, which is kept.
    ctx = chat_prompt(&engine);
    let gen = ctx.generate(Sampler::Argmax).max_tokens(48).ignore_eos();
    let long = block_on(gen.collect_tokens()).expect("generate");
    assert_eq!(long.len(), 48);
    assert_eq!(&long[..short.len()], &short[..]);
    assert_eq!(long[short.len()], eos);

    // The same as one value, shared with the server: `StopRules`.
    ctx = chat_prompt(&engine);
    let rules = StopRules::new().max_tokens(48).ignore_eos();
    let gen = ctx.generate(Sampler::Argmax).stop_rules(rules.clone());
    assert_eq!(gen.rules(), &rules);
    assert_eq!(block_on(gen.collect_tokens()).expect("rules"), long);
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// A generation cut inside a character (its last token the first bytes of an emoji) ends
/// its text with U+FFFD, as `detokenize` of its tokens does; the bytes used to vanish, so the
/// text and the streamed deltas disagreed with the tokens.
#[test]
fn a_generation_cut_inside_a_character_ends_with_a_replacement_character() {
    let engine = common::engine_with("smollm2-135m", config());
    // A token that is the start of a character and no text on its own.
    let tok = engine.tokenizer();
    let piece = (0..tok.vocab_size() as u32)
        .find(|&id| {
            let mut b = Vec::new();
            tok.append_piece(id, false, &mut b).is_ok()
                && b.len() == 1
                && b[0] >= 0xf0
                && std::str::from_utf8(&b).is_err()
        })
        .expect("a first byte of a four-byte character");
    let mut ctx = engine.context();
    ctx.fill("An emoji:").expect("fill");
    let mut gen = ctx.generate(Sampler::Argmax).max_tokens(1);
    let mut streamed = String::new();
    while let Some(mut step) = gen.next().expect("step") {
        step.clear_sampler();
        block_on(step.execute()).expect("execute");
        gen.accept(&[piece]).expect("accept");
        streamed.push_str(&gen.ready_text());
    }
    streamed.push_str(&gen.ready_text());
    assert_eq!(gen.tokens(), [piece]);
    let expected = engine
        .detokenize_skip_special(&[piece])
        .expect("detokenize");
    assert_eq!(expected, "\u{fffd}");
    assert_eq!(gen.text(), expected);
    assert_eq!(streamed, expected);
    drop(gen);
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// `detokenize` renders control tokens as llama.cpp's detokenizer does; the
/// `skip_special` form leaves them out (transformers' `skip_special_tokens`), which is the
/// text a generation streams, also past an end of turn.
#[test]
fn detokenize_renders_control_tokens_and_its_skip_special_form_leaves_them_out() {
    let engine = common::engine_with("smollm2-135m", config());
    let ids = engine.tokenize(CHAT);
    assert_eq!(engine.detokenize(&ids).expect("text"), CHAT);
    assert_eq!(
        engine.detokenize_skip_special(&ids).expect("text"),
        "user\nReply with one word: hello\nassistant\n"
    );
    let mut ctx = chat_prompt(&engine);
    let gen = ctx.generate(Sampler::Argmax).max_tokens(32).ignore_eos();
    let (text, tokens) = block_on(async {
        let mut gen = gen;
        let mut text = String::new();
        while let Some(delta) = gen.next_text().await? {
            text.push_str(&delta);
        }
        Ok::<_, Error>((text, gen.tokens().to_vec()))
    })
    .expect("generate");
    assert!(tokens.iter().any(|t| engine.stop_tokens().contains(t)));
    assert!(engine
        .detokenize(&tokens)
        .expect("text")
        .contains("<|im_end|>"));
    assert_eq!(engine.detokenize_skip_special(&tokens).expect("text"), text);
}

#[test]
fn a_generation_ended_early_keeps_its_last_token_and_goes_on_as_if_never_stopped() {
    let engine = common::engine_with("smollm2-135m", config());
    let mut ctx = engine.context();
    ctx.fill("Once upon a time").expect("fill");
    let prompt = ctx.pending().to_vec();
    let whole = block_on(
        ctx.generate(Sampler::Argmax)
            .max_tokens(12)
            .ignore_eos()
            .collect_tokens(),
    )
    .expect("generate");

    let mut ctx = engine.context();
    ctx.fill("Once upon a time").expect("fill");
    let mut gen = ctx.generate(Sampler::Argmax).max_tokens(12).ignore_eos();
    let mut streamed = String::new();
    while let Some(delta) = block_on(gen.next_text()).expect("step") {
        streamed.push_str(&delta);
        if gen.tokens_generated() == 5 {
            gen.end().expect("end");
            break;
        }
    }
    assert_eq!(gen.stop_reason(), Some(&StopReason::Ended));
    gen.end().expect("a second end does nothing");
    assert!(block_on(gen.next_text()).expect("ended").is_none());
    // The context holds all five tokens streamed, the last one pending ...
    let mut held = ctx.tokens().to_vec();
    held.extend_from_slice(ctx.pending());
    assert_eq!(held[..prompt.len()], prompt[..]);
    assert_eq!(held[prompt.len()..], whole[..5]);
    assert_eq!(ctx.pending().len(), 1);
    assert_eq!(engine.detokenize(&whole[..5]).expect("text"), streamed);
    // ... so a new generation goes on exactly where the uninterrupted one went.
    let rest = block_on(
        ctx.generate(Sampler::Argmax)
            .max_tokens(7)
            .ignore_eos()
            .collect_tokens(),
    )
    .expect("go on");
    assert_eq!(rest, whole[5..]);
}

#[test]
fn a_pass_whose_mask_allows_no_token_leaves_context_and_cache_as_it_found_them() {
    let engine = common::engine_with("smollm2-135m", config());
    let vocab = engine.info().vocab_size;
    let prompt = engine.tokenize("The capital of France is");
    let paris = engine.tokenize(" Paris")[0];
    let mut reference = engine.context();
    reference.fill_tokens(&prompt).expect("fill");
    reference.fill_tokens(&[paris]).expect("fill");
    let want = block_on(reference.flush_logits()).expect("reference");

    let mut ctx = engine.context();
    ctx.fill_tokens(&prompt).expect("fill");
    block_on(ctx.flush_logits()).expect("prompt");
    // The model runs the token before the sampler finds nothing allowed.
    let mut fwd = ctx.forward();
    fwd.input(&[paris]);
    fwd.sample(&[0], Sampler::Argmax);
    fwd.mask(weft::Brle::all(vocab, false));
    let failed = block_on(fwd.execute());
    assert!(matches!(failed, Err(Error::NothingAllowed)), "{failed:?}");
    assert_eq!(ctx.len(), prompt.len());
    // The same token again: the logits of a context that never saw the failed pass.
    let got = block_on(ctx.decode(paris)).expect("decode");
    assert_eq!(got, want);
    ctx.snapshot().expect("context and cache agree");
    // Biases of -inf on every token leave nothing either (the sampler answered token 0).
    let held = |c: &weft::Context| [c.tokens(), c.pending()].concat();
    let before = held(&ctx);
    let bias: Vec<(u32, f32)> = (0..vocab as u32)
        .map(|id| (id, f32::NEG_INFINITY))
        .collect();
    let failed = block_on(
        ctx.generate(Sampler::Argmax)
            .logit_bias(&bias)
            .max_tokens(2)
            .collect_tokens(),
    );
    assert!(matches!(failed, Err(Error::NothingAllowed)), "{failed:?}");
    // The same tokens (the last one pending again, as a generator starting here takes it).
    assert_eq!(held(&ctx), before);
    ctx.snapshot().expect("context and cache agree");
    drop((ctx, reference));
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn a_generation_that_fills_the_context_stops_there_with_its_output() {
    let engine = common::engine_with(
        "smollm2-135m",
        EngineConfig {
            n_ctx: Some(64),
            ..config()
        },
    );
    let mut ctx = engine.context();
    ctx.fill("Once upon a time, in a small village by the sea, there lived")
        .expect("fill");
    let prompt = ctx.pending().len();
    let mut gen = ctx.generate(Sampler::Argmax).max_tokens(100).ignore_eos();
    let text = block_on(gen.next_text()).expect("first delta");
    assert!(text.is_some());
    while block_on(gen.next_text())
        .expect("no error at the end of the context")
        .is_some()
    {}
    assert_eq!(gen.stop_reason(), Some(&StopReason::ContextFull));
    // Every position holds a token; the last one generated waits, pending, for room.
    let made = gen.tokens().len();
    assert_eq!(prompt + made, 64 + 1);
    assert_eq!((ctx.len(), ctx.pending().len()), (64, 1));
    // A prompt that does not fit at all is still an error.
    let mut ctx = engine.context();
    ctx.fill(&"word ".repeat(80)).expect("fill");
    let failed = block_on(ctx.generate(Sampler::Argmax).max_tokens(4).collect_tokens());
    assert!(
        matches!(failed, Err(Error::ContextTooLong { .. })),
        "{failed:?}"
    );
}

#[test]
fn engine_defaults_apply_to_generators_that_set_nothing() {
    let defaults = GenerationDefaults {
        sampler: Sampler::TopK {
            k: 40,
            temperature: 0.9,
        },
        stop: StopRules::new().max_tokens(7).ignore_eos(),
    };
    let engine = common::engine_with(
        "smollm2-135m",
        EngineConfig {
            generation: defaults.clone(),
            ..config()
        },
    );
    // The whole configuration in effect, with what the engine resolved filled in.
    let c = engine.config();
    assert_eq!(c.generation, defaults);
    assert_eq!(c.n_threads, 2);
    assert_eq!(c.kv_tokens, 4096);
    assert_eq!(c.n_ctx, Some(engine.n_ctx()));
    assert!(engine.n_ctx() > 0);

    // No sampler, no stop rules: the engine's (7 tokens, end of turn ignored, top-k 40).
    let run = |sampler: Option<Sampler>, seed: u64| {
        let mut ctx = chat_prompt(&engine);
        ctx.set_seed(seed);
        block_on(ctx.generate(sampler).collect_tokens()).expect("generate")
    };
    let by_default = run(None, 3);
    assert_eq!(by_default.len(), 7);
    assert_eq!(by_default, run(Some(defaults.sampler.clone()), 3));
    // A generator's own settings win.
    let mut ctx = chat_prompt(&engine);
    let greedy = block_on(ctx.generate(Sampler::Argmax).max_tokens(3).collect_tokens())
        .expect("own settings");
    assert_eq!(greedy.len(), 3);
    let differs = (0..4u64).any(|s| run(None, s) != run(Some(Sampler::Argmax), s));
    assert!(differs, "the default sampler was not used");
}

#[test]
fn a_generation_ending_on_a_stop_token_is_not_waited_for() {
    // A long batch wait makes a wait for a pass that never comes visible in the metrics: the
    // scheduler waits for announced passes only once other work is queued, so each check
    // runs one pass of another context afterwards.
    let engine = common::engine_with(
        "smollm2-135m",
        EngineConfig {
            batch_wait: Duration::from_millis(400),
            ..config()
        },
    );
    let mut other = engine.context();
    let mut other_pass = || {
        other.fill(" and").expect("fill");
        block_on(other.flush_logits()).expect("other pass");
        engine.metrics().batch_wait_timeouts
    };
    let mut ctx = chat_prompt(&engine);
    // 200 tokens allowed: every step announces more passes, until the end of turn.
    let gen = ctx.generate(Sampler::Argmax).max_tokens(200);
    let out = block_on(gen.collect_tokens()).expect("generate");
    assert!(out.len() < 200);
    assert_eq!(other_pass(), 0);

    // The horizon hint overrides the automatic one, and changes no output.
    ctx = chat_prompt(&engine);
    let hinted = block_on(
        ctx.generate(Sampler::Argmax)
            .max_tokens(200)
            .horizon(0)
            .collect_tokens(),
    )
    .expect("horizon");
    assert_eq!(hinted, out);
    // A generator dropped in the middle is not waited for either.
    ctx = chat_prompt(&engine);
    {
        let mut gen = ctx.generate(Sampler::Argmax).max_tokens(200);
        let step = gen.next().expect("next").expect("a step");
        block_on(step.execute()).expect("execute");
    }
    assert_eq!(other_pass(), 0);
    // The metric counts a real wait: a step that announces more passes, then none comes.
    {
        let mut fwd = ctx.forward();
        fwd.input(&[42]).horizon(5);
        block_on(fwd.execute()).expect("announcing pass");
    }
    assert_eq!(other_pass(), 1);
}

#[test]
fn outputs_are_read_by_handle_with_the_handles_type() {
    let engine = common::engine_with("gemma3-270m", config());
    let mut ctx = engine.context();
    ctx.fill("The capital of France is").expect("fill");
    let mut fwd = ctx.forward();
    let last = fwd.len() - 1;
    let next = fwd.sample(&[last - 1, last], Sampler::Argmax);
    let ent = fwd.probe(last, Entropy);
    let logits = fwd.probe(last, Logits);
    let dist = fwd.probe(
        last,
        Distribution {
            temperature: 1.0,
            k: 3,
        },
    );
    let paris = engine.tokenize(" Paris")[0];
    let lp = fwd.probe(last, Logprob(paris));
    let lps = fwd.probe(last, Logprobs(vec![paris, 0]));
    let hidden = fwd.probe(last, Hidden);
    let out = block_on(fwd.execute()).expect("execute");

    let tokens: &[u32] = out.get(next);
    assert_eq!(tokens.len(), 2);
    assert_eq!(out.get(&next), tokens); // a reference reads the same
    let entropy: f32 = out.get(ent);
    let row: &[f32] = out.get(logits);
    let (ids, probs): (&[u32], &[f32]) = out.get(dist);
    let one: f32 = out.get(lp);
    let several: &[f32] = out.get(lps);
    assert_eq!(row.len(), engine.info().vocab_size);
    assert_eq!(out.get(hidden).len(), engine.info().n_embd);
    // The values agree with each other and with the old readers.
    let argmax = (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32;
    assert_eq!(tokens[1], argmax);
    assert_eq!(ids[0], argmax);
    assert_eq!(ids.len(), 3);
    assert!(probs[0] >= probs[1]);
    assert_eq!(one, several[0]);
    assert_eq!(Some(entropy), out.entropy(ent));
    assert_eq!(Some(row), out.logits(logits));
    assert_eq!(out.token(next), Some(tokens[0]));
    // Log-softmax checked by hand on the logits row.
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + row.iter().map(|l| ((l - m) as f64).exp()).sum::<f64>().ln() as f32;
    assert!((one - (row[paris as usize] - lse)).abs() < 1e-3);

    // A handle of another pass: `try_get` says so, `get` panics as indexing does.
    let mut other = engine.context();
    other.fill("Hi").expect("fill");
    let mut fwd = other.forward();
    let _ = fwd.probe(0, Entropy);
    let small = block_on(fwd.execute()).expect("other");
    assert!(small.try_get(logits).is_none());
    assert!(small.try_get(next).is_none());
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| small.get(logits)));
    assert!(caught.is_err());
}

/// Generic code over `Rewindable`: greedy-decodes `n` tokens with a caller-supplied step and
/// rewinds to where it started, returning what it saw (a look-ahead probe, as a speculative
/// or search loop does).
fn look_ahead<R: Rewindable>(r: &mut R, n: usize, mut step: impl FnMut(&mut R) -> u32) -> Vec<u32> {
    let mark = r.len();
    let seen = (0..n).map(|_| step(r)).collect();
    r.truncate(mark).expect("rewind");
    seen
}

#[test]
fn rewindable_lets_generic_code_look_ahead_and_come_back() {
    let engine = common::engine_with("smollm2-135m", config());
    let mut ctx = engine.context();
    ctx.fill("The capital of France is").expect("fill");
    // Filled but not run: empty to neither generic nor direct code.
    assert!(Rewindable::len(&ctx) == 0 && !Rewindable::is_empty(&ctx) && !ctx.is_empty());
    block_on(ctx.flush_logits()).expect("prefill");
    let before = ctx.tokens().to_vec();
    let greedy_step = |c: &mut weft::Context| {
        let logits = block_on(c.flush_logits()).expect("logits");
        let t = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap() as u32;
        c.fill_tokens(&[t]).expect("fill");
        t
    };
    // The first flush recomputes the last token's logits: rerun it by rewinding one.
    Rewindable::truncate(&mut ctx, before.len() - 1).expect("truncate");
    ctx.fill_tokens(&before[before.len() - 1..])
        .expect("refill");
    let seen = look_ahead(&mut ctx, 5, greedy_step);
    assert_eq!(ctx.tokens(), &before[..before.len() - 1]);
    assert!(ctx.pending().is_empty());
    // What it saw is what greedy generation produces.
    let mut fresh = engine.context();
    fresh.fill("The capital of France is").expect("fill");
    let greedy = block_on(
        fresh
            .generate(Sampler::Argmax)
            .max_tokens(5)
            .collect_tokens(),
    )
    .expect("greedy");
    assert_eq!(seen, greedy);
    assert!(matches!(
        Rewindable::truncate(&mut ctx, 10_000),
        Err(Error::TruncateTooLong { .. })
    ));
    drop((ctx, fresh));
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// A batch of rollouts larger than the KV cache holds at once runs in turns and gives what
/// each rollout gives alone (it failed with `KvCacheFull`, every rollout lost).
#[test]
fn a_batch_larger_than_the_kv_cache_runs_in_turns_with_the_same_rollouts() {
    let requests: Vec<RolloutRequest> = (0..8u64)
        .map(|i| RolloutRequest {
            max_tokens: 40,
            seed: i,
            ..RolloutRequest::new(
                format!("Fact {i} about the sea:"),
                Sampler::TopK {
                    k: 40,
                    temperature: 0.8,
                },
            )
        })
        .collect();
    let roomy = common::engine_with("smollm2-135m", config());
    let alone: Vec<_> = requests
        .iter()
        .map(|r| block_on(generate_batch(&roomy, std::slice::from_ref(r))).expect("alone"))
        .map(|mut one| one.remove(0))
        .collect();
    let total: usize = alone
        .iter()
        .map(|r| r.prompt_tokens.len() + r.tokens.len())
        .sum();
    let small = common::engine_with(
        "smollm2-135m",
        EngineConfig {
            kv_tokens: 256,
            ..config()
        },
    );
    assert!(
        total > 256,
        "the batch must not fit at once ({total} tokens)"
    );
    let batch = block_on(generate_batch(&small, &requests)).expect("the batch runs in turns");
    assert_eq!(batch, alone);
    assert_eq!(small.metrics().kv_pages_used, 0);
}

#[test]
fn rollouts_from_ids_padded_batches_and_max_length() {
    let engine = common::engine_with("smollm2-135m", config());
    let texts = ["The capital of France is", "Water boils at"];
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| engine.tokenizer().encode(t, true, true))
        .collect();
    // Ids give the same rollouts as the text they tokenize to.
    let greedy = |p: Prompt| RolloutRequest {
        max_tokens: 12,
        ..RolloutRequest::new(p, Sampler::Argmax)
    };
    let from_text: Vec<_> = texts.iter().map(|t| greedy((*t).into())).collect();
    let from_ids: Vec<_> = ids.iter().map(|i| greedy(i.clone().into())).collect();
    let a = block_on(generate_batch(&engine, &from_text)).expect("text");
    let b = block_on(generate_batch(&engine, &from_ids)).expect("ids");
    assert_eq!(a, b);
    assert_eq!(a[0].prompt_tokens, ids[0]);

    // Seed 003's left-padded input (ids + attention mask) runs as the unpadded prompts.
    let pad = 0;
    let width = ids.iter().map(Vec::len).max().unwrap();
    let padded_ids: Vec<Vec<u32>> = ids
        .iter()
        .map(|r| [vec![pad; width - r.len()], r.clone()].concat())
        .collect();
    let mask: Vec<Vec<u8>> = ids
        .iter()
        .map(|r| [vec![0; width - r.len()], vec![1; r.len()]].concat())
        .collect();
    let mut reqs = RolloutRequest::from_padded(&padded_ids, &mask, Sampler::Argmax).expect("pad");
    for r in &mut reqs {
        r.max_tokens = 12;
    }
    assert_eq!(block_on(generate_batch(&engine, &reqs)).expect("padded"), a);
    // Malformed padded input is a typed error.
    for (ids, mask) in [
        (vec![vec![1, 2]], vec![vec![1, 0, 1]]),
        (vec![vec![1, 2, 3]], vec![vec![1, 0, 1]]),
        (vec![vec![1, 2]], vec![vec![0, 0]]),
        (vec![vec![1, 2]], vec![]),
    ] {
        assert!(matches!(
            RolloutRequest::from_padded(&ids, &mask, Sampler::Argmax),
            Err(Error::PaddedBatch { .. })
        ));
    }

    // max_length counts prompt + generated, the tighter limit wins.
    let mut limited = from_ids.clone();
    limited[0].max_length = Some(ids[0].len() + 3);
    limited[1].max_length = Some(ids[1].len() + 50);
    let c = block_on(generate_batch(&engine, &limited)).expect("max_length");
    // A stop sequence past the vocabulary could never match: refused before anything runs.
    let steps_before_refusals = engine.metrics().steps;
    let mut oov = from_ids.clone();
    oov[1].stop_sequences = vec![vec![u32::MAX]];
    let refused = block_on(generate_batch(&engine, &oov)).unwrap_err();
    assert!(
        matches!(refused, Error::InRequest { index: 1, .. })
            && matches!(refused.cause(), Error::TokenOutOfVocab { .. }),
        "{refused:?}"
    );
    // So are an empty prompt and one longer than the context, naming the request.
    let mut bad = from_ids.clone();
    bad[1].prompt = Prompt::Tokens(vec![]);
    let e = block_on(generate_batch(&engine, &bad)).unwrap_err();
    assert!(matches!(e.cause(), Error::EmptyPass), "{e}");
    assert!(e.to_string().starts_with("request 1 of the batch"), "{e}");
    bad[1].prompt = Prompt::Tokens(vec![ids[1][1]; engine.n_ctx() + 1]);
    let e = block_on(generate_batch(&engine, &bad)).unwrap_err();
    assert!(matches!(e.cause(), Error::ContextTooLong { .. }), "{e}");
    // And the options a generator would refuse at its first step: a bad sampler, a logit
    // bias past the vocabulary, penalties out of range.
    let mut bad = from_ids.clone();
    bad[1].sampler = Sampler::TopK {
        k: 0,
        temperature: 1.0,
    };
    let mut biased = from_ids.clone();
    biased[1].logit_bias = vec![(u32::MAX, 1.0)];
    let mut penalized = from_ids.clone();
    penalized[1].penalties = Some(weft::Penalties {
        repetition: f32::NAN,
        ..weft::Penalties::default()
    });
    for batch in [bad, biased, penalized] {
        let e = block_on(generate_batch(&engine, &batch)).unwrap_err();
        assert!(
            matches!(e, Error::InRequest { index: 1, .. })
                && matches!(e.cause(), Error::Sampler(_)),
            "{e:?}"
        );
    }
    assert_eq!(engine.metrics().steps, steps_before_refusals);
    assert_eq!(engine.metrics().kv_pages_used, 0);
    // A request that fails only as it runs (a bias that leaves nothing to sample) is named
    // too, and the others' pages go back.
    let mut banned = from_ids.clone();
    let vocab = engine.info().vocab_size as u32;
    banned[1].logit_bias = (0..vocab).map(|t| (t, f32::NEG_INFINITY)).collect();
    let e = block_on(generate_batch(&engine, &banned)).unwrap_err();
    assert!(
        matches!(e, Error::InRequest { index: 1, .. })
            && matches!(e.cause(), Error::NothingAllowed),
        "{e:?}"
    );
    assert_eq!(engine.metrics().kv_pages_used, 0);
    assert_eq!(c[0].tokens, a[0].tokens[..3]);
    assert_eq!(
        c[0].prompt_tokens.len() + c[0].tokens.len(),
        ids[0].len() + 3
    );
    assert_eq!(c[1], a[1]);
    // From a padded batch, max_length counts the batch's width (ColossalAI's loop runs from
    // it): the shorter row gets no more new tokens than the longer one.
    let mut capped = RolloutRequest::from_padded(&padded_ids, &mask, Sampler::Argmax).expect("pad");
    for r in &mut capped {
        r.max_length = Some(width + 4);
        r.ignore_eos = true;
    }
    let d = block_on(generate_batch(&engine, &capped)).expect("padded max_length");
    assert!(d.iter().all(|r| r.tokens.len() == 4), "{d:?}");
    assert_eq!(
        padded_left_prompts(&d, Some(width), pad).total_len,
        width + 4
    );
    // A wider input keeps its width: the generated ids start at its last column.
    let wide = padded_left_prompts(&d, Some(width + 5), pad);
    assert_eq!(wide.total_len, width + 9);
    assert!((0..d.len()).all(|i| wide.row(i)[width + 5..] == d[i].tokens[..]));
    // Rows of a padded batch sample independently, even when their prompts are the same.
    let same = vec![padded_ids[0].clone(); 4];
    let same_mask = vec![mask[0].clone(); 4];
    let sampler = Sampler::TopK {
        k: 40,
        temperature: 1.0,
    };
    let mut rows = RolloutRequest::from_padded(&same, &same_mask, sampler).expect("pad");
    for r in &mut rows {
        r.max_tokens = 12;
        r.ignore_eos = true;
    }
    let sampled = block_on(generate_batch(&engine, &rows)).expect("sampled rows");
    let distinct: std::collections::HashSet<_> = sampled.iter().map(|r| &r.tokens).collect();
    assert!(distinct.len() > 1, "four identical samples: {sampled:?}");

    // The padded output: prompt + generated, EOS kept, right-padded with the pad id.
    let chat_ids = chat_prompt(&engine).pending().to_vec();
    let reqs = vec![
        RolloutRequest {
            max_tokens: 48,
            ..RolloutRequest::new(chat_ids.clone(), Sampler::Argmax)
        },
        greedy(ids[1].clone().into()),
    ];
    let out = block_on(generate_batch(&engine, &reqs)).expect("chat rollout");
    let Some(StopReason::StopToken(eos)) = out[0].stop else {
        panic!("expected an end of turn: {:?}", out[0].stop);
    };
    let m = padded(&out, pad);
    let rows = [out[0].sequence(), out[1].sequence()];
    assert_eq!(rows[0].last(), Some(&eos));
    assert_eq!(
        rows[0],
        [&chat_ids[..], &out[0].tokens[..], &[eos]].concat()
    );
    assert_eq!(
        (m.batch, m.total_len),
        (2, rows[0].len().max(rows[1].len()))
    );
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(&m.row(i)[..row.len()], &row[..]);
        assert!(m.row(i)[row.len()..].iter().all(|&t| t == pad));
        let mask = &m.attention_mask[i * m.total_len..(i + 1) * m.total_len];
        assert_eq!(mask.iter().filter(|&&v| v == 1).count(), row.len());
    }
    // A rollout's text is the generator's: control tokens (here forced end-of-turn markers)
    // are not rendered, whatever stopped it.
    let forced = RolloutRequest {
        max_tokens: 3,
        ignore_eos: true,
        logit_bias: vec![(eos, 100.0)],
        ..RolloutRequest::new(chat_ids.clone(), Sampler::Argmax)
    };
    let f = block_on(generate_batch(&engine, &[forced])).expect("forced");
    assert_eq!(
        (f[0].tokens.clone(), f[0].text.as_str()),
        (vec![eos; 3], "")
    );
    // ColossalAI's own layout: prompts left-padded to one width, generation from one column.
    let l = padded_left_prompts(&out, None, pad);
    let pw = chat_ids.len().max(ids[1].len());
    for (i, r) in out.iter().enumerate() {
        let row = l.row(i);
        assert!(row[..pw - r.prompt_tokens.len()].iter().all(|&t| t == pad));
        assert_eq!(&row[pw - r.prompt_tokens.len()..pw], &r.prompt_tokens[..]);
        assert_eq!(&row[pw..pw + r.tokens.len()], &r.tokens[..]);
    }
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn sampling_parameters_are_checked_in_the_library() {
    let vocab = 49152;
    for bad in [
        Sampler::from_params(-1.0, None, None, None, vocab),
        Sampler::from_params(f32::NAN, None, None, None, vocab),
        Sampler::from_params(0.7, None, Some(0.0), None, vocab),
        Sampler::from_params(0.7, None, Some(1.5), None, vocab),
        Sampler::from_params(0.7, None, None, Some(-0.1), vocab),
        // A bad filter is refused even at temperature 0.
        Sampler::from_params(0.0, None, Some(2.0), None, vocab),
    ] {
        assert!(bad.is_err(), "{bad:?}");
    }
    assert_eq!(
        Sampler::from_params(0.0, Some(40), Some(0.9), None, vocab).expect("greedy"),
        Sampler::Argmax
    );
    assert_eq!(
        Sampler::from_params(0.8, Some(40), None, None, vocab).expect("top-k"),
        Sampler::Chain {
            k: 40,
            p: 1.0,
            min_p: 0.0,
            temperature: 0.8
        }
    );
    // A generator given a bad sampler fails its first step with a typed error.
    let engine = common::engine_with("smollm2-135m", config());
    let mut ctx = engine.context();
    ctx.fill("Hi").expect("fill");
    let gen = ctx.generate(Sampler::Temperature { temperature: -1.0 });
    assert!(matches!(
        block_on(gen.collect_tokens()),
        Err(Error::Sampler(_))
    ));
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// Each rollout of a batch takes its own generator options — stop strings, `ignore_eos`,
/// `min_tokens`, logit bias, penalties — and gives what one generator with those options
/// gives alone.
#[test]
fn rollouts_take_each_requests_generator_options() {
    let engine = common::engine_with("smollm2-135m", config());
    let chat = chat_prompt(&engine).pending().to_vec();
    let greedy = |max_tokens| RolloutRequest {
        max_tokens,
        ..RolloutRequest::new(chat.clone(), Sampler::Argmax)
    };
    let plain = block_on(generate_batch(&engine, &[greedy(48)])).expect("plain");
    let plain = &plain[0];
    assert!(matches!(plain.stop, Some(StopReason::StopToken(_))));
    let text = plain.text.clone();
    let cut = text.len() / 2;
    let cut = (cut..text.len())
        .find(|&i| text.is_char_boundary(i))
        .expect("a boundary");
    let stop = text[cut..].chars().take(2).collect::<String>();
    let first = plain.tokens[0];
    let reqs = vec![
        RolloutRequest {
            stop_strings: vec![stop.clone()],
            ..greedy(48)
        },
        RolloutRequest {
            ignore_eos: true,
            ..greedy(24)
        },
        RolloutRequest {
            min_tokens: plain.tokens.len() + 3,
            ..greedy(48)
        },
        RolloutRequest {
            logit_bias: vec![(first, f32::NEG_INFINITY)],
            ..greedy(8)
        },
        RolloutRequest {
            // So large that no token of the window (the whole history) comes again.
            penalties: Some(weft::Penalties {
                presence: 1000.0,
                last_n: 0,
                ..weft::Penalties::default()
            }),
            ..greedy(24)
        },
    ];
    let out = block_on(generate_batch(&engine, &reqs)).expect("batch");
    assert_eq!(
        out[0].text,
        text[..text.find(&stop).expect("stop")],
        "{stop:?}"
    );
    assert!(matches!(out[0].stop, Some(StopReason::StopString(_))));
    assert_eq!(out[1].tokens.len(), 24);
    assert!(out[2].tokens.len() > plain.tokens.len() + 2);
    assert_ne!(out[3].tokens[0], first);
    // Each against a generator with the same options, alone.
    let alone = |f: &dyn Fn(weft::Generator<'_>) -> weft::Generator<'_>| {
        let mut ctx = engine.context();
        ctx.fill_tokens(&chat).expect("fill");
        block_on(f(ctx.generate(Sampler::Argmax)).collect_tokens()).expect("alone")
    };
    assert_eq!(out[1].tokens, alone(&|g| g.max_tokens(24).ignore_eos()));
    let min = plain.tokens.len() + 3;
    assert_eq!(out[2].tokens, alone(&|g| g.max_tokens(48).min_tokens(min)));
    assert_eq!(
        out[3].tokens,
        alone(&|g| g.max_tokens(8).logit_bias(&[(first, f32::NEG_INFINITY)]))
    );
    let p = reqs[4].penalties.clone().expect("penalties");
    assert_eq!(
        out[4].tokens,
        alone(&|g| g.max_tokens(24).penalties(p.clone()))
    );
    // `<|im_end|>` is in the prompt: the penalty bans it, so the reply runs to max_tokens.
    assert_eq!(out[4].tokens.len(), 24);
    let mut seen = chat.clone();
    for &t in &out[4].tokens {
        assert!(!seen.contains(&t), "{t} came again: {:?}", out[4].tokens);
        seen.push(t);
    }
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// The tokens a context holds, run and pending.
fn held(ctx: &weft::Context) -> Vec<u32> {
    ctx.tokens().iter().chain(ctx.pending()).copied().collect()
}

/// `fill_chat` with the whole conversation at every turn, on one context: the context holds
/// exactly the new rendering, keeps the computed start it shares with it, and replies as a
/// fresh context does. On Gemma 3, a conversation whose start changed past the sliding window
/// starts over instead of failing.
#[test]
fn fill_chat_carries_a_conversation_turn_after_turn() {
    use weft::Message;
    for model in ["smollm2-135m", "gemma3-270m"] {
        let engine = common::engine_with(model, config());
        let render = |m: &[Message]| {
            let text = engine.chat_template().expect("template").render(m, true);
            engine.tokenize(&text.expect("render"))
        };
        let reply_fresh = |m: &[Message]| {
            let mut c = engine.context();
            c.fill_chat(m).expect("fill_chat");
            block_on(c.generate(Sampler::Argmax).max_tokens(16).collect_text()).expect("fresh")
        };
        let mut ctx = engine.context();
        let mut messages = vec![Message::user("Name a colour.")];
        let mut before = 0;
        for next in ["Another one.", "And a third."] {
            ctx.fill_chat(&messages).expect("fill_chat");
            assert_eq!(held(&ctx), render(&messages), "{model}");
            assert!(
                ctx.len() >= before,
                "{model}: {} of {before} kept",
                ctx.len()
            );
            before = render(&messages).len();
            let reply = block_on(ctx.generate(Sampler::Argmax).max_tokens(16).collect_text())
                .expect("reply");
            assert_eq!(reply, reply_fresh(&messages), "{model}");
            messages.push(Message::assistant(reply));
            messages.push(Message::user(next));
        }
        drop(ctx);
        assert_eq!(engine.metrics().kv_pages_used, 0, "{model}");
    }
    // Gemma 3 keeps a sliding-window layer's keys up to two windows (1,024 tokens) back: a
    // conversation longer than that whose first message changed cannot rewind to its start.
    let engine = common::engine_with("gemma3-270m", config());
    let render = |m: &[Message]| {
        let text = engine.chat_template().expect("template").render(m, true);
        engine.tokenize(&text.expect("render"))
    };
    let mut ctx = engine.context();
    {
        let long = |w: &str| Message::user(format!("{w} {}", "and again ".repeat(700)));
        ctx.fill_chat(&[long("First")]).expect("long");
        block_on(ctx.generate(Sampler::Argmax).max_tokens(8).collect_text()).expect("long reply");
        let other = [long("Second")];
        ctx.fill_chat(&other).expect("a changed start");
        assert_eq!(held(&ctx), render(&other));
        let reply = block_on(ctx.generate(Sampler::Argmax).max_tokens(8).collect_text());
        assert_eq!(reply.expect("reply"), {
            let mut c = engine.context();
            c.fill_chat(&other).expect("fill_chat");
            block_on(c.generate(Sampler::Argmax).max_tokens(8).collect_text()).expect("fresh")
        });
    }
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}
