//! Input from embeddings (`Forward::input_embeds`, `Context::fill_embeds`,
//! `prefill_from_embeds`) on the real models: the model's own input vectors reproduce the ids
//! bit for bit, alone, mixed with ids in one pass and before a generation; an additive
//! attention bias agrees with the equivalent boolean mask; vectors never enter the prefix
//! cache; bad shapes and values are typed errors that leave nothing allocated.

use crate::common;

use weft::{block_on, Brle, Engine, EngineConfig, Error, Logits, Sampler};

const TEXT: &str = "The loom is one of the oldest machines people have built. A weaver \
stretches the warp threads tight on a frame and passes the weft thread over and under them.";

const MODELS: [&str; 2] = ["smollm2-135m", "gemma3-270m"];

fn engine(model: &str) -> Engine {
    common::engine_with(
        model,
        EngineConfig {
            n_threads: 2,
            kv_tokens: 4096,
            ..EngineConfig::default()
        },
    )
}

/// The prompt's ids as a fresh context runs them (with BOS where the model wants one).
fn prompt_ids(engine: &Engine, text: &str) -> Vec<u32> {
    let mut ctx = engine.context();
    ctx.fill(text).expect("fill");
    ctx.pending().to_vec()
}

/// Logits after every token of `ids`, run from the ids in one pass.
fn logits_of_ids(engine: &Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut ctx = engine.context();
    ctx.fill_tokens(ids).expect("fill");
    let mut fwd = ctx.forward();
    let hs: Vec<_> = (0..ids.len()).map(|i| fwd.probe(i, Logits)).collect();
    let out = block_on(fwd.execute()).expect("pass");
    hs.into_iter()
        .map(|h| out.logits(h).expect("logits").to_vec())
        .collect()
}

#[test]
fn own_vectors_give_bit_identical_logits() {
    for model in MODELS {
        let engine = engine(model);
        let ids = prompt_ids(&engine, TEXT);
        let rows = engine.input_embeddings(&ids).expect("input embeddings");
        assert_eq!(rows.len(), ids.len() * engine.info().n_embd);
        let reference = logits_of_ids(&engine, &ids);

        // Every token from its vector (placeholder ids: the model must not read them).
        let mut ctx = engine.context();
        let placeholders = vec![0; ids.len()];
        let last = block_on(ctx.prefill_from_embeds(&placeholders, &rows, None)).expect("prefill");
        assert!(
            last == *reference.last().unwrap(),
            "{model}: logits from the model's own vectors differ from the ids'"
        );
        assert_eq!(ctx.tokens(), placeholders.as_slice());

        // Gemma scales its embeddings: unscaled rows are not what its first block reads.
        if model.starts_with("gemma") {
            let scale = (engine.info().n_embd as f32).sqrt();
            let unscaled: Vec<f32> = rows.iter().map(|v| v / scale).collect();
            let mut ctx = engine.context();
            let other =
                block_on(ctx.prefill_from_embeds(&placeholders, &unscaled, None)).expect("prefill");
            assert!(other != last, "{model}: unscaled rows gave the same logits");
        }
    }
}

#[test]
fn a_pass_mixing_vectors_and_ids_equals_the_ids_only_pass() {
    for model in MODELS {
        let engine = engine(model);
        let ids = prompt_ids(&engine, TEXT);
        let reference = logits_of_ids(&engine, &ids);
        let d = engine.info().n_embd;
        // Ids, then vectors for a middle stretch, then ids again, all in one pass.
        let (a, b) = (ids.len() / 3, 2 * ids.len() / 3);
        let rows = engine.input_embeddings(&ids[a..b]).expect("rows");
        assert_eq!(rows.len(), (b - a) * d);
        let mut ctx = engine.context();
        ctx.fill_tokens(&ids[..a]).expect("fill");
        let mut fwd = ctx.forward();
        let positions: Vec<u32> = (a as u32..b as u32).collect();
        fwd.input_embeds(&rows, &positions); // recorded as id 0: the model must not read it
        fwd.input(&ids[b..]);
        assert_eq!(fwd.len(), ids.len());
        let hs: Vec<_> = (0..ids.len()).map(|i| fwd.probe(i, Logits)).collect();
        let out = block_on(fwd.execute()).expect("pass");
        for (i, h) in hs.into_iter().enumerate() {
            assert!(
                out.logits(h).unwrap() == reference[i].as_slice(),
                "{model}: logits after token {i} differ in the mixed pass"
            );
        }
        let mut recorded = ids.clone();
        recorded[a..b].fill(0);
        assert_eq!(ctx.tokens(), recorded.as_slice());
    }
}

