//! A micro-benchmark of a decode's attention through [`super::attention::attention`] — the
//! chunked split over the pool's threads, its merges and page hints — over a KV cache of random
//! keys and values (ignored by default):
//! `cargo test --release -p weft-core --lib models::attention_bench -- --ignored --nocapture`.
//!
//! Set against `kernels::bench::bench_attention_decode` (the kernels alone on one thread), it
//! tells what the real path adds. `WEFT_BENCH_THREADS=1,2` picks the thread counts.

use std::time::Duration;

use super::attention::attention;
use super::BatchToken;
use crate::kernels::bench::{bench_threads, time};
use crate::kernels::testutil::Rng;
use crate::kv::{GroupSpec, KvCache, KvLayout, KvType};
use crate::threadpool::ThreadPool;

/// Seconds per layer of one decode's attention at `depth` keys, `n_kv` KV heads of `group`
/// query heads of `d` values, in layers of full attention or with a sliding `window`, the
/// layers (each its own pages) used in turn so the KV comes from memory.
fn decode_attention(
    pool: &ThreadPool,
    (n_kv, group, d): (usize, usize, usize),
    window: Option<usize>,
    depth: usize,
) -> f64 {
    let per_layer = 2 * (depth + 1) * n_kv * KvType::F16.row_bytes(d);
    let layers = (256usize << 20).div_ceil(per_layer);
    let layout = KvLayout {
        n_layers: layers,
        n_kv_heads: n_kv,
        head_dim: d,
        groups: vec![GroupSpec {
            layers: (0..layers).collect(),
            window,
        }],
        kv_type: KvType::F16,
    };
    let mut kv = KvCache::new(layout, depth + 1).expect("cache");
    let seq = kv.new_sequence();
    let positions: Vec<u32> = (0..=depth as u32).collect();
    kv.append(seq, &positions).expect("append");
    let mut rng = Rng::new(7);
    for layer in 0..layers {
        for slot in 0..=depth {
            let (k, v) = (rng.f32s(n_kv * d, 1.0), rng.f32s(n_kv * d, 1.0));
            kv.write(layer, seq, slot, &k, &v).expect("write");
        }
    }
    kv.release_behind_window(seq);
    let n_head = n_kv * group;
    let q = rng.f32s(n_head * d, 1.0);
    let mut out = vec![0f32; n_head * d];
    let token = BatchToken {
        token: 0,
        pos: depth as u32,
        seq,
        slot: depth,
        logits: true,
        hidden: false,
        mask: None,
        lora: None,
        embed: None,
    };
    let scale = 1.0 / (d as f32).sqrt();
    let mut layer = 0;
    time(Duration::from_millis(1500), || {
        attention(
            pool,
            &kv,
            layer,
            &[token],
            &[],
            &q,
            n_head,
            d,
            scale,
            &mut out,
        )
        .expect("attention");
        layer = (layer + 1) % layers;
    })
}

#[test]
#[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
fn bench_decode_attention() {
    let threads = bench_threads();
    // SmolLM2's layer shape (3 KV heads of 3 query heads, 64 values), Gemma 3's global
    // layers' (1 KV head of 4 query heads, 256 values) and its local layers' (the same with a
    // 512-key window: a decode at depth 4,096 reads 512 keys).
    let layers = [
        ("smollm2", (3, 3, 64), None),
        ("gemma3", (1, 4, 256), None),
        ("gemma3 local", (1, 4, 256), Some(512)),
    ];
    for (name, shape, window) in layers {
        let (n_kv, _, d) = shape;
        for &nt in &threads {
            let pool = ThreadPool::new(nt);
            for depth in [512, 4096] {
                let t = decode_attention(&pool, shape, window, depth);
                let keys = (window.unwrap_or(depth).min(depth) * n_kv) as f64;
                let bytes = 2.0 * keys * KvType::F16.row_bytes(d) as f64;
                println!(
                    "decode attention, {name} layer, {nt} thr, depth {depth}: {:.1} us \
                     ({:.2} ns/key and KV head, {:.1} GB/s)",
                    t * 1e6,
                    t * 1e9 / keys,
                    bytes / t / 1e9
                );
            }
        }
    }
}
