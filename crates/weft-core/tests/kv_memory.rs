//! The KV cache's storage is mapped by the OS only when written: a large, mostly unused cache
//! must not cost its full size in resident memory (peak RSS is one of the speed-table figures).

#![cfg(target_os = "linux")]

use weft_core::kv::{GroupSpec, KvCache, KvLayout};

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

#[test]
fn unused_kv_capacity_costs_no_resident_memory() {
    // 16 layers × 8 heads × 128 dims × 2 bytes × 2 (K, V) × 32768 tokens = 2 GiB of capacity.
    let layout = KvLayout {
        n_layers: 16,
        n_kv_heads: 8,
        head_dim: 128,
        groups: vec![GroupSpec {
            layers: (0..16).collect(),
            window: None,
        }],
    };
    let before = rss_mib();
    let mut kv = KvCache::new(layout, 32768).expect("allocate");
    let seq = kv.new_sequence();
    kv.append(seq, &(0..64).collect::<Vec<u32>>())
        .expect("append");
    let grown = rss_mib() - before;
    println!("resident growth for a 2 GiB cache holding 64 tokens: {grown:.1} MiB");
    assert!(grown < 64.0, "the KV cache touched {grown:.0} MiB up front");
}
