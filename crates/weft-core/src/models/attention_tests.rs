//! Tests of [`super::attention::attention`] on a small cache of random keys: a full-attention
//! layer and a sliding-window layer, with the pages behind the window released as the runner
//! releases them. A query's output must have the same bits as a decode (one query, the chunks
//! split over the threads) and inside a prefill batch (blocks of queries walking the chunks),
//! with one thread or two, and match a float64 softmax over the keys it sees.

use half::f16;

use super::attention::attention;
use super::{BatchToken, SlotMask};
use crate::kernels::testutil::Rng;
use crate::kv::{KvCache, KvLayout, SeqId};
use crate::threadpool::ThreadPool;

const N_KV: usize = 2;
const GROUP: usize = 2;
const D: usize = 32;
const WINDOW: usize = 64;
/// Tokens in the sequence: two chunks of the full layer, and many windows, so the window layer
/// has released pages and holds others that no query at the end sees.
const N: usize = 600;

struct Fixture {
    kv: KvCache,
    seq: SeqId,
    /// Each layer's keys and values as written, `N × N_KV × D` each.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

fn fixture() -> Fixture {
    // Layer 0 with full attention, layer 1 with the window.
    let layout = KvLayout {
        n_kv_heads: N_KV,
        head_dim: D,
        ..crate::kv::tests::layout(Some(WINDOW))
    };
    let mut kv = KvCache::new(layout, N).expect("cache");
    let seq = kv.new_sequence();
    let mut rng = Rng::new(11);
    let (mut keys, mut values) = (vec![], vec![]);
    for _ in 0..2 {
        keys.push(rng.f32s(N * N_KV * D, 1.0));
        values.push(rng.f32s(N * N_KV * D, 1.0));
    }
    // Appended and written a token at a time, released behind the window after each, as a
    // generation does.
    for slot in 0..N {
        kv.append(seq, &[slot as u32]).expect("append");
        for layer in 0..2 {
            let row = slot * N_KV * D..(slot + 1) * N_KV * D;
            let (k, v) = (&keys[layer][row.clone()], &values[layer][row]);
            kv.write(layer, seq, slot, k, v).expect("write");
        }
        kv.release_behind_window(seq);
    }
    Fixture {
        kv,
        seq,
        keys,
        values,
    }
}

fn token(seq: SeqId, slot: usize) -> BatchToken {
    BatchToken {
        token: 0,
        pos: slot as u32,
        seq,
        slot,
        logits: true,
        hidden: false,
        mask: None,
        lora: None,
        embed: None,
    }
}

/// Attention of the queries at `slots` (their query rows `q`, `N_KV·GROUP × D` each) in `layer`.
fn run(f: &Fixture, pool: &ThreadPool, layer: usize, slots: &[usize], q: &[f32]) -> Vec<f32> {
    run_masked(f, pool, layer, slots, &[], q)
}

/// [`run`] where the query at `slots[i]` attends as `masks[i]` says (causal when `masks` is
/// empty).
fn run_masked(
    f: &Fixture,
    pool: &ThreadPool,
    layer: usize,
    slots: &[usize],
    masks: &[SlotMask],
    q: &[f32],
) -> Vec<f32> {
    let n_head = N_KV * GROUP;
    let tokens: Vec<BatchToken> = (slots.iter().enumerate())
        .map(|(i, &s)| BatchToken {
            mask: (!masks.is_empty()).then_some(i as u32),
            ..token(f.seq, s)
        })
        .collect();
    let mut out = vec![0f32; slots.len() * n_head * D];
    let scale = 1.0 / (D as f32).sqrt();
    attention(
        pool, &f.kv, layer, &tokens, masks, q, n_head, D, scale, &mut out,
    )
    .expect("attention");
    out
}

/// A float64 softmax over the f16-rounded keys and values the query at `slot` sees.
fn reference(f: &Fixture, layer: usize, slot: usize, q: &[f32]) -> Vec<f32> {
    let first = match layer {
        1 => (slot + 1).saturating_sub(WINDOW),
        _ => 0,
    };
    reference_over(f, layer, first..slot + 1, q)
}

/// A float64 softmax of one query's rows `q` over the f16-rounded keys and values of `seen`.
fn reference_over(f: &Fixture, layer: usize, seen: std::ops::Range<usize>, q: &[f32]) -> Vec<f32> {
    let round = |x: f32| f64::from(f16::from_f32(x).to_f32());
    let (first, slot) = (seen.start, seen.end - 1);
    let scale = 1.0 / (D as f64).sqrt();
    let mut out = vec![0f32; N_KV * GROUP * D];
    for h in 0..N_KV * GROUP {
        let kvh = h / GROUP;
        let qh = &q[h * D..(h + 1) * D];
        let at = |s: usize| (s * N_KV + kvh) * D;
        let scores: Vec<f64> = (first..=slot)
            .map(|s| {
                let k = &f.keys[layer][at(s)..at(s) + D];
                qh.iter()
                    .zip(k)
                    .map(|(&a, &b)| f64::from(a) * round(b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = w.iter().sum();
        for t in 0..D {
            let v: f64 = (first..=slot)
                .zip(&w)
                .map(|(s, w)| w * round(f.values[layer][at(s) + t]))
                .sum();
            out[h * D + t] = (v / sum) as f32;
        }
    }
    out
}

#[test]
fn decode_and_batch_rows_have_the_same_bits_and_match_float64() {
    let f = fixture();
    let mut rng = Rng::new(12);
    let row = N_KV * GROUP * D;
    // The last 8 tokens as one prefill batch, and each alone (a decode).
    let slots: Vec<usize> = (N - 8..N).collect();
    let q = rng.f32s(slots.len() * row, 1.0);
    for layer in 0..2 {
        let mut outputs = Vec::new();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            outputs.push(run(&f, &pool, layer, &slots, &q));
            for (i, &s) in slots.iter().enumerate() {
                let alone = run(&f, &pool, layer, &[s], &q[i * row..(i + 1) * row]);
                outputs.push([vec![0f32; i * row], alone, vec![0f32; (7 - i) * row]].concat());
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let batch = &outputs[0];
        for (k, o) in outputs.iter().enumerate() {
            let i = k % 9;
            let rows = if i == 0 { 0..8 } else { i - 1..i };
            for r in rows {
                let (a, b) = (&batch[r * row..(r + 1) * row], &o[r * row..(r + 1) * row]);
                assert_eq!(bits(a), bits(b), "layer {layer}: output {k}, query {r}");
            }
        }
        for (i, &s) in slots.iter().enumerate() {
            let want = reference(&f, layer, s, &q[i * row..(i + 1) * row]);
            for (&a, &b) in batch[i * row..(i + 1) * row].iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "layer {layer} slot {s}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn masks_may_see_later_slots_bidirectionally() {
    let f = fixture();
    let mut rng = Rng::new(13);
    let row = N_KV * GROUP * D;
    // Queries that see slots after their own (the rest of a block a pass fills at once): on
    // the full layer from far behind to far ahead, across pages and chunks; on the window
    // layer a block at the end, inside the window on both sides.
    for (layer, slots, seen) in [
        (0, vec![300, 301, 420], 250..460),
        (1, vec![560, 590], 550..N),
    ] {
        let mask = SlotMask::new((0..N).map(|s| seen.contains(&s)).collect());
        let masks = vec![mask; slots.len()];
        let q = rng.f32s(slots.len() * row, 1.0);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut first: Option<Vec<f32>> = None;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let batch = run_masked(&f, &pool, layer, &slots, &masks, &q);
            for (i, &s) in slots.iter().enumerate() {
                let q = &q[i * row..(i + 1) * row];
                let alone = run_masked(&f, &pool, layer, &[s], &masks[..1], q);
                let got = &batch[i * row..(i + 1) * row];
                assert_eq!(
                    bits(got),
                    bits(&alone),
                    "layer {layer} slot {s}, {threads} threads"
                );
                let want = reference_over(&f, layer, seen.clone(), q);
                for (&a, &b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "layer {layer} slot {s}: {a} vs {b}"
                    );
                }
            }
            let first = first.get_or_insert_with(|| batch.clone());
            assert_eq!(
                bits(first),
                bits(&batch),
                "layer {layer}: 1 thread vs {threads}"
            );
        }
    }
}
