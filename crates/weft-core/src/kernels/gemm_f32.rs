//! `f32` GEMM for full-precision weights (the BERT encoder): `y[t][r] = Σ_c W[r][c]·x[t][c]`.
//!
//! The quantized [`matmul`](super::matmul) computes dot products of a weight row with a few
//! activation rows; for `f32` weights that is bound by loads (one weight and four activation
//! loads per four FMAs). Here the weights are packed at load time into panels of
//! [`PANEL`] = 16 rows stored column by column (`panel[c][0..16]`), and a micro-kernel keeps a
//! tile of [`TILE`] = 6 tokens × 16 rows of outputs in 12 AVX registers: per column it loads two
//! weight vectors, broadcasts 6 activations and issues 12 FMAs (the BLIS register tile), so the
//! FMA units, not the loads, set the pace.
//!
//! Determinism: every output is one FMA chain over `c = 0..cols` in order, whatever the tile
//! size, the token's place in the batch or the thread count, so results are bit-identical
//! across batches; the scalar reference uses `f32::mul_add` in the same order and gives the
//! same bits as the AVX2 kernel.

use super::use_avx2;
use crate::models::layers::SharedOut;
use crate::threadpool::ThreadPool;

/// Rows per packed panel (two 8-lane vectors).
pub const PANEL: usize = 16;
/// Tokens per register tile.
pub const TILE: usize = 6;

/// A weight matrix packed for [`gemm_f32`]: `rows.div_ceil(16)` panels of `cols × 16` values,
/// rows past the end zero.
#[derive(Debug, Clone)]
pub struct PackedF32 {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl PackedF32 {
    /// Packs the row-major `rows × cols` matrix `w`.
    ///
    /// # Panics
    /// If `w.len() != rows * cols`.
    pub fn pack(w: &[f32], rows: usize, cols: usize) -> PackedF32 {
        assert_eq!(w.len(), rows * cols, "PackedF32::pack: shape mismatch");
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0f32; panels * cols * PANEL];
        for (r, row) in w.chunks_exact(cols.max(1)).enumerate().take(rows) {
            let panel = &mut data[(r / PANEL) * cols * PANEL..][..cols * PANEL];
            for (c, &v) in row.iter().enumerate() {
                panel[c * PANEL + r % PANEL] = v;
            }
        }
        PackedF32 { data, rows, cols }
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.cols * PANEL..][..self.cols * PANEL]
    }
}

/// `y[t * rows + r] = Σ_c W[r][c] · x[t * cols + c]` for the `n = x.len() / cols` rows of `x`.
/// Threads take contiguous ranges of panels.
///
/// # Panics
/// If `x` is not a whole number of rows or `y` is not `n × rows`.
pub fn gemm_f32(pool: &ThreadPool, w: &PackedF32, x: &[f32], y: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    assert!(
        cols > 0 && x.len().is_multiple_of(cols),
        "gemm_f32: x is not whole rows"
    );
    let n = x.len() / cols;
    assert_eq!(y.len(), n * rows, "gemm_f32: y has the wrong size");
    let panels = rows.div_ceil(PANEL);
    // Small products run on the calling thread alone.
    let threads = if n * rows * cols < 64 * 1024 {
        1
    } else {
        pool.n_threads().min(panels)
    };
    let out = SharedOut(y.as_mut_ptr());
    let work = |ti: usize, nt: usize| {
        let out = &out;
        let (p0, p1) = (panels * ti / nt, panels * (ti + 1) / nt);
        for t0 in (0..n).step_by(TILE) {
            let tokens = (n - t0).min(TILE);
            let xs = &x[t0 * cols..(t0 + tokens) * cols];
            for p in p0..p1 {
                let valid = (rows - p * PANEL).min(PANEL);
                let mut tile = [[0f32; PANEL]; TILE];
                kernel(w.panel(p), xs, cols, &mut tile[..tokens]);
                for (t, acc) in tile[..tokens].iter().enumerate() {
                    let at = (t0 + t) * rows + p * PANEL;
                    // SAFETY: `at + valid <= n * rows = y.len()`; the columns
                    // `p*16..p*16+valid` of every row belong to panel `p`, which only this
                    // thread computes.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), valid) };
                    dst.copy_from_slice(&acc[..valid]);
                }
            }
        }
    };
    if threads == 1 {
        work(0, 1);
    } else {
        pool.run(&|ti, _| {
            if ti < threads {
                work(ti, threads)
            }
        });
    }
}

