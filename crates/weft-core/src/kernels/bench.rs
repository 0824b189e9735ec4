//! Micro-benchmarks of `matmul` and of a decode's attention (ignored by default):
//! `cargo test --release -p weft-core --lib kernels::bench -- --ignored --nocapture`.
//!
//! GEMV figures are weight bytes streamed per second; with `cold`, the matrix is one of several
//! copies totalling at least 256 MB used round-robin, so the weights come from DRAM rather than
//! the cache (as in a real decode step). GEMM figures are GFLOP/s (2 · rows · cols · tokens).
//! `WEFT_BENCH_THREADS=1,2` picks the thread counts, `WEFT_BENCH_FILTER=Q4_K` the cases.

use std::time::{Duration, Instant};

use super::testutil::{random_weights, Rng};
use super::{matmul, MatmulScratch, Matrix};
use crate::gguf::GgmlType;
use crate::threadpool::ThreadPool;

/// Runs `f` repeatedly for about `budget`; returns seconds per call (best of 3 rounds).
pub(crate) fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let (start, mut n) = (Instant::now(), 0u32);
        while start.elapsed() < budget / 3 || n == 0 {
            f();
            n += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(n));
    }
    best
}

struct Case {
    name: &'static str,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    tokens: usize,
    cold: bool,
}

/// `packed`: the weights interleaved by 8 rows, as the models load them.
fn bench_case(pool: &ThreadPool, c: &Case, packed: bool) -> String {
    let (line, _) = bench_case_gbs(pool, c, packed, Duration::from_millis(900));
    line
}

/// [`bench_case`] with a time budget, and its GB/s.
fn bench_case_gbs(pool: &ThreadPool, c: &Case, packed: bool, budget: Duration) -> (String, f64) {
    let mut rng = Rng::new(1);
    let mut one = random_weights(&mut rng, c.dtype, c.rows, c.cols);
    if packed {
        one = super::interleaved::repack(c.dtype, &one, c.rows, c.cols);
    }
    let copies = if c.cold {
        (256 << 20) / one.len() + 1
    } else {
        1
    };
    let mats: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
    let x = rng.f32s(c.tokens * c.cols, 1.0);
    let mut y = vec![0f32; c.tokens * c.rows];
    let mut scratch = MatmulScratch::default();
    let mut i = 0;
    let secs = time(budget, || {
        let data = &mats[i % copies];
        let w = if packed {
            Matrix::interleaved(c.dtype, data, c.rows, c.cols).unwrap()
        } else {
            Matrix::new(c.dtype, data, c.rows, c.cols).unwrap()
        };
        matmul(pool, &w, &x, c.tokens, &mut y, &mut scratch);
        i += 1;
    });
    let gflops = 2.0 * (c.rows * c.cols * c.tokens) as f64 / secs / 1e9;
    let gbs = one.len() as f64 / secs / 1e9;
    let line = format!(
        "{:<36} {} thr {:>9.1} us {:>7.2} GB/s {:>7.1} GFLOP/s",
        format!("{}{}", c.name, if packed { " (i8)" } else { "" }),
        pool.n_threads(),
        secs * 1e6,
        gbs,
        gflops
    );
    (line, gbs)
}

/// The interleaved one-token products (weights from memory) with and without the tiles'
/// weight hints ([`super::weight_prefetch`]), the two alternated within each of 6 rounds so
/// that a shared host's slow minutes fall on both: GB/s per round, then the medians.
#[test]
#[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
fn bench_weight_prefetch() {
    use GgmlType::*;
    let case = |name, dtype, rows, cols| Case {
        name,
        dtype,
        rows,
        cols,
        tokens: 1,
        cold: true,
    };
    let cases = [
        case("gemv Q4_1 1536x576", Q4_1, 1536, 576),
        case("gemv Q4_K 640x2048", Q4_K, 640, 2048),
        case("gemv Q8_0 49152x576", Q8_0, 49152, 576),
        case("gemv Q8_0 262144x640", Q8_0, 262144, 640),
    ];
    println!(
        "kernels: {:?}, CPU's choice: hints {}",
        super::simd_level(),
        super::weight_prefetch()
    );
    for n in bench_threads() {
        let pool = ThreadPool::new(n);
        for c in &cases {
            let mut runs = [Vec::new(), Vec::new()];
            for round in 0..6 {
                let mut line = format!("{} {n} thr, round {round}:", c.name);
                for (on, runs) in [true, false].into_iter().zip(&mut runs) {
                    super::cpu::force_weight_prefetch(Some(on));
                    let (_, gbs) = bench_case_gbs(&pool, c, true, Duration::from_millis(300));
                    runs.push(gbs);
                    line += &format!(" hints {on} {gbs:.1} GB/s");
                }
                println!("{line}");
            }
            super::cpu::force_weight_prefetch(None);
            let [on, off] = runs.map(|mut v| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            });
            println!(
                "{} {n} thr, medians: hints {on:.1}, none {off:.1} GB/s",
                c.name
            );
        }
    }
}

