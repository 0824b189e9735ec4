//! Attention masks that look ahead: a block of a pass whose tokens attend to each other both
//! ways (a prefix-LM, Gemma 3's image tokens), on the real models.

use crate::common;

use weft::checkpoint::WeightType;
use weft::{block_on, Brle, Context, EngineConfig, Error, Logits};

const TEXT: &str = "The quick brown fox jumps over the lazy dog because it wanted to see";
/// Tokens `PREFIX..PREFIX + BLOCK` form the bidirectional block.
const PREFIX: usize = 2;
const BLOCK: usize = 6;

fn config(step_tokens: usize, weights: WeightType) -> EngineConfig {
    EngineConfig {
        n_threads: 2,
        kv_tokens: 1024,
        step_tokens,
        checkpoint_weights: weights,
        ..EngineConfig::default()
    }
}

/// The masks of a pass of `n` tokens whose slots `PREFIX..PREFIX + BLOCK` hold the block:
/// those see every slot up to the block's end, the others are causal over slots.
fn masks(n: usize) -> Vec<Brle> {
    let block = PREFIX..PREFIX + BLOCK;
    (0..n)
        .map(|s| match block.contains(&s) {
            true => Brle::all(block.end, true),
            false => Brle::all(s + 1, true),
        })
        .collect()
}

