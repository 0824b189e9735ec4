//! int16 GEMM for the BERT encoder: `y[t][r] ≈ Σ_c W[r][c]·x[t][c]` with both operands
//! quantized to 16-bit integers in blocks of [`BLOCK`] = 32 columns.
//!
//! Why: the f32 [`gemm_f32`](super::gemm_f32) already runs near the FMA peak (16 multiply-adds
//! per cycle per core on Zen 3), so only cheaper arithmetic makes the encoder faster. `vpmaddwd`
//! multiplies 16 pairs of int16 and adds neighbours into 8 int32 lanes, and issues twice per
//! cycle: 32 multiply-adds per cycle. Int8 (Q8_0) weights are too coarse for sentence
//! embeddings (cosine 0.9983–0.9996 against the reference), f16 weights would not be faster;
//! int16 with an `f32` scale per block of 32, on weights *and* activations, keeps MiniLM's
//! embeddings at cosine 1.0000000.
//!
//! Scheme (symmetric, per block of 32 columns):
//! - weights, at load: per (row, block) `s_w = max|w| / 8191`, `q_w = round(w / s_w)`;
//! - activations, per call: per (token, block) `s_x = max|x| / 8191`, `q_x` likewise, row by
//!   row (a row's quantization does not depend on the other rows of the batch);
//! - `y[t][r] = Σ_b (s_w[r][b] · s_x[t][b]) · Σ_{c in b} q_w[r][c]·q_x[t][c]`, the inner sum
//!   in exact int32 arithmetic, the outer one an `f32` FMA chain over the blocks in order.
//!
//! Overflow bound: `|q| ≤ 8191` for both operands (enforced by a clamp), so a product is at most
//! `8191² = 67,092,481` in magnitude and any partial sum of a block's 32 products at most
//! `32 · 8191² = 2,146,959,392 < 2³¹ − 1 = 2,147,483,647`: the int32 sums cannot overflow in any
//! order of summation (`vpmaddwd`'s pair sums included). Compared with the full int16 range
//! this costs 2 bits of 15, which the precision study showed not to matter.
//!
//! Layout: the weights are packed into panels of [`PANEL`] = 16 rows; within a panel, block by
//! block, column pair by column pair, two 32-byte vectors: rows 0–7 then rows 8–15, each holding
//! `(w[r][c], w[r][c+1])` for its 8 rows. One `vpmaddwd` of such a vector with a broadcast
//! activation pair `(x[c], x[c+1])` (`vpbroadcastd`) advances 8 rows' dot products by two
//! columns. The micro-kernel keeps a tile of up to [`TILE`] tokens × 16 rows.
//!
//! Determinism: each output is a function of its weight row and its activation row only — the
//! integer block sums are exact, and the `f32` operations (`s_w · s_x`, then one FMA per block
//! in block order) are the same whatever the tile size, the batch or the thread count, so
//! results are bit-identical across batch compositions. The scalar reference does the same
//! operations (`f32::mul_add` for the FMA) and gives the same bits as the AVX2 kernel; so does
//! the activation quantization (the same IEEE multiply, round-half-even and clamp).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::use_avx2;
use crate::threadpool::ThreadPool;

/// Columns per quantization block.
pub const BLOCK: usize = 32;
/// Rows per packed panel (two 8-lane vectors).
pub const PANEL: usize = 16;
/// Tokens per register tile.
pub const TILE: usize = 4;
/// The largest quantized magnitude (see the overflow bound in the module docs).
pub const QMAX: i32 = 8191;
/// Tokens per work item: the activations of one item stay in L2 while its panels pass.
const TOKEN_BLOCK: usize = 64;
/// Panels per work item: the weights of one panel stay in L1/L2 while the item's tokens pass.
const PANEL_GROUP: usize = 4;
/// int16 values per packed (panel, block): 16 column pairs × 2 halves × 16 values.
const PANEL_BLOCK: usize = BLOCK * PANEL;

/// A raw pointer that threads may share because each writes a disjoint part.
struct Shared<T>(*mut T);
// SAFETY: every user hands each thread disjoint elements (see the call sites).
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