#[test]
#[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
fn bench() {
    use GgmlType::*;
    let case = |name, dtype, rows, cols, tokens, cold| Case {
        name,
        dtype,
        rows,
        cols,
        tokens,
        cold,
    };
    let cases = [
        case(
            "gemv Q4_1 576x1536 (smollm ffn_down)",
            Q4_1,
            576,
            1536,
            1,
            true,
        ),
        case(
            "gemv Q4_1 1536x576 (smollm ffn_up)",
            Q4_1,
            1536,
            576,
            1,
            true,
        ),
        case(
            "gemv Q8_0 49152x576 (smollm output)",
            Q8_0,
            49152,
            576,
            1,
            true,
        ),
        case(
            "gemv Q8_0 262144x640 (gemma output)",
            Q8_0,
            262144,
            640,
            1,
            true,
        ),
        case(
            "gemv Q5_0 640x2048 (gemma ffn_down)",
            Q5_0,
            640,
            2048,
            1,
            true,
        ),
        case(
            "gemv Q5_0 2048x640 (gemma ffn_up)",
            Q5_0,
            2048,
            640,
            1,
            true,
        ),
        case("gemv Q4_K 640x2048", Q4_K, 640, 2048, 1, true),
        case("gemv Q6_K 640x2048", Q6_K, 640, 2048, 1, true),
        case("gemv Q4_1 1536x576 hot", Q4_1, 1536, 576, 1, false),
        case("gemv Q8_0 4096x640 hot", Q8_0, 4096, 640, 1, false),
        case("gemv Q4_K 640x2048 hot", Q4_K, 640, 2048, 1, false),
        case("gemv F16 640x2048", F16, 640, 2048, 1, true),
        case("gemv F32 640x2048 hot", F32, 640, 2048, 1, false),
        case("gemm16 Q4_1 1536x576", Q4_1, 1536, 576, 16, false),
        case("gemm16 Q8_0 49152x576", Q8_0, 49152, 576, 16, true),
        case("gemm16 Q8_0 262144x640", Q8_0, 262144, 640, 16, false),
        case("gemm16 Q5_0 2048x640", Q5_0, 2048, 640, 16, false),
        case("gemm16 Q4_K 640x2048", Q4_K, 640, 2048, 16, false),
        case("gemm16 Q6_K 640x2048", Q6_K, 640, 2048, 16, false),
        case("gemm16 F16 640x2048", F16, 640, 2048, 16, false),
        case("gemm128 Q4_1 1536x576", Q4_1, 1536, 576, 128, false),
        case("gemm128 Q8_0 49152x576", Q8_0, 49152, 576, 128, false),
        case("gemm128 Q5_0 2048x640", Q5_0, 2048, 640, 128, false),
        case("gemm128 Q4_0 2048x640", Q4_0, 2048, 640, 128, false),
        case("gemm128 Q4_K 640x2048", Q4_K, 640, 2048, 128, false),
        case("gemm128 Q6_K 640x2048", Q6_K, 640, 2048, 128, false),
    ];
    let threads = bench_threads();
    let filter = std::env::var("WEFT_BENCH_FILTER").unwrap_or_default();
    println!("kernels: {:?}", super::simd_level());
    for c in cases.iter().filter(|c| c.name.contains(filter.as_str())) {
        let packable = super::interleaved::supports(c.dtype) && c.rows.is_multiple_of(8);
        for packed in [false, true].into_iter().filter(|&p| !p || packable) {
            for &n in &threads {
                let pool = ThreadPool::new(n);
                println!("{}", bench_case(&pool, c, packed));
            }
        }
    }
}

