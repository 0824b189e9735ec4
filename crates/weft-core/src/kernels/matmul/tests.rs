use super::*;
use crate::kernels::interleaved;
use crate::kernels::testutil::{random_weights, Rng};
use crate::kernels::MATMUL_TYPES;
use crate::quant::dequantize_to_vec;

/// `matmul` against dequantize-then-f32 for every type, token count and thread count.
#[test]
fn matmul_matches_dequantized_reference() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut scratch = MatmulScratch::default();
    let mut rng = Rng::new(42);
    for dtype in MATMUL_TYPES {
        let cols = if dtype.block_size() == 256 { 512 } else { 96 };
        for (rows, n_tokens) in [(1, 1), (37, 1), (130, 1), (37, 3), (70, 4), (130, 9)] {
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let w = Matrix::new(dtype, &wb, rows, cols).unwrap();
            let wd = dequantize_to_vec(dtype, &wb).unwrap();
            let x = rng.f32s(n_tokens * cols, 1.0);
            for pool in &pools {
                let mut y = vec![f32::NAN; n_tokens * rows];
                matmul(pool, &w, &x, n_tokens, &mut y, &mut scratch);
                for t in 0..n_tokens {
                    for r in 0..rows {
                        let (wr, xt) = (&wd[r * cols..][..cols], &x[t * cols..][..cols]);
                        let want: f32 = wr.iter().zip(xt).map(|(a, b)| a * b).sum();
                        let mag: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                        let got = y[t * rows + r];
                        assert!(
                            (got - want).abs() <= 0.02 * mag + 1e-4,
                            "{dtype} rows {rows} tokens {n_tokens} threads {}: y[{t}][{r}] = {got}, want {want}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}

/// A stack of interleaved matrices (blocks of 3, 1 and 5 row groups, so that pair tiles
/// straddle the blocks) into three outputs: each output has the bits of its own matrix's
/// `matmul`, for one and several tokens and threads.
#[test]
fn split_outputs_equal_separate_matmuls() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut scratch = MatmulScratch::default();
    let mut rng = Rng::new(5);
    use GgmlType::*;
    for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q8_0] {
        let cols = if dtype.block_size() == 256 { 256 } else { 64 };
        let blocks = [24, 8, 40].map(|rows| {
            let wb = random_weights(&mut rng, dtype, rows, cols);
            (rows, interleaved::repack(dtype, &wb, rows, cols))
        });
        let stacked: Vec<u8> = blocks.iter().flat_map(|(_, p)| p.clone()).collect();
        let ws = Matrix::interleaved(dtype, &stacked, 72, cols).unwrap();
        for n in [1, 5] {
            let x = rng.f32s(n * cols, 1.0);
            for pool in &pools {
                let mut outs = blocks.each_ref().map(|(rows, _)| vec![f32::NAN; n * rows]);
                let [a, b, c] = &mut outs;
                let mut ys = [&mut a[..], &mut b[..], &mut c[..]];
                matmul_split(pool, &ws, &x, n, &mut ys, &mut scratch);
                for ((rows, packed), got) in blocks.iter().zip(&outs) {
                    let w = Matrix::interleaved(dtype, packed, *rows, cols).unwrap();
                    let mut want = vec![0f32; n * rows];
                    matmul(pool, &w, &x, n, &mut want, &mut scratch);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits()),
                        "{dtype}, {n} tokens, {} threads: block of {rows} rows differs",
                        pool.n_threads()
                    );
                }
            }
        }
    }
}

/// Interleaved Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q6_K / Q8_0 weights: `matmul` equals the row
/// layout's up to rounding (Q4_K's `d · Σ − dmin · Σ` cancels, hence 1e-3; a layout error
/// would be O(1)), AVX2 equals scalar bit for bit, and every token's outputs are the same
/// bits whatever the batch and the thread count.
#[test]
fn interleaved_matches_rows_and_is_batch_invariant() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut scratch = MatmulScratch::default();
    let mut rng = Rng::new(17);
    use GgmlType::*;
    for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q8_0] {
        let cols = if dtype.block_size() == 256 {
            3 * 256
        } else {
            9 * 32
        };
        let (rows, n_act) = (136, 40);
        let wb = random_weights(&mut rng, dtype, rows, cols);
        let packed = interleaved::repack(dtype, &wb, rows, cols);
        let w = Matrix::new(dtype, &wb, rows, cols).unwrap();
        let wp = Matrix::interleaved(dtype, &packed, rows, cols).unwrap();
        for outliers in [false, true] {
            let x = activations(&mut rng, n_act, cols, outliers);
            let mut by_level = Vec::new();
            for level in levels() {
                let (mut a, mut b) = (vec![0f32; n_act * rows], vec![0f32; n_act * rows]);
                matmul_with(level, &pools[1], &w, &x, n_act, &mut a, &mut scratch);
                matmul_with(level, &pools[1], &wp, &x, n_act, &mut b, &mut scratch);
                for (i, (&got, &want)) in b.iter().zip(&a).enumerate() {
                    assert!(
                        (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                        "{level:?} {dtype}: y[{i}] interleaved {got} vs rows {want}"
                    );
                }
                let sizes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33];
                check_batch_invariance(level, &pools, &mut scratch, &wp, &x, &sizes, "packed");
                by_level.push(b);
            }
            // Every set gives the scalar reference's bits (the last of `levels()`).
            let (scalar, sets) = by_level.split_last().expect("scalar is always there");
            for (simd, level) in sets.iter().zip(levels()) {
                let same = simd
                    .iter()
                    .zip(scalar)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{dtype}: {level:?} and scalar interleaved kernels differ"
                );
            }
        }
    }
}