/// Quantizes up to 32 values (`x.len() <= 32`) into `q[..32]` (zero past `x.len()`) and
/// returns the block's scale `max|x| / 8191` (0 for an all-zero block).
///
/// `q = clamp(round_half_even(x · (8191 / max|x|)), ±8191)`; NaN gives 0 (and is ignored by
/// the maximum). The AVX2 twin computes exactly these operations.
fn quantize_block(x: &[f32], q: &mut [i16]) -> f32 {
    let amax = x.iter().fold(0f32, |m, &v| v.abs().max(m));
    let inv = if amax > 0.0 { QMAX as f32 / amax } else { 0.0 };
    for (i, o) in q[..BLOCK].iter_mut().enumerate() {
        *o = match x.get(i) {
            // `as` maps NaN to 0 (the clamp keeps NaN).
            Some(&v) => (v * inv).round_ties_even().clamp(-QMAX as f32, QMAX as f32) as i16,
            None => 0,
        };
    }
    amax / QMAX as f32
}

/// A weight matrix packed for [`gemm_i16`] (see the module docs for the layout).
#[derive(Debug, Clone)]
pub struct PackedI16 {
    /// `panels × blocks × 512` int16.
    q: Vec<i16>,
    /// `panels × blocks × 16` scales (one per row of the panel).
    scales: Vec<f32>,
    rows: usize,
    cols: usize,
    blocks: usize,
}

impl PackedI16 {
    /// Quantizes and packs the row-major `rows × cols` matrix `w`; columns past `cols` (up to a
    /// multiple of 32) and rows past `rows` (up to a multiple of 16) are zero.
    ///
    /// # Panics
    /// If `w.len() != rows * cols` or `cols == 0`.
    pub fn pack(w: &[f32], rows: usize, cols: usize) -> PackedI16 {
        assert!(
            cols > 0 && w.len() == rows * cols,
            "PackedI16::pack: shape mismatch"
        );
        let blocks = cols.div_ceil(BLOCK);
        let panels = rows.div_ceil(PANEL);
        let mut q = vec![0i16; panels * blocks * PANEL_BLOCK];
        let mut scales = vec![0f32; panels * blocks * PANEL];
        let mut qb = [0i16; BLOCK];
        for (r, row) in w.chunks_exact(cols).enumerate() {
            let (p, i) = (r / PANEL, r % PANEL);
            // Row i of the panel: half i / 8, lane pair i % 8.
            let (half, lane) = (i / 8, 2 * (i % 8));
            for b in 0..blocks {
                let x = &row[b * BLOCK..cols.min((b + 1) * BLOCK)];
                scales[(p * blocks + b) * PANEL + i] = quantize_block(x, &mut qb);
                let dst = &mut q[(p * blocks + b) * PANEL_BLOCK..][..PANEL_BLOCK];
                for j in 0..BLOCK / 2 {
                    let at = (j * 2 + half) * 16 + lane;
                    dst[at] = qb[2 * j];
                    dst[at + 1] = qb[2 * j + 1];
                }
            }
        }
        PackedI16 {
            q,
            scales,
            rows,
            cols,
            blocks,
        }
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The packed quants and scales of panel `p`.
    fn panel(&self, p: usize) -> (&[i16], &[f32]) {
        (
            &self.q[p * self.blocks * PANEL_BLOCK..][..self.blocks * PANEL_BLOCK],
            &self.scales[p * self.blocks * PANEL..][..self.blocks * PANEL],
        )
    }
}

/// Activation rows quantized for [`gemm_i16`]: per row `blocks × 32` int16 (zero-padded) and
/// `blocks` scales. Reusable across calls ([`QuantizedRows::quantize`] resizes).
#[derive(Debug, Clone, Default)]
pub struct QuantizedRows {
    q: Vec<i16>,
    scales: Vec<f32>,
    n: usize,
    cols: usize,
    blocks: usize,
}

impl QuantizedRows {
    /// Quantizes the rows of `x` (`cols` values each), threads taking contiguous runs of rows.
    ///
    /// # Panics
    /// If `cols == 0` or `x` is not a whole number of rows.
    pub fn quantize(&mut self, pool: &ThreadPool, x: &[f32], cols: usize) {
        assert!(
            cols > 0 && x.len().is_multiple_of(cols),
            "QuantizedRows::quantize: x is not whole rows"
        );
        let n = x.len() / cols;
        let blocks = cols.div_ceil(BLOCK);
        let stride = blocks * BLOCK;
        self.q.resize(n * stride, 0);
        self.scales.resize(n * blocks, 0.0);
        (self.n, self.cols, self.blocks) = (n, cols, blocks);
        let nt = pool.n_threads().min(n / 16).max(1);
        let (q, s) = (
            Shared(self.q.as_mut_ptr()),
            Shared(self.scales.as_mut_ptr()),
        );
        let work = |ti: usize| {
            let (q, s) = (&q, &s);
            let (r0, r1) = (n * ti / nt, n * (ti + 1) / nt);
            // SAFETY: thread `ti` alone touches rows `r0..r1`, which lie inside the buffers
            // sized above.
            let (q, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(q.0.add(r0 * stride), (r1 - r0) * stride),
                    std::slice::from_raw_parts_mut(s.0.add(r0 * blocks), (r1 - r0) * blocks),
                )
            };
            for (r, (qr, sr)) in q
                .chunks_exact_mut(stride)
                .zip(s.chunks_exact_mut(blocks))
                .enumerate()
            {
                quantize_row(&x[(r0 + r) * cols..][..cols], qr, sr);
            }
        };
        if nt == 1 {
            work(0);
        } else {
            pool.run(&|ti, _| {
                if ti < nt {
                    work(ti)
                }
            });
        }
    }