/// The thread counts `WEFT_BENCH_THREADS` names (default 1 and 2).
pub(crate) fn bench_threads() -> Vec<usize> {
    std::env::var("WEFT_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// Seconds per `pool.run` of an empty job.
fn pool_latency(pool: &ThreadPool) -> f64 {
    time(Duration::from_millis(300), || pool.run(&|_, _| {}))
}

/// Seconds a `run_chunks` of 8 chunks of pure arithmetic takes beyond the arithmetic itself,
/// with the caller alone for 4 chunks' time between runs (as for a decode step's norms): what
/// handing work to the other threads and back costs: under 0.1 µs on the 2-vCPU Zen 5 host
/// with its vCPUs on one core complex, 0.66–0.75 µs with them on two (0.8–1.2 µs before the
/// pool kept each thread's claim, share and end on a line of its own).
fn pool_handover(pool: &ThreadPool) -> f64 {
    // ~0.35 µs of dependent multiply-adds on the Zen 5.
    let chunk = |c: usize| {
        let mut x = c as u64 | 1;
        for _ in 0..1700 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
        std::hint::black_box(x);
    };
    let budget = Duration::from_millis(300);
    let one = time(budget, || chunk(3));
    let run = time(budget, || {
        pool.run_chunks(8, &chunk);
        (0..4).for_each(chunk);
    });
    let work = (8usize.div_ceil(pool.n_threads()) + 4) as f64 * one;
    run - work
}

/// The matmuls of one SmolLM2-135M decode step: 30 blocks of q, k, v, o, gate, up, down
/// (Q4_1), then the tied Q8_0 output projection.
struct DecodeStep {
    layers: Vec<(Vec<u8>, usize, usize)>,
    output: Vec<u8>,
}

impl DecodeStep {
    fn new() -> DecodeStep {
        let mut rng = Rng::new(3);
        let shapes = [
            (576, 576),
            (192, 576),
            (192, 576),
            (576, 576),
            (1536, 576),
            (1536, 576),
            (576, 1536),
        ];
        let mut layers = Vec::new();
        for _ in 0..30 {
            for (rows, cols) in shapes {
                layers.push((
                    random_weights(&mut rng, GgmlType::Q4_1, rows, cols),
                    rows,
                    cols,
                ));
            }
        }
        let output = random_weights(&mut rng, GgmlType::Q8_0, 49152, 576);
        DecodeStep { layers, output }
    }

    /// Seconds per step on `pool`.
    fn time(&self, pool: &ThreadPool) -> f64 {
        let x = vec![0.5f32; 1536];
        let mut y = vec![0f32; 49152];
        let mut scratch = MatmulScratch::default();
        time(Duration::from_millis(1500), || {
            for (w, rows, cols) in &self.layers {
                let m = Matrix::new(GgmlType::Q4_1, w, *rows, *cols).unwrap();
                matmul(pool, &m, &x[..*cols], 1, &mut y[..*rows], &mut scratch);
            }
            let m = Matrix::new(GgmlType::Q8_0, &self.output, 49152, 576).unwrap();
            matmul(pool, &m, &x[..576], 1, &mut y, &mut scratch);
        })
    }
}

#[test]
#[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
fn bench_pool_and_decode() {
    for n in [2, 3] {
        let pool = ThreadPool::new(n);
        println!(
            "pool.run (empty job), {n} threads: {:.2} us",
            pool_latency(&pool) * 1e6
        );
        println!(
            "hand-over of 8 chunks, {n} threads: {:.2} us beyond the work \
             (a cache line's round trip between two threads: {:.0} ns)",
            pool_handover(&pool) * 1e6,
            super::bandwidth::core_round_trip(20_000)
        );
    }
    let step = DecodeStep::new();
    let (one, two) = (ThreadPool::new(1), ThreadPool::new(2));
    let t1 = step.time(&one);
    let t2 = step.time(&two);
    println!(
        "smollm2 decode-step matmuls, 1 thread:  {:.2} ms ({:.0} steps/s)",
        t1 * 1e3,
        1.0 / t1
    );
    println!(
        "smollm2 decode-step matmuls, 2 threads: {:.2} ms ({:.0} steps/s)",
        t2 * 1e3,
        1.0 / t2
    );
    // A competing busy process on the 2 cores: throughput should degrade, not collapse.
    let mut hog = std::process::Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("start a busy-loop process");
    std::thread::sleep(Duration::from_millis(200));
    let t2h = step.time(&two);
    let t1h = step.time(&one);
    hog.kill().ok();
    hog.wait().ok();
    println!(
        "with a busy-loop process: 2 threads {:.2} ms ({:.0}% of alone), 1 thread {:.2} ms",
        t2h * 1e3,
        100.0 * t2 / t2h,
        t1h * 1e3
    );
}

/// One decode's attention over `keys` keys of `layers` layers (each its own K and V pages, so
/// they come from DRAM), one KV head of `g` query heads of `d` values, page by page as
/// `models::attention` walks it: a page step each (scores with the next page's keys hinted,
/// the softmax of each head, the weighted sum of the values with the next page's values
/// hinted). Seconds per layer.
fn attention_decode(kv: super::attention::KvType, g: usize, d: usize, keys: usize) -> f64 {
    use super::attention::{page_step, quantize_row, write_key};
    use crate::kv::PAGE_SIZE as PAGE;
    let rb = kv.row_bytes(d);
    let layer_bytes = 2 * keys * rb;
    let layers = (256 << 20) / layer_bytes;
    let mut rng = Rng::new(3);
    let mut cache = vec![0u8; layers * layer_bytes];
    // One row everywhere: every page has the same scores, so the max never grows (the
    // common case of a long decode) and the timing does not depend on the data.
    let row = rng.f32s(d, 1.0);
    let mut key_page = vec![0u8; PAGE * rb];
    for s in 0..PAGE {
        write_key(kv, &row, &mut key_page, s);
    }
    for layer in cache.chunks_exact_mut(layer_bytes) {
        let (k, v) = layer.split_at_mut(keys * rb);
        k.chunks_exact_mut(PAGE * rb)
            .for_each(|p| p.copy_from_slice(&key_page));
        v.chunks_exact_mut(rb)
            .for_each(|r| quantize_row(kv, &row, r));
    }
    let q = rng.f32s(g * d, 0.2);
    let mut acc = vec![0f32; g * d];
    let page_bytes = PAGE * rb;
    let mut layer = 0;
    time(Duration::from_millis(1500), || {
        let (k, v) = cache[layer * layer_bytes..][..layer_bytes].split_at(keys * rb);
        layer = (layer + 1) % layers;
        let (mut max, mut sum) = ([f32::NEG_INFINITY; 8], [0f32; 8]);
        acc.fill(0.0);
        for p in 0..keys / PAGE {
            let (kp, vp) = (
                &k[p * page_bytes..][..page_bytes],
                &v[p * page_bytes..][..page_bytes],
            );
            let next = (p + 1) * page_bytes..(p + 2) * page_bytes;
            let next_k = k.get(next.clone()).unwrap_or(&[]);
            let next_v = v.get(next).unwrap_or(&[]);
            let (max, sum) = (&mut max[..g], &mut sum[..g]);
            page_step(
                kv, &q, kp, vp, PAGE, 0.125, max, sum, &mut acc, next_k, next_v,
            );
        }
        std::hint::black_box(&acc);
    })
}

#[test]
#[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
fn bench_attention_decode() {
    use super::attention::KvType;
    for kv in [KvType::F16, KvType::Q8_0] {
        for (g, d) in [(3, 64), (4, 256)] {
            let keys = 4096;
            let t = attention_decode(kv, g, d, keys);
            let bytes = 2 * keys * kv.row_bytes(d);
            println!(
                "attention decode, {kv}, {g} heads of {d} over {keys} keys: {:.1} us ({:.2} ns/key, {:.1} GB/s)",
                t * 1e6,
                t * 1e9 / keys as f64,
                bytes as f64 / t / 1e9
            );
        }
    }
}