/// The VNNI sets (`avxvnni`, `avx512`) give the AVX2 set's bits for every weight type, in
/// both layouts, for a GEMV and for tiles: only the integer dot-product instruction
/// differs, and integer sums are exact.
#[test]
fn every_x86_set_gives_the_avx2_bits() {
    let vnni: Vec<SimdLevel> = levels()
        .into_iter()
        .filter(|l| matches!(l, SimdLevel::Avx512 | SimdLevel::AvxVnni))
        .collect();
    if vnni.is_empty() {
        return; // no VNNI on this CPU: nothing to compare (the AVX2 set is tested above)
    }
    let pool = ThreadPool::new(2);
    let mut scratch = MatmulScratch::default();
    let mut rng = Rng::new(23);
    for dtype in MATMUL_TYPES {
        let cols = match dtype.block_size() {
            256 => 2 * 256,
            32 => 7 * 32,
            _ => 200,
        };
        let rows = 24;
        let wb = random_weights(&mut rng, dtype, rows, cols);
        let packed =
            interleaved::supports(dtype).then(|| interleaved::repack(dtype, &wb, rows, cols));
        let mut matrices = vec![Matrix::new(dtype, &wb, rows, cols).unwrap()];
        if let Some(p) = &packed {
            matrices.push(Matrix::interleaved(dtype, p, rows, cols).unwrap());
        }
        // 3 groups of rows: a pair tile and a group tile on AVX-512; 5 tokens: a pair
        // tile of one token whatever `one_token_pairs` says.
        for w in &matrices {
            for n in [1, 3, 5, 6] {
                let x = activations(&mut rng, n, cols, true);
                let mut want = vec![0f32; n * rows];
                matmul_with(SimdLevel::Avx2, &pool, w, &x, n, &mut want, &mut scratch);
                for &level in &vnni {
                    let mut got = vec![0f32; n * rows];
                    matmul_with(level, &pool, w, &x, n, &mut got, &mut scratch);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{level:?} {w:?} with {n} tokens differs from AVX2");
                }
            }
        }
    }
}

/// The kernel sets a test can use on this machine, best first, scalar last.
fn levels() -> Vec<SimdLevel> {
    SimdLevel::available_levels()
}