    /// Number of rows.
    pub fn n(&self) -> usize {
        self.n
    }
}

/// One row: `q` holds `s.len()` blocks of 32.
fn quantize_row(x: &[f32], q: &mut [i16], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        for (b, (qb, sb)) in q.chunks_exact_mut(BLOCK).zip(s.iter_mut()).enumerate() {
            let xb = &x[b * BLOCK..x.len().min((b + 1) * BLOCK)];
            *sb = if xb.len() == BLOCK {
                // SAFETY: AVX2 checked; 32 values in and out.
                unsafe { avx2::quantize_block(xb, qb) }
            } else {
                quantize_block(xb, qb)
            };
        }
        return;
    }
    quantize_row_scalar(x, q, s);
}

/// The scalar reference of [`quantize_row`].
fn quantize_row_scalar(x: &[f32], q: &mut [i16], s: &mut [f32]) {
    for (b, (qb, sb)) in q.chunks_exact_mut(BLOCK).zip(s.iter_mut()).enumerate() {
        *sb = quantize_block(&x[b * BLOCK..x.len().min((b + 1) * BLOCK)], qb);
    }
}

/// `y[t * rows + r] = Σ_c W[r][c] · x[t][c] (+ bias[r])` for the `n` rows of `x`, both
/// quantized as the module docs describe.
///
/// Work items are (group of 4 panels, block of 64 tokens), panel-group major, handed out by an
/// atomic counter, so a thread whose core is shared with another process simply takes fewer.
///
/// # Panics
/// If `x` was quantized with a different number of columns, `y` is not `n × rows`, or `bias`
/// is not `rows` long.
pub fn gemm_i16(
    pool: &ThreadPool,
    w: &PackedI16,
    x: &QuantizedRows,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let (rows, n) = (w.rows, x.n);
    assert_eq!(x.cols, w.cols, "gemm_i16: x has the wrong width");
    assert_eq!(y.len(), n * rows, "gemm_i16: y has the wrong size");
    if let Some(b) = bias {
        assert_eq!(b.len(), rows, "gemm_i16: bias has the wrong size");
    }
    let panels = rows.div_ceil(PANEL);
    let groups = panels.div_ceil(PANEL_GROUP);
    let tblocks = n.div_ceil(TOKEN_BLOCK);
    let items = groups * tblocks;
    let next = AtomicUsize::new(0);
    let out = Shared(y.as_mut_ptr());
    let work = || {
        let out = &out;
        let mut tile = [[0f32; PANEL]; TILE];
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                break;
            }
            let (g, tb) = (item / tblocks, item % tblocks);
            let (ta, tz) = (tb * TOKEN_BLOCK, n.min((tb + 1) * TOKEN_BLOCK));
            for p in g * PANEL_GROUP..panels.min((g + 1) * PANEL_GROUP) {
                let valid = (rows - p * PANEL).min(PANEL);
                for t0 in (ta..tz).step_by(TILE) {
                    let tokens = (tz - t0).min(TILE);
                    kernel(w, p, x, t0, &mut tile[..tokens]);
                    for (t, acc) in tile[..tokens].iter().enumerate() {
                        let at = (t0 + t) * rows + p * PANEL;
                        // SAFETY: `at + valid <= n * rows = y.len()`; the columns
                        // `p*16..p*16+valid` of the rows `ta..tz` belong to this work item,
                        // which only this thread computes.
                        let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), valid) };
                        match bias {
                            Some(b) => {
                                for ((d, &a), &b) in dst.iter_mut().zip(acc).zip(&b[p * PANEL..]) {
                                    *d = a + b;
                                }
                            }
                            None => dst.copy_from_slice(&acc[..valid]),
                        }
                    }
                }
            }
        }
    };
    // Small products run on the calling thread alone.
    if n * rows * w.cols < 64 * 1024 || items == 1 || pool.n_threads() == 1 {
        work();
    } else {
        pool.run(&|_, _| work());
    }
}