/// Runs `ids` at `positions` in one pass with [`masks`] (or causally), returning the logits
/// at every slot.
fn run(ctx: &mut Context, ids: &[u32], positions: &[u32], masked: bool) -> Vec<Vec<f32>> {
    let mut fwd = ctx.forward();
    fwd.input_at(ids, positions);
    if masked {
        fwd.attention_mask(masks(ids.len()));
    }
    let probes: Vec<_> = (0..ids.len()).map(|i| fwd.probe(i, Logits)).collect();
    let out = block_on(fwd.execute()).expect("pass");
    probes
        .into_iter()
        .map(|p| out.logits(p).expect("logits").to_vec())
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs the block in its natural slot order, then reversed (each token at its own position,
/// so every token sees the same tokens), causally, and chunked 3 tokens a step; returns how
/// far the two orders' logits are apart and how far the block's first token moved from its
/// causal logits.
fn check(name: &str, weights: WeightType) -> (f32, f32) {
    let engine = common::engine_with(name, config(512, weights));
    let ids = engine.tokenizer().encode(TEXT, true, true);
    let n = ids.len();
    assert!(n > PREFIX + BLOCK + 2, "{name}: {n} tokens");
    let positions: Vec<u32> = (0..n as u32).collect();
    let mut ctx = engine.context();
    let natural = run(&mut ctx, &ids, &positions, true);
    // A following step sees the block as the pass wrote it.
    let next = block_on(ctx.decode(ids[0])).expect("decode after the block");
    assert_eq!(next.len(), engine.info().vocab_size);
    drop(ctx);
    // The block in reverse slot order: its first slots see the rest by looking ahead.
    let mut order: Vec<usize> = (0..n).collect();
    order[PREFIX..PREFIX + BLOCK].reverse();
    let r_ids: Vec<u32> = order.iter().map(|&i| ids[i]).collect();
    let r_pos: Vec<u32> = order.iter().map(|&i| positions[i]).collect();
    let reversed = run(&mut engine.context(), &r_ids, &r_pos, true);
    let causal = run(&mut engine.context(), &ids, &positions, false);
    let orders = (order.iter().enumerate())
        .map(|(slot, &i)| max_diff(&natural[i], &reversed[slot]))
        .fold(0.0, f32::max);
    let moved = max_diff(&natural[PREFIX], &causal[PREFIX]);
    let moved_last = max_diff(&natural[n - 1], &causal[n - 1]);
    println!(
        "{name} ({weights:?} if a checkpoint): natural vs reversed block, max |Δlogit| {orders:.2e}; against \
         causal: the block's first token {moved:.3}, the last token {moved_last:.3}"
    );
    assert!(moved_last > 0.05, "{name}: the tail did not see the block");
    // The prefix before the block is causal and unchanged, bit for bit.
    assert_eq!(natural[..PREFIX], causal[..PREFIX], "{name}: prefix");
    // Chunked prefill, 3 tokens a step: the block runs whole, with the same bits.
    let chunked_engine = common::engine_with(name, config(3, weights));
    let chunked = run(&mut chunked_engine.context(), &ids, &positions, true);
    assert!(
        chunked == natural,
        "{name}: chunked prefill changed the block"
    );
    for e in [&engine, &chunked_engine] {
        let m = e.metrics();
        assert_eq!(m.kv_pages_used, 0, "{name}: KV pages leaked: {m:?}");
    }
    (orders, moved)
}

/// SmolLM2 widened to F32: its matrices take the activations as they are, so the two slot
/// orders differ by rounding only (the quantized file rounds activations to 8 bits per block,
/// and one step of that rounding moves its logits by tenths, see input_embeds.rs).
#[test]
fn a_block_attends_both_ways_whatever_its_slot_order() {
    let (orders, moved) = check("smollm2-135m", WeightType::F32);
    assert!(orders < 0.02, "the slot orders differ by {orders}");
    assert!(moved > 1.0, "the block did not look ahead ({moved})");
}

/// The files as they are, Gemma 3's sliding-window layers included: the orders agree far
/// closer than the block moved away from causal (measured on the Xeon 207: 0.74 against 11.3
/// for SmolLM2, 2.5 against 14.4 for Gemma 3).
#[test]
fn a_block_attends_both_ways_on_the_quantized_models() {
    for name in ["smollm2-135m", "gemma3-270m"] {
        let (orders, moved) = check(name, WeightType::default());
        assert!(
            orders * 3.0 < moved,
            "{name}: orders {orders}, moved {moved}"
        );
    }
}

#[test]
fn masks_reach_at_most_the_end_of_their_pass() {
    let engine = common::engine_with("smollm2-135m", config(512, WeightType::default()));
    let mut ctx = engine.context();
    block_on(ctx.prefill(&[1, 2, 3])).expect("prefill");
    // A pass of 2 after 3 tokens: masks of 4 or 5 slots for its first token, 5 for its second.
    let mut fwd = ctx.forward();
    fwd.input(&[4, 5])
        .attention_mask(vec![Brle::all(6, true), Brle::all(5, true)]);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::MaskLength {
            expected: 5,
            got: 6,
            ..
        })
    ));
    let mut fwd = ctx.forward();
    fwd.input(&[4, 5])
        .attention_bias(vec![vec![0.0; 5], vec![0.0; 4]]);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(Error::MaskLength {
            expected: 5,
            got: 4,
            ..
        })
    ));
    assert_eq!(ctx.len(), 3, "a refused pass leaves the context as it was");
    // The first token of the pass sees the second, through a mask or a bias row alone.
    let first_logits = |ctx: &mut weft::Context, how: &str| {
        let mut fwd = ctx.forward();
        fwd.input(&[4, 5]);
        match how {
            "mask" => fwd.attention_mask(vec![Brle::all(5, true); 2]),
            "bias" => fwd.attention_bias(vec![vec![0.0; 5]; 2]),
            _ => &mut fwd,
        };
        let h = fwd.probe(0, Logits);
        let out = block_on(fwd.execute()).expect("pass");
        let logits = out.logits(h).expect("logits").to_vec();
        ctx.truncate(3).expect("rewind");
        logits
    };
    let causal = first_logits(&mut ctx, "causal");
    let (mask, bias) = (
        first_logits(&mut ctx, "mask"),
        first_logits(&mut ctx, "bias"),
    );
    assert!(
        max_diff(&mask, &causal) > 0.5,
        "the mask did not look ahead"
    );
    assert!(
        max_diff(&bias, &mask) < 1e-3,
        "a bias row of zeros is the mask"
    );
    assert_eq!(ctx.len(), 3);
    drop(ctx);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}