/// `n_act` activation rows of `cols` values: uniform, or "real-looking" (small values with
/// about 1% large outliers, as in a transformer's residual stream).
fn activations(rng: &mut Rng, n_act: usize, cols: usize, outliers: bool) -> Vec<f32> {
    if !outliers {
        return rng.f32s(n_act * cols, 1.0);
    }
    let mut x = rng.f32s(n_act * cols, 0.05);
    for v in x.iter_mut() {
        if rng.u64().is_multiple_of(100) {
            *v = rng.f32(40.0) + 20f32.copysign(*v);
        }
    }
    x
}

/// Checks that every token of every batch gets bit for bit the output it gets alone, for
/// the batch sizes of `sizes`, each batch taken at a varying offset in `x` so that a
/// token visits different slots of the 4-token tiles, on 1, 2 and 3 threads.
#[allow(clippy::too_many_arguments)]
fn check_batch_invariance(
    level: SimdLevel,
    pools: &[ThreadPool],
    scratch: &mut MatmulScratch,
    w: &Matrix,
    x: &[f32],
    sizes: &[usize],
    what: &str,
) {
    let (rows, cols) = (w.rows, w.cols);
    let n_act = x.len() / cols;
    // Reference: each token alone, on one thread.
    let mut alone = vec![f32::NAN; n_act * rows];
    for (xt, yt) in x.chunks_exact(cols).zip(alone.chunks_exact_mut(rows)) {
        matmul_with(level, &pools[0], w, xt, 1, yt, scratch);
    }
    for pool in pools {
        for &n in sizes {
            let start = (5 * n) % (n_act - n + 1);
            let xs = &x[start * cols..(start + n) * cols];
            let mut y = vec![f32::NAN; n * rows];
            matmul_with(level, pool, w, xs, n, &mut y, scratch);
            for t in 0..n {
                for r in 0..rows {
                    let (got, want) = (y[t * rows + r], alone[(start + t) * rows + r]);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{level:?} {} {what}: {n} tokens from {start} on {} threads: \
                         y[{t}][{r}] = {got:e}, alone {want:e}",
                        w.dtype,
                        pool.n_threads(),
                    );
                }
            }
        }
    }
}

/// A token's outputs do not depend on the batch it is in, bit for bit: the single-token
/// path, every tile size and slot, every thread count, for every weight type and for both
/// kernel sets; also for batches large enough to be quantized in parallel and split into
/// token blocks.
#[test]
fn batched_rows_equal_single_rows() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut scratch = MatmulScratch::default();
    let sizes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33];
    let n_act = 40;
    for level in levels() {
        let mut rng = Rng::new(5);
        for dtype in MATMUL_TYPES {
            // An odd number of blocks (the even/odd accumulators' tail); for the float
            // types a length that leaves both vector and scalar tails. 131 rows: several
            // chunks per thread, and enough work for one token to run in parallel.
            let cols = match dtype.block_size() {
                256 => 3 * 256,
                32 => 9 * 32,
                _ => 300,
            };
            let rows = 131;
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let w = Matrix::new(dtype, &wb, rows, cols).unwrap();
            for outliers in [false, true] {
                let x = activations(&mut rng, n_act, cols, outliers);
                let what = if outliers { "outliers" } else { "uniform" };
                check_batch_invariance(level, &pools, &mut scratch, &w, &x, &sizes, what);
            }
        }
        // Long rows: several token blocks per chunk (16 tokens of 8192 values each).
        for dtype in [
            GgmlType::Q5_0,
            GgmlType::Q4_1,
            GgmlType::Q4_K,
            GgmlType::F16,
        ] {
            let (rows, cols) = (9, 8192);
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let w = Matrix::new(dtype, &wb, rows, cols).unwrap();
            let x = activations(&mut rng, n_act, cols, true);
            let sizes = [1, 17, 33];
            check_batch_invariance(level, &pools, &mut scratch, &w, &x, &sizes, "long");
        }
    }
}
