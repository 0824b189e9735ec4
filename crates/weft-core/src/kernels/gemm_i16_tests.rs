use super::*;
use crate::kernels::testutil::Rng;

fn product(pool: &ThreadPool, w: &PackedI16, x: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let mut xq = QuantizedRows::default();
    xq.quantize(pool, x, w.cols());
    let mut y = vec![0f32; xq.n() * w.rows()];
    gemm_i16(pool, w, &xq, bias, &mut y);
    y
}

/// Close to the f64 product; bit-identical between SIMD and scalar paths, any batch split
/// and any thread count.
#[test]
fn matches_reference_and_is_batch_invariant() {
    let mut rng = Rng::new(11);
    for (rows, cols, n) in [
        (16, 32, 1),
        (37, 50, 7),
        (384, 384, 13),
        (5, 3, 2),
        (40, 100, 70),
        (1152, 96, 131),
    ] {
        let w = rng.f32s(rows * cols, 1.0);
        let mut x = rng.f32s(n * cols, 2.0);
        // Some structure: a large outlier and an all-zero block.
        x[0] = 40.0;
        if cols >= 64 && n > 1 {
            x[cols + 32..cols + 64].fill(0.0);
        }
        let bias = rng.f32s(rows, 1.0);
        let packed = PackedI16::pack(&w, rows, cols);
        let pool = ThreadPool::new(2);
        let y = product(&pool, &packed, &x, Some(&bias));
        // Per-block maxima, for the error bound.
        let amax = |v: &[f32], c: usize| {
            let b = c / BLOCK * BLOCK;
            v[b..v.len().min(b + BLOCK)]
                .iter()
                .fold(0f64, |m, &a| m.max(f64::from(a).abs()))
        };
        for t in 0..n {
            let xr = &x[t * cols..(t + 1) * cols];
            for r in 0..rows {
                let wr = &w[r * cols..(r + 1) * cols];
                let (mut want, mut bound) = (f64::from(bias[r]), 0f64);
                for c in 0..cols {
                    let (wv, xv) = (f64::from(wr[c]), f64::from(xr[c]));
                    want += wv * xv;
                    // Rounding each operand moves it by at most half a step (max / 8191);
                    // twice that, plus the f32 arithmetic.
                    bound += (wv.abs() * amax(xr, c) + xv.abs() * amax(wr, c)) / 8191.0
                        + 1e-5 * (wv * xv).abs();
                }
                let err = (f64::from(y[t * rows + r]) - want).abs();
                assert!(
                    err <= bound + 1e-6,
                    "{rows}x{cols} {t} {r}: {err} > {bound}"
                );
            }
        }
        // One token at a time, on one thread, and through the scalar references.
        for t in 0..n {
            let xr = &x[t * cols..(t + 1) * cols];
            let one = product(&ThreadPool::new(1), &packed, xr, Some(&bias));
            assert_eq!(one, y[t * rows..(t + 1) * rows]);
            let mut xq = QuantizedRows::default();
            xq.quantize(&ThreadPool::new(1), xr, cols);
            let (mut q, mut s) = (vec![0i16; xq.q.len()], vec![0f32; xq.scales.len()]);
            quantize_row_scalar(xr, &mut q, &mut s);
            assert_eq!((&q, &s), (&xq.q, &xq.scales));
            for p in 0..rows.div_ceil(PANEL) {
                let (wq, ws) = packed.panel(p);
                let mut tile = [[0f32; PANEL]; 1];
                scalar_tile(wq, ws, &q, &s, packed.blocks, &mut tile);
                let valid = (rows - p * PANEL).min(PANEL);
                for j in 0..valid {
                    assert_eq!(
                        (tile[0][j] + bias[p * PANEL + j]).to_bits(),
                        one[p * PANEL + j].to_bits()
                    );
                }
            }
        }
    }
}

/// The quantization keeps |q| ≤ 8191, is exact on the block maximum, and the AVX2 twin
/// gives the scalar bits on awkward values (ties, NaN, infinities, zeros).
#[test]
fn quantization_bounds_and_twins() {
    let mut rng = Rng::new(3);
    let mut cases: Vec<Vec<f32>> = (0..50)
        .map(|i| rng.f32s(32, 10f32.powi(i % 7 - 3)))
        .collect();
    cases.push(vec![0.0; 32]);
    cases.push((0..32).map(|i| i as f32 * 0.5 - 8.0).collect());
    let mut odd = rng.f32s(32, 1.0);
    odd[3] = f32::NAN;
    odd[7] = -0.0;
    cases.push(odd);
    let mut inf = rng.f32s(32, 1.0);
    inf[9] = f32::INFINITY;
    cases.push(inf);
    for x in &cases {
        let mut a = [0i16; 32];
        let s = quantize_block(x, &mut a);
        assert!(a.iter().all(|&q| i32::from(q).abs() <= QMAX));
        if x.iter().all(|v| v.is_finite()) && s > 0.0 {
            assert_eq!(a.iter().map(|&q| i32::from(q).abs()).max(), Some(QMAX));
        }
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            let mut b = [0i16; 32];
            // SAFETY: AVX2 checked, 32 values.
            let t = unsafe { avx2::quantize_block(x, &mut b) };
            assert_eq!((a, s.to_bits()), (b, t.to_bits()));
        }
    }
}

/// Micro-benchmark (ignored): `cargo test --release -p weft-core --lib gemm_i16::tests::bench
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench() {
    use crate::kernels::gemm_f32::{gemm_f32, PackedF32};
    use std::time::Instant;
    let mut rng = Rng::new(5);
    let threads: usize = std::env::var("WEFT_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    for (rows, cols, n) in [
        (384, 384, 4096),
        (1152, 384, 4096),
        (1536, 384, 4096),
        (384, 1536, 4096),
    ] {
        let w = rng.f32s(rows * cols, 1.0);
        let x = rng.f32s(n * cols, 1.0);
        let mut y = vec![0f32; n * rows];
        let pi = PackedI16::pack(&w, rows, cols);
        let pf = PackedF32::pack(&w, rows, cols);
        let mut xq = QuantizedRows::default();
        let flop = 2.0 * (rows * cols * n) as f64;
        let mut best = [f64::INFINITY; 3];
        for _ in 0..10 {
            let t = Instant::now();
            gemm_f32(&pool, &pf, &x, &mut y);
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            xq.quantize(&pool, &x, cols);
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            gemm_i16(&pool, &pi, &xq, None, &mut y);
            best[2] = best[2].min(t.elapsed().as_secs_f64());
        }
        println!(
            "{rows}x{cols} n={n} {threads} threads: f32 {:.1} GFLOP/s, i16 {:.1} GFLOP/s (+ quantize {:.2} ms = {:.1} GFLOP/s overall)",
            flop / best[0] / 1e9,
            flop / best[2] / 1e9,
            best[1] * 1e3,
            flop / (best[1] + best[2]) / 1e9,
        );
    }
}