#[test]
fn generation_after_vectors_equals_generation_after_ids() {
    for model in MODELS {
        let engine = engine(model);
        let ids = prompt_ids(&engine, TEXT);
        let rows = engine.input_embeddings(&ids).expect("rows");
        let generate = |ctx: &mut weft::Context| {
            let gen = ctx.generate(Sampler::Argmax).max_tokens(16).ignore_eos();
            block_on(gen.collect_tokens()).expect("generate")
        };
        let mut by_ids = engine.context();
        by_ids.fill_tokens(&ids).unwrap();
        let expected = generate(&mut by_ids);
        assert_eq!(expected.len(), 16);

        // Vectors filled, run by the generator's first step.
        let placeholders = vec![0; ids.len()];
        let mut ctx = engine.context();
        ctx.fill_embeds(&placeholders, &rows, None).unwrap();
        assert_eq!(generate(&mut ctx), expected, "{model}: after fill_embeds");

        // Vectors run first: the generator reruns the last one from its vector, not its id.
        let mut ctx = engine.context();
        block_on(ctx.prefill_from_embeds(&placeholders, &rows, None)).unwrap();
        assert_eq!(
            generate(&mut ctx),
            expected,
            "{model}: after prefill_from_embeds"
        );

        // A fork carries the vectors along; eviction recomputes them from the vectors.
        let mut ctx = engine.context();
        block_on(ctx.prefill_from_embeds(&placeholders, &rows, None)).unwrap();
        let mut fork = ctx.fork().unwrap();
        assert_eq!(generate(&mut fork), expected, "{model}: fork");
        ctx.evict().unwrap();
        assert_eq!(generate(&mut ctx), expected, "{model}: after evict");
    }
}

