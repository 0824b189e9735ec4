//! The KV cache's storage is mapped by the OS only when written: a large, mostly unused cache
//! must not cost its full size in resident memory (peak RSS is one of the speed-table figures).

#![cfg(target_os = "linux")]

use weft_core::kv::{GroupSpec, KvCache, KvLayout, KvType};

/// Resident memory of this process in MiB, from /proc.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .expect("value")
        .parse()
        .expect("number");
    kib / 1024.0
}

/// One full-attention group of `n_layers` layers, `n_kv_heads` heads of 128 values.
fn layout(n_layers: usize, n_kv_heads: usize, kv_type: KvType) -> KvLayout {
    KvLayout {
        n_layers,
        n_kv_heads,
        head_dim: 128,
        groups: vec![GroupSpec {
            layers: (0..n_layers).collect(),
            window: None,
        }],
        kv_type,
    }
}

#[test]
fn unused_kv_capacity_costs_no_resident_memory() {
    // 16 layers × 8 heads × 128 dims × 2 bytes × 2 (K, V) × 32768 tokens = 2 GiB of capacity.
    let layout = layout(16, 8, KvType::F16);
    let before = rss_mib();
    let mut kv = KvCache::new(layout, 32768).expect("allocate");
    let seq = kv.new_sequence();
    kv.append(seq, &(0..64).collect::<Vec<u32>>())
        .expect("append");
    let grown = rss_mib() - before;
    println!("resident growth for a 2 GiB cache holding 64 tokens: {grown:.1} MiB");
    assert!(grown < 64.0, "the KV cache touched {grown:.0} MiB up front");
}

/// Resident memory taken by `n` written tokens in a cache of `kv_type` (8 layers, 4 KV heads
/// of 128 values).
fn resident_for(kv_type: KvType, n: usize) -> f64 {
    let layout = layout(8, 4, kv_type);
    let before = rss_mib();
    let mut kv = KvCache::new(layout, n).expect("allocate");
    let seq = kv.new_sequence();
    kv.append(seq, &(0..n as u32).collect::<Vec<u32>>())
        .expect("append");
    let row: Vec<f32> = (0..4 * 128).map(|i| (i as f32 * 0.37).sin()).collect();
    for slot in 0..n {
        for layer in 0..8 {
            kv.write(layer, seq, slot, &row, &row).expect("write");
        }
    }
    rss_mib() - before
}

#[test]
fn a_q8_0_cache_holds_the_same_tokens_in_about_half_the_memory() {
    // f16: 4096 tokens × 8 layers × 4 heads × 128 values × 2 bytes × 2 (K, V) = 64 MiB.
    let f16 = resident_for(KvType::F16, 4096);
    let q8 = resident_for(KvType::Q8_0, 4096);
    println!("resident for 4096 tokens: f16 {f16:.1} MiB, q8_0 {q8:.1} MiB");
    assert!((60.0..72.0).contains(&f16), "f16 cache took {f16:.1} MiB");
    // Q8_0 stores 34 bytes per 32 values, f16 64: a ratio of 0.53.
    let ratio = q8 / f16;
    assert!((0.5..0.57).contains(&ratio), "q8_0 / f16 = {ratio:.3}");
}