/// One tile: `tile[t][j]` = output row `16p + j` of token `t0 + t`, for `tile.len()` (1 to 4)
/// tokens.
fn kernel(w: &PackedI16, p: usize, x: &QuantizedRows, t0: usize, tile: &mut [[f32; PANEL]]) {
    let (wq, ws) = w.panel(p);
    let nb = w.blocks;
    let xq = &x.q[t0 * nb * BLOCK..(t0 + tile.len()) * nb * BLOCK];
    let xs = &x.scales[t0 * nb..(t0 + tile.len()) * nb];
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: `use_avx2` checked AVX2 + FMA; the slices have the sizes the kernel reads.
        unsafe {
            return match tile.len() {
                4 => avx2::tile::<4>(wq, ws, xq, xs, nb, tile),
                3 => avx2::tile::<3>(wq, ws, xq, xs, nb, tile),
                2 => avx2::tile::<2>(wq, ws, xq, xs, nb, tile),
                _ => avx2::tile::<1>(wq, ws, xq, xs, nb, tile),
            };
        }
    }
    scalar_tile(wq, ws, xq, xs, nb, tile);
}

/// The scalar reference: per output, the exact int32 sum of each block, then
/// `acc = fma(sum, s_w · s_x, acc)` over the blocks in order, as the AVX2 kernel does.
fn scalar_tile(
    wq: &[i16],
    ws: &[f32],
    xq: &[i16],
    xs: &[f32],
    nb: usize,
    tile: &mut [[f32; PANEL]],
) {
    for (t, out) in tile.iter_mut().enumerate() {
        for (i, o) in out.iter_mut().enumerate() {
            let (half, lane) = (i / 8, 2 * (i % 8));
            let mut acc = 0f32;
            for b in 0..nb {
                let wb = &wq[b * PANEL_BLOCK..][..PANEL_BLOCK];
                let xb = &xq[(t * nb + b) * BLOCK..][..BLOCK];
                let mut sum = 0i32;
                for j in 0..BLOCK / 2 {
                    let at = (j * 2 + half) * 16 + lane;
                    sum += i32::from(wb[at]) * i32::from(xb[2 * j])
                        + i32::from(wb[at + 1]) * i32::from(xb[2 * j + 1]);
                }
                let s = ws[b * PANEL + i] * xs[t * nb + b];
                acc = (sum as f32).mul_add(s, acc);
            }
            *o = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, PANEL, PANEL_BLOCK, QMAX};

    /// The AVX2 twin of [`super::quantize_block`] for a full block of 32.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `x` and `q` hold at least 32 values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_block(x: &[f32], q: &mut [i16]) -> f32 {
        debug_assert!(x.len() >= BLOCK && q.len() >= BLOCK);
        let p = x.as_ptr();
        let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
        // max |x|: `max_ps(a, m)` returns `m` when `a` is NaN, as `f32::max` ignores NaN.
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for &vi in &v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        let amax = _mm_cvtss_f32(h);
        let inv = if amax > 0.0 { QMAX as f32 / amax } else { 0.0 };
        let (vinv, hi, lo) = (
            _mm256_set1_ps(inv),
            _mm256_set1_ps(QMAX as f32),
            _mm256_set1_ps(-QMAX as f32),
        );
        // Per value: round-half-even(x · inv), clamped to ±8191, NaN → 0, to int32.
        let i = v.map(|vi| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(vi, vinv),
            );
            let c = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
            _mm256_cvtps_epi32(_mm256_and_ps(c, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r)))
        });
        // Pack to int16 (in range, no saturation); packs works per 128-bit lane, the permute
        // restores the order.
        let a = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[0], i[1]));
        let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, a);
        _mm256_storeu_si256(q.as_mut_ptr().add(16) as *mut __m256i, b);
        amax / QMAX as f32
    }

    /// The `T × 16` register tile.
    ///
    /// Per block: per column pair, two weight vectors (rows 0–7, rows 8–15, each with the
    /// pair's two columns interleaved) times `T` broadcast activation pairs: `2·T` `vpmaddwd`
    /// (each 8 rows × 2 columns) added into `2·T` int32 accumulators. Then per token the
    /// block's exact int32 sums are converted and FMA'd into the `f32` accumulators with
    /// `s_w · s_x` (8 row scales times the token's block scale).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `wq` holds `nb × 512` values, `ws` `nb × 16`, `xq`
    /// `T × nb × 32`, `xs` `T × nb`, `tile` `T` rows.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile<const T: usize>(
        wq: &[i16],
        ws: &[f32],
        xq: &[i16],
        xs: &[f32],
        nb: usize,
        tile: &mut [[f32; PANEL]],
    ) {
        debug_assert!(wq.len() >= nb * PANEL_BLOCK && ws.len() >= nb * PANEL);
        debug_assert!(xq.len() >= T * nb * BLOCK && xs.len() >= T * nb && tile.len() >= T);
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        let (w, s, x, xsp) = (wq.as_ptr(), ws.as_ptr(), xq.as_ptr(), xs.as_ptr());
        let stride = nb * BLOCK;
        for b in 0..nb {
            let wb = w.add(b * PANEL_BLOCK);
            let xb = x.add(b * BLOCK);
            let mut isum = [[_mm256_setzero_si256(); 2]; T];
            for j in 0..BLOCK / 2 {
                // SAFETY (all loads): j < 16 pairs of block b < nb, inside the slices.
                let w0 = _mm256_loadu_si256(wb.add(j * 32) as *const __m256i);
                let w1 = _mm256_loadu_si256(wb.add(j * 32 + 16) as *const __m256i);
                for (t, a) in isum.iter_mut().enumerate() {
                    // (x[c], x[c+1]) of token t in all 8 int32 lanes.
                    let pair = (xb.add(t * stride + 2 * j) as *const i32).read_unaligned();
                    let xv = _mm256_set1_epi32(pair);
                    a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(w0, xv));
                    a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(w1, xv));
                }
            }
            let s0 = _mm256_loadu_ps(s.add(b * PANEL));
            let s1 = _mm256_loadu_ps(s.add(b * PANEL + 8));
            for (t, (a, i)) in acc.iter_mut().zip(&isum).enumerate() {
                let sx = _mm256_set1_ps(*xsp.add(t * nb + b));
                a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[0]), _mm256_mul_ps(s0, sx), a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[1]), _mm256_mul_ps(s1, sx), a[1]);
            }
        }
        for (out, a) in tile.iter_mut().zip(&acc) {
            _mm256_storeu_ps(out.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), a[1]);
        }
    }
}

#[cfg(test)]
#[path = "gemm_i16_tests.rs"]
mod tests;