#[test]
fn attention_bias_agrees_with_masks() {
    for model in MODELS {
        let engine = engine(model);
        let ids = prompt_ids(&engine, TEXT);
        let n = ids.len();
        let rows = engine.input_embeddings(&ids).unwrap();
        let reference = logits_of_ids(&engine, &ids);
        let last = |bias: &[f32]| {
            let mut ctx = engine.context();
            block_on(ctx.prefill_from_embeds(&ids, &rows, Some(bias))).expect("prefill")
        };
        // Zero on and below the diagonal, -inf above it: causal attention exactly.
        let causal: Vec<f32> = (0..n * n)
            .map(|k| {
                if k % n <= k / n {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        assert!(last(&causal) == reference[n - 1], "{model}: causal bias");

        // Hiding tokens 1..4 from everyone after them with -inf equals the boolean mask.
        let hide = |j: usize, i: usize| i > j && (1..4).contains(&j);
        let hidden: Vec<f32> = (0..n * n)
            .map(|k| {
                let (i, j) = (k / n, k % n);
                if j > i || hide(j, i) {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mut ctx = engine.context();
        ctx.fill_tokens(&ids).unwrap();
        let masks: Vec<Brle> = (0..n)
            .map(|i| Brle::from_bools(&(0..=i).map(|j| !hide(j, i)).collect::<Vec<_>>()))
            .collect();
        let mut fwd = ctx.forward();
        fwd.attention_mask(masks);
        let h = fwd.probe(n - 1, Logits);
        let masked = block_on(fwd.execute()).unwrap().logits(h).unwrap().to_vec();
        assert!(
            masked != reference[n - 1],
            "{model}: the mask changed nothing"
        );
        assert!(
            last(&hidden) == masked,
            "{model}: -inf bias != boolean mask"
        );

        // A very negative finite bias hides as well; a mild one changes the result.
        let far: Vec<f32> = hidden
            .iter()
            .map(|&b| if b == f32::NEG_INFINITY { -1e30 } else { b })
            .enumerate()
            .map(|(k, b)| if k % n > k / n { f32::NEG_INFINITY } else { b })
            .collect();
        assert!(last(&far) == masked, "{model}: -1e30 bias != boolean mask");
        let mild: Vec<f32> = causal
            .iter()
            .enumerate()
            .map(|(k, &b)| if k % n == 0 && k / n > 0 { b + 2.0 } else { b })
            .collect();
        let shifted = last(&mild);
        assert!(
            shifted != reference[n - 1],
            "{model}: a bias of +2 changed nothing"
        );
        assert!(shifted.iter().all(|v| v.is_finite()));

        // Tokens that have bias rows from fill_embeds take no second bias from the pass: an
        // error (the pass's rows silently replaced them), the context as it was.
        let mut ctx = engine.context();
        ctx.fill_embeds(&ids, &rows, Some(&hidden)).unwrap();
        let mut fwd = ctx.forward();
        fwd.attention_bias((0..n).map(|i| vec![0.0; i + 1]).collect());
        let e = block_on(fwd.execute()).unwrap_err();
        assert!(matches!(e, weft::Error::AttentionBias { .. }), "{e}");
        assert_eq!((ctx.len(), ctx.pending().len()), (0, n));
        assert!(
            block_on(ctx.flush_logits()).unwrap() == masked,
            "{model}: after the error"
        );
    }
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0) as u32
}

/// A generation that starts after the last token already ran gets its logits by running it
/// again: under the attention it first ran with (a bias row, a mask), not plain causal
/// attention. One it cannot run again as it ran (at a position of its own) is a typed error.
#[test]
fn generation_after_a_masked_last_token_starts_from_its_logits() {
    for model in MODELS {
        let engine = engine(model);
        let ids = prompt_ids(&engine, TEXT);
        let n = ids.len();
        let rows = engine.input_embeddings(&ids).unwrap();
        let reference = logits_of_ids(&engine, &ids);
        // The last token sees the first one and itself; the others are causal.
        let sees = |i: usize, j: usize| j <= i && (i < n - 1 || j == 0 || j == n - 1);
        let bias: Vec<f32> = (0..n * n)
            .map(|k| match sees(k / n, k % n) {
                true => 0.0,
                false => f32::NEG_INFINITY,
            })
            .collect();
        let first = |ctx: &mut weft::Context| {
            let gen = ctx.generate(Sampler::Argmax).max_tokens(1).ignore_eos();
            block_on(gen.collect_tokens()).map(|t| t[0])
        };
        let mut ctx = engine.context();
        let biased = block_on(ctx.prefill_from_embeds(&ids, &rows, Some(&bias))).unwrap();
        assert_ne!(
            argmax(&biased),
            argmax(&reference[n - 1]),
            "{model}: the bias must change the first token for this test to mean anything"
        );
        assert_eq!(first(&mut ctx).unwrap(), argmax(&biased), "{model}: bias");

        let mut ctx = engine.context();
        ctx.fill_tokens(&ids).unwrap();
        let masks: Vec<Brle> = (0..n)
            .map(|i| Brle::from_bools(&(0..=i).map(|j| sees(i, j)).collect::<Vec<_>>()))
            .collect();
        let mut fwd = ctx.forward();
        fwd.attention_mask(masks);
        let h = fwd.probe(n - 1, Logits);
        let masked = block_on(fwd.execute()).unwrap().logits(h).unwrap().to_vec();
        assert_eq!(first(&mut ctx).unwrap(), argmax(&masked), "{model}: mask");

        let mut ctx = engine.context();
        ctx.fill_tokens(&ids[..n - 1]).unwrap();
        let mut fwd = ctx.forward();
        fwd.input_at(&ids[n - 1..], &[n as u32 + 50]);
        block_on(fwd.execute()).unwrap();
        let e = first(&mut ctx).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{model}: {e}");
        assert_eq!((ctx.len(), ctx.pending().len()), (n, 0), "{model}");
    }
}

#[test]
fn vectors_never_enter_the_prefix_cache() {
    let engine = engine("smollm2-135m");
    let ids = prompt_ids(&engine, &format!("{TEXT} {TEXT} {TEXT}"));
    assert!(ids.len() > 2 * weft::kv::PAGE_SIZE);
    let rows = engine.input_embeddings(&ids).unwrap();
    let zeros = vec![0u32; ids.len()];
    // The vectors' pages, recorded under placeholder ids, must not serve those ids.
    {
        let mut ctx = engine.context();
        block_on(ctx.prefill_from_embeds(&zeros, &rows, None)).unwrap();
        let mut ctx = engine.context();
        let before = engine.metrics().prefix_hit_tokens;
        block_on(ctx.prefill(&zeros)).unwrap();
        assert_eq!(
            engine.metrics().prefix_hit_tokens,
            before,
            "vector pages reused"
        );
        // The cache works here: the same ids again are found.
        let mut again = engine.context();
        block_on(again.prefill(&zeros)).unwrap();
        assert!(engine.metrics().prefix_hit_tokens > before);
    }
    // Nor do cached pages of the ids serve a pass that starts with vectors.
    let reference = logits_of_ids(&engine, &ids);
    let mut ctx = engine.context();
    let other: Vec<f32> = rows.iter().map(|v| v * 0.5).collect();
    let before = engine.metrics().prefix_hit_tokens;
    let got = block_on(ctx.prefill_from_embeds(&ids, &other, None)).unwrap();
    assert_eq!(engine.metrics().prefix_hit_tokens, before);
    assert!(got != reference[ids.len() - 1]);
}

#[test]
fn bad_vectors_and_biases_are_typed_errors_and_leak_nothing() {
    let engine = engine("smollm2-135m");
    let d = engine.info().n_embd;
    let ids = engine.tokenize(" hello there");
    let rows = engine.input_embeddings(&ids).unwrap();
    let mut ctx = engine.context();
    let short = &rows[..rows.len() - 1];
    assert!(matches!(
        ctx.fill_embeds(&ids, short, None),
        Err(Error::InputEmbeds { .. })
    ));
    let mut nan = rows.clone();
    nan[d + 3] = f32::NAN;
    let err = ctx.fill_embeds(&ids, &nan, None).unwrap_err();
    assert!(matches!(err, Error::InputEmbeds { .. }), "{err}");
    assert!(err.to_string().contains("vector 1"), "{err}");
    let n = ids.len();
    let see_later = vec![0.0; n * n];
    let err = ctx.fill_embeds(&ids, &rows, Some(&see_later)).unwrap_err();
    assert!(matches!(err, Error::AttentionBias { .. }), "{err}");
    assert!(matches!(
        ctx.fill_embeds(&ids, &rows, Some(&[0.0])),
        Err(Error::AttentionBias { .. })
    ));
    assert!(matches!(
        ctx.fill_embeds(&[u32::MAX], &rows[..d], None),
        Err(Error::TokenOutOfVocab { .. })
    ));
    assert!(matches!(
        engine.input_embeddings(&[u32::MAX]),
        Err(Error::TokenOutOfVocab { .. })
    ));
    assert!(ctx.is_empty(), "a refused fill left something behind");
    // Forward: a wrong-sized vector fails execute before anything runs.
    let mut fwd = ctx.forward();
    fwd.input_embeds(short, &[0, 1]);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::InputEmbeds { .. })
    ));
    assert_eq!(ctx.len(), 0);
    // A context holding vectors cannot be snapshotted (snapshots do not record them).
    block_on(ctx.prefill_from_embeds(&ids, &rows, None)).unwrap();
    assert!(matches!(ctx.snapshot(), Err(Error::Config(_))));
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0, "pages leaked");
}

/// Largest change of the last position's logits when every input vector moves by `eps` (a
/// fixed pattern of signs).
fn logit_change(engine: &Engine, ids: &[u32], eps: f32) -> f32 {
    let rows = engine.input_embeddings(ids).expect("input embeddings");
    let moved: Vec<f32> = rows
        .iter()
        .enumerate()
        .map(|(i, v)| v + if i % 3 == 0 { eps } else { -eps })
        .collect();
    let last = |rows: &[f32]| {
        let mut ctx = engine.context();
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let mut fwd = ctx.forward();
        fwd.input_embeds(rows, &positions);
        let h = fwd.probe(ids.len() - 1, Logits);
        block_on(fwd.execute()).expect("pass").get(h).to_vec()
    };
    let (a, b) = (last(&rows), last(&moved));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A GGUF file opened with `checkpoint_weights` F32 has its quantized matrices widened: its
/// matrices multiply the `f32` activations (quantized ones round them to 8 bits per block),
/// so an input moved by 1e-6 moves the logits by thousandths (the f16 KV cache still rounds),
/// where the quantized file jumps by a rounding step, tenths (measured on the Xeon 207: 0.0035
/// against 0.59). Finite differences and zeroth-order training need the former.
#[test]
fn a_gguf_widened_to_f32_moves_smoothly_under_tiny_input_changes() {
    let quantized = engine("smollm2-135m");
    let widened = common::engine_with(
        "smollm2-135m",
        EngineConfig {
            n_threads: 2,
            kv_tokens: 4096,
            checkpoint_weights: weft::checkpoint::WeightType::F32,
            ..EngineConfig::default()
        },
    );
    let ids = prompt_ids(&quantized, TEXT);
    let (q, w) = (
        logit_change(&quantized, &ids, 1e-6),
        logit_change(&widened, &ids, 1e-6),
    );
    eprintln!("an input moved by 1e-6: logits move by {q} (Q4_1), {w} (widened to F32)");
    assert!(w < 0.02 && w * 10.0 < q, "quantized {q}, widened {w}");
    // That it is still the same model: greedy_reference.rs holds it to llama.cpp's logits.
}