/// One tile: `tile[t][j] = Σ_c panel[c][j] · xs[t][c]` for the `tile.len()` (1 to 6) tokens.
fn kernel(panel: &[f32], xs: &[f32], cols: usize, tile: &mut [[f32; PANEL]]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: `use_avx2` checked AVX2 + FMA; the slices have the sizes the kernel reads.
        unsafe {
            return match tile.len() {
                6 => avx2::tile::<6>(panel, xs, cols, tile),
                5 => avx2::tile::<5>(panel, xs, cols, tile),
                4 => avx2::tile::<4>(panel, xs, cols, tile),
                3 => avx2::tile::<3>(panel, xs, cols, tile),
                2 => avx2::tile::<2>(panel, xs, cols, tile),
                _ => avx2::tile::<1>(panel, xs, cols, tile),
            };
        }
    }
    scalar_tile(panel, xs, cols, tile);
}

/// The scalar reference: the same FMA chain per output as the AVX2 kernel.
fn scalar_tile(panel: &[f32], xs: &[f32], cols: usize, tile: &mut [[f32; PANEL]]) {
    for (t, acc) in tile.iter_mut().enumerate() {
        let x = &xs[t * cols..][..cols];
        *acc = [0.0; PANEL];
        for (c, &xv) in x.iter().enumerate() {
            for (a, &wv) in acc.iter_mut().zip(&panel[c * PANEL..][..PANEL]) {
                *a = wv.mul_add(xv, *a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::PANEL;

    /// The `T × 16` register tile: `2·T` accumulators; per column two weight loads, `T`
    /// broadcasts, `2·T` FMAs.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `panel` holds `cols × 16` values, `xs` `T × cols`,
    /// `tile` `T` rows.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile<const T: usize>(
        panel: &[f32],
        xs: &[f32],
        cols: usize,
        tile: &mut [[f32; PANEL]],
    ) {
        debug_assert!(panel.len() >= cols * PANEL && xs.len() >= T * cols && tile.len() >= T);
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        let w = panel.as_ptr();
        let x = xs.as_ptr();
        for c in 0..cols {
            // SAFETY: c < cols, so both vectors lie in the panel and each x[t][c] in xs.
            let w0 = _mm256_loadu_ps(w.add(c * PANEL));
            let w1 = _mm256_loadu_ps(w.add(c * PANEL + 8));
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_broadcast_ss(&*x.add(t * cols + c));
                a[0] = _mm256_fmadd_ps(w0, xv, a[0]);
                a[1] = _mm256_fmadd_ps(w1, xv, a[1]);
            }
        }
        for (out, a) in tile.iter_mut().zip(&acc) {
            _mm256_storeu_ps(out.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::Rng;

    /// Against a plain f64 product, and bit-identical between the SIMD and scalar paths, any
    /// batch split and any thread count.
    #[test]
    fn matches_reference_and_is_batch_invariant() {
        let mut rng = Rng::new(7);
        for (rows, cols, n) in [(16, 8, 1), (37, 50, 7), (384, 96, 13), (5, 3, 2)] {
            let w = rng.f32s(rows * cols, 1.0);
            let x = rng.f32s(n * cols, 1.0);
            let packed = PackedF32::pack(&w, rows, cols);
            let mut y = vec![0f32; n * rows];
            gemm_f32(&ThreadPool::new(2), &packed, &x, &mut y);
            for t in 0..n {
                for r in 0..rows {
                    let want: f64 = (0..cols)
                        .map(|c| f64::from(w[r * cols + c]) * f64::from(x[t * cols + c]))
                        .sum();
                    assert!((f64::from(y[t * rows + r]) - want).abs() < 1e-4);
                }
            }
            // One token at a time, on one thread, and through the scalar reference.
            for t in 0..n {
                let mut one = vec![0f32; rows];
                gemm_f32(
                    &ThreadPool::new(1),
                    &packed,
                    &x[t * cols..(t + 1) * cols],
                    &mut one,
                );
                assert_eq!(one, y[t * rows..(t + 1) * rows]);
                for p in 0..rows.div_ceil(PANEL) {
                    let mut tile = [[0f32; PANEL]; 1];
                    scalar_tile(
                        packed.panel(p),
                        &x[t * cols..(t + 1) * cols],
                        cols,
                        &mut tile,
                    );
                    let valid = (rows - p * PANEL).min(PANEL);
                    assert_eq!(tile[0][..valid], one[p * PANEL..p * PANEL + valid]);
                }
            }
        }
    }
}
