//! What decode is bounded by: the machine's streaming read bandwidth, and the bytes one decode
//! step must read (the weights once per step, each sequence's keys and values). `weft bench
//! --bandwidth` divides the second by the first to say how close a decode runs to the limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::gguf::GgufFile;
use crate::kv::KvLayout;

/// Bytes the bandwidth test streams per round by default: past the last-level cache of most
/// machines.
pub const BUFFER_BYTES: usize = 256 << 20;

/// The smallest buffer [`read_bandwidth`] streams: far past a core's L2.
const MIN_BUFFER_BYTES: usize = 16 << 20;

/// How far ahead of its reads each reader asks for lines (none: the hardware prefetchers
/// alone). Measured on a Xeon (medians of 15 rounds over 98 MB, 2 threads): none 39.6 GB/s,
/// 1 KiB 50.8, 2 KiB 52.2, 4 KiB 52.6, 8 KiB 54.1, 16 KiB 53.3; over 256 MB none 21.9,
/// 2 KiB 31.6, 8 KiB 35.0. The weight kernels prefetch 8 KiB ahead.
const PREFETCH_AHEAD: [usize; 3] = [0, 2048, 8192];

/// The machine's streaming read bandwidth in bytes per second with `threads` threads, each
/// summing its share of a buffer of `bytes` bytes (at least 16 MiB; [`BUFFER_BYTES`] past most
/// caches, or the bytes one decode step reads, for the rate a working set of that size is
/// read at — a step whose bytes partly stay in a large last-level cache between steps reads
/// faster than a 256 MiB buffer does): the best of `rounds` rounds of each of three readers
/// (after one warm-up round that also maps the pages), a plain sequential sum and two that
/// prefetch 2 KiB and 8 KiB ahead, as the weight kernels do. The hardware prefetchers
/// alone left 10–40% of the bus idle on a Xeon, so the plain sum alone understated the bound
/// a decode step that streams its weights runs into (the kernels read faster than it).
pub fn read_bandwidth(threads: usize, rounds: usize, bytes: usize) -> f64 {
    let threads = threads.max(1);
    let bytes = bytes.max(MIN_BUFFER_BYTES) / 64 * 64;
    // Non-zero contents, so every page is really mapped and read.
    let buffer: Vec<u64> = (0..bytes / 8).map(|i| i as u64 | 1).collect();
    let chunk = buffer.len().div_ceil(threads);
    let mut best = 0.0f64;
    let readers = PREFETCH_AHEAD.len();
    for round in 0..readers * rounds.max(1) + 1 {
        let ahead = PREFETCH_AHEAD[round % readers];
        let start = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(chunk)
                .map(|part| s.spawn(move || sum_stream(part, ahead)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let secs = start.elapsed().as_secs_f64();
        // The sums are used, so the reads cannot be optimized away.
        std::hint::black_box(sums);
        if round > 0 {
            best = best.max(bytes as f64 / secs);
        }
    }
    best
}

/// Nanoseconds for one cache line to go from one thread to another and back: two threads
/// pass a counter to and fro `trips` times (after 200 untimed trips), each waiting for the
/// other's write. On a shared VM this says where the threads run: on the 2-vCPU AMD EPYC
/// (Zen 5) host this took 44–59 ns in some minutes (most likely one core complex, sharing
/// its link to memory: two threads streamed 44–61 GB/s) and 344–412 ns in others (two
/// complexes, each with its own link: 68–97 GB/s), switching within seconds — which is what
/// made the bus look slow or fast. Gives up after 100 ms (a busy machine that does not run
/// both threads at once) and returns the mean of the trips made by then, or NaN for none.
pub fn core_round_trip(trips: usize) -> f64 {
    /// The counter, alone on its cache lines.
    #[repr(align(128))]
    struct Line(AtomicU64);
    const WARM_UP: u64 = 200;
    const BUDGET: Duration = Duration::from_millis(100);
    let line = Line(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // The partner answers each odd value with the next even one.
        s.spawn(|| {
            let mut expect = 1;
            loop {
                if line.0.load(Ordering::Acquire) == expect {
                    line.0.store(expect + 1, Ordering::Release);
                    expect += 2;
                } else if stop.load(Ordering::Relaxed) {
                    return;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let begun = Instant::now();
        let mut timed: Option<(Instant, u64)> = None;
        let mut i = 0u64;
        'trips: while i < WARM_UP + trips as u64 {
            if i == WARM_UP {
                timed = Some((Instant::now(), i));
            }
            line.0.store(2 * i + 1, Ordering::Release);
            let mut spins = 0u32;
            while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1 << 12) && begun.elapsed() > BUDGET {
                    break 'trips;
                }
            }
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        match timed {
            Some((start, first)) if i > first => {
                start.elapsed().as_nanos() as f64 / (i - first) as f64
            }
            _ => f64::NAN,
        }
    })
}

/// The wrapping sum of `xs`, in eight independent lanes so the loads stream (the loop is
/// vectorized; one accumulator would chain every add); with `ahead > 0`, each 64-byte line
/// also asks for the line `ahead` bytes further on.
fn sum_stream(xs: &[u64], ahead: usize) -> u64 {
    let mut acc = [0u64; 8];
    let mut lines = xs.chunks_exact(8);
    for line in &mut lines {
        #[cfg(target_arch = "x86_64")]
        if ahead > 0 {
            let ahead = line.as_ptr().wrapping_byte_add(ahead);
            // SAFETY: a prefetch reads nothing architecturally, whatever the address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    ahead as *const i8,
                )
            };
        }
        for (a, &x) in acc.iter_mut().zip(line) {
            *a = a.wrapping_add(x);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ahead;
    let tail = lines
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// Weight bytes one decode step reads: every tensor, except that the token embedding table
/// is read one row per token — unless it is also the output projection (tied embeddings, as
/// Gemma's), which reads all of it.
pub fn weight_bytes_per_step(file: &GgufFile) -> u64 {
    let tied = file.tensor("output.weight").is_err();
    file.tensors()
        .iter()
        .filter(|t| tied || t.name != "token_embd.weight")
        .map(|t| t.n_bytes)
        .sum()
}

impl KvLayout {
    /// Bytes of keys and values (as stored: f16 or Q8_0) one token's attention reads at
    /// context length `depth`, over every layer: a sliding-window layer reads at most its window.
    pub fn bytes_read_at(&self, depth: usize) -> u64 {
        let per_position = (2 * self.n_kv_heads * self.row_bytes()) as u64;
        self.groups
            .iter()
            .map(|g| {
                let seen = g.window.map_or(depth, |w| depth.min(w));
                g.layers.len() as u64 * seen as u64 * per_position
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::GroupSpec;

    #[test]
    fn kv_bytes_count_windows() {
        let mut layout = KvLayout {
            n_layers: 3,
            n_kv_heads: 2,
            head_dim: 32,
            groups: vec![
                GroupSpec {
                    layers: vec![0, 2],
                    window: None,
                },
                GroupSpec {
                    layers: vec![1],
                    window: Some(10),
                },
            ],
            kv_type: crate::kv::KvType::F16,
        };
        // 2 (K, V) × 2 heads × 32 dims × 2 bytes = 256 bytes per position and layer.
        assert_eq!(layout.bytes_read_at(0), 0);
        assert_eq!(layout.bytes_read_at(5), 256 * (2 * 5 + 5));
        assert_eq!(layout.bytes_read_at(100), 256 * (2 * 100 + 10));
        // Q8_0: one 34-byte block per 32 values.
        layout.kv_type = crate::kv::KvType::Q8_0;
        assert_eq!(layout.bytes_read_at(100), 2 * 2 * 34 * (2 * 100 + 10));
    }

    #[test]
    fn any_buffer_size_reads_at_a_positive_rate() {
        // Below the floor (16 MiB) and an odd size: both stream whole 64-byte lines.
        for bytes in [1 << 20, (16 << 20) + 100] {
            let bw = read_bandwidth(2, 1, bytes);
            assert!(bw.is_finite() && bw > 1e8, "{bytes} bytes: {bw} B/s");
        }
    }

    #[test]
    fn a_round_trip_takes_a_positive_time() {
        // Two threads on any machine (one core: they take turns, within the budget).
        let ns = core_round_trip(2000);
        assert!(ns.is_nan() || (ns > 0.0 && ns < 1e8), "{ns} ns");
        // No trips asked: nothing timed.
        assert!(core_round_trip(0).is_nan());
    }

    #[test]
    fn the_stream_sum_is_the_sum() {
        let xs: Vec<u64> = (1..=1003).collect();
        for ahead in [0, 64, 8192] {
            assert_eq!(sum_stream(&xs, ahead), 1003 * 1004 / 2);
        }
    }
}
