//! Activation quantization: `f32` rows to the 8-bit block formats the dot products consume.
//!
//! The rounding is ggml's *x86* rounding, because llama.cpp's outputs on x86 are the reference:
//! for Q8_0/Q8_1, `d = amax / 127`, each `q = round_half_even(x · (127 / amax))` (ggml's AVX2
//! `quantize_row_q8_0/1`), the stored `d` rounded to f16, and Q8_1's `s = f16(d · Σq)`; for Q8_K
//! (ggml's `quantize_row_q8_K_ref`, used on x86 too), `iscale = -127 / max` where `max` is the
//! first element of largest magnitude, `q = min(127, round_half_even(iscale · x))`,
//! `d = 1 / iscale` kept in `f32`, and the sums of every 16 quants.
//!
//! Unlike ggml, a row is stored as separate arrays (quants, scales, sums), with the f16 scales
//! already widened to `f32`: the kernels load them directly. Values are bit-identical to ggml's.
//!
//! The AVX2 Q8_K quantizer is the scalar code compiled with AVX2 enabled (LLVM vectorizes it;
//! Rust never fuses `a * b + c`, so both give identical bytes). The AVX2 Q8_0 / Q8_1 ones work
//! a block on 4 registers (`avx2::block`): the same bytes for finite values; a row holding an
//! infinity or NaN (a broken model's activations) may give other garbage than the scalar
//! path.

use half::f16;

use crate::threadpool::ThreadPool;

/// Elements per Q8_0 / Q8_1 block.
pub const QK8: usize = 32;
/// Elements per Q8_K block.
pub const QK_K: usize = 256;

/// One activation row quantized to Q8_0 (pairs with Q4_0, Q5_0 and Q8_0 weights), or several
/// back to back (as the interleaved kernels take them).
#[derive(Clone, Copy, Debug)]
pub struct Q8_0Row<'a> {
    /// The quants, a whole number of 32-element blocks.
    pub qs: &'a [i8],
    /// Per block: the scale `d`, an f16 value widened to `f32`.
    pub d: &'a [f32],
}

/// One activation row quantized to Q8_1 (pairs with Q4_1 and Q5_1 weights), or several back
/// to back (as the interleaved kernels take them).
#[derive(Clone, Copy, Debug)]
pub struct Q8_1Row<'a> {
    /// The quants, a whole number of 32-element blocks.
    pub qs: &'a [i8],
    /// Per block: `[d, s]`, the scale and `s = d · Σq`, both f16 values widened to `f32`.
    pub ds: &'a [[f32; 2]],
}

/// One activation row quantized to Q8_K (pairs with Q4_K, Q5_K and Q6_K weights), or several
/// back to back (as the interleaved kernels take them).
#[derive(Clone, Copy, Debug)]
pub struct Q8KRow<'a> {
    /// The quants, a whole number of 256-element blocks.
    pub qs: &'a [i8],
    /// Per block: the `f32` scale `d`.
    pub d: &'a [f32],
    /// Per 16 quants: their sum (16 per block).
    pub bsums: &'a [i16],
}

/// `round_half_even(v)` for `|v| < 2^22`, by ggml's `nearest_int` trick: adding 1.5 · 2^23
/// rounds to an integer in the FPU's round-to-nearest-even mode. Vectorizes without SSE4.1.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Largest `|x|` of a slice (0 for an empty or all-zero slice; NaNs are passed over).
///
/// Eight running maxima, one per lane of an AVX2 register, merged at the end: a single
/// `f32::max` chain cannot be vectorized (its NaN rule forces a compare and blend per value)
/// and was most of the cost of quantizing a row (Q8_K; the scalar Q8_0 / Q8_1). `a > m` keeps
/// `m` when `a` is NaN, as `f32::max` does, and a maximum is the same whatever the order it is
/// taken in, so the result is the same bits as the one chain's.
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    #[inline(always)]
    fn larger(m: f32, v: f32) -> f32 {
        let a = v.abs();
        if a > m {
            a
        } else {
            m
        }
    }
    let mut lanes = [0f32; 8];
    let (chunks, rest) = x.as_chunks::<8>();
    for c in chunks {
        for l in 0..8 {
            lanes[l] = larger(lanes[l], c[l]);
        }
    }
    let m = lanes.iter().fold(0f32, |m, &v| larger(m, v));
    rest.iter().fold(m, |m, &v| larger(m, v))
}

/// `v` rounded to the nearest f16 (ties to even) and widened back: the `half` crate's
/// conversion, which checks for F16C on every call.
#[inline(always)]
fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

#[inline(always)]
fn q8_0_body(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), db) in x.chunks_exact(QK8).zip(qs.chunks_exact_mut(QK8)).zip(d) {
        let amax = abs_max(xb);
        *db = round_f16(amax / 127.0);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = nearest_int(v * id) as i8; // |v · id| <= 127
        }
    }
}

#[inline(always)]
fn q8_1_body(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) {
    for ((xb, qb), dsb) in x.chunks_exact(QK8).zip(qs.chunks_exact_mut(QK8)).zip(ds) {
        let amax = abs_max(xb);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            let i = nearest_int(v * id);
            sum += i;
            *q = i as i8;
        }
        // ggml multiplies the unrounded f32 `d` by the integer sum, then rounds to f16.
        *dsb = [round_f16(d), round_f16(d * sum as f32)];
    }
}

#[inline(always)]
fn q8_k_body(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let blocks = x
        .chunks_exact(QK_K)
        .zip(qs.chunks_exact_mut(QK_K))
        .zip(d.iter_mut().zip(bsums.chunks_exact_mut(QK_K / 16)));
    for ((xb, qb), (db, sb)) in blocks {
        let amax = abs_max(xb);
        if amax == 0.0 {
            *db = 0.0;
            qb.fill(0);
            sb.fill(0);
            continue;
        }
        // The signed value of the first element of largest magnitude (ggml scans with `>`).
        let max = *xb.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0 / max;
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q16) in sb.iter_mut().zip(qb.chunks_exact(16)) {
            *s = q16.iter().map(|&q| i16::from(q)).sum();
        }
        *db = 1.0 / iscale;
    }
}

/// Scalar references (the contract of each public quantizer).
pub mod scalar {
    use super::*;

    /// Quantizes `x` (a multiple of 32 values) to Q8_0: `qs` one per value, `d` one per block.
    pub fn quantize_row_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
        q8_0_body(x, qs, d)
    }

    /// Quantizes `x` (a multiple of 32 values) to Q8_1: `qs` one per value, `ds` one per block.
    pub fn quantize_row_q8_1(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) {
        q8_1_body(x, qs, ds)
    }

    /// Quantizes `x` (a multiple of 256 values) to Q8_K: `qs` one per value, `d` one per
    /// block, `bsums` one per 16 values.
    pub fn quantize_row_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
        q8_k_body(x, qs, d, bsums)
    }
}

/// The quantizers for AVX2: Q8_K the scalar code compiled for it, Q8_0 / Q8_1 on registers
/// (the same bytes for finite values; see `block`).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;

    /// AVX2 twin of [`scalar::quantize_row_q8_0`] (the same bytes for finite values).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_row_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
        let (xs, qbs) = (x.as_chunks::<QK8>().0, qs.as_chunks_mut::<QK8>().0);
        for ((xb, qb), db) in xs.iter().zip(qbs).zip(d) {
            let (amax, _) = block(xb, qb);
            *db = round_f16_f16c(amax / 127.0);
        }
    }

    /// AVX2 twin of [`scalar::quantize_row_q8_1`] (the same bytes for finite values).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_row_q8_1(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) {
        let (xs, qbs) = (x.as_chunks::<QK8>().0, qs.as_chunks_mut::<QK8>().0);
        for ((xb, qb), dsb) in xs.iter().zip(qbs).zip(ds) {
            let (amax, sum) = block(xb, qb);
            let d = amax / 127.0;
            *dsb = [round_f16_f16c(d), round_f16_f16c(d * sum as f32)];
        }
    }

    /// One 32-value block of [`q8_0_body`] / [`q8_1_body`] on 4 registers: its quants into
    /// `qb`, and its largest magnitude and the sum of its quants. The same operations, so the
    /// same bits for finite values: the maximum of the magnitudes (`vmaxps(|v|, m)` keeps `m`
    /// for a NaN, as [`abs_max`] does), `v · (127 / amax)` rounded to nearest-even by
    /// `vcvtps2dq` (the rounding [`nearest_int`] gets from its bit trick), the integer sum.
    /// LLVM's build of the scalar body spent its time packing and summing lane by lane: this
    /// made SmolLM2's tg128 1–4% faster.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn block(xb: &[f32; QK8], qb: &mut [i8; QK8]) -> (f32, i32) {
        use std::arch::x86_64::*;
        // SAFETY (every load and store below): the arrays hold the 32 values read or written.
        let v = [0, 8, 16, 24].map(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(i)) });
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for x in v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, x), m);
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q = v.map(|x| _mm256_cvtps_epi32(_mm256_mul_ps(x, id)));
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)));
        // |q| <= 127, so the saturating packs are exact. Each 128-bit half of `b` holds dwords
        // q0 q1 q2 q3 of 4 values each (the first 4 values of each register, then the last 4);
        // the permutation puts them back in order.
        let b = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        unsafe { _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, b) };
        (amax, sum)
    }

    /// [`super::round_f16`] by one F16C instruction each way, inline (the same rounding:
    /// to nearest, ties to even), for the scales of every 32-value block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn round_f16_f16c(v: f32) -> f32 {
        use std::arch::x86_64::*;
        let h = _mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(v));
        _mm_cvtss_f32(_mm_cvtph_ps(h))
    }

    /// AVX2 build of [`scalar::quantize_row_q8_k`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_row_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
        q8_k_body(x, qs, d, bsums)
    }
}

/// Checks the buffer lengths shared by the quantizers.
fn check(x: &[f32], qk: usize, qs: &[i8], n_scales: usize) {
    assert!(
        x.len().is_multiple_of(qk),
        "row length must be a multiple of {qk}"
    );
    assert_eq!(qs.len(), x.len(), "one quant per value");
    assert_eq!(n_scales, x.len() / qk, "one scale per block");
}

/// Quantizes `x` to Q8_0 (see the module docs for the rounding).
///
/// # Panics
/// If `x.len()` is not a multiple of 32, `qs.len() != x.len()` or `d.len() != x.len() / 32`.
pub fn quantize_row_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    check(x, QK8, qs, d.len());
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected.
        return unsafe { avx2::quantize_row_q8_0(x, qs, d) };
    }
    scalar::quantize_row_q8_0(x, qs, d)
}

/// Quantizes `x` to Q8_1 (see the module docs for the rounding).
///
/// # Panics
/// If `x.len()` is not a multiple of 32, `qs.len() != x.len()` or `ds.len() != x.len() / 32`.
pub fn quantize_row_q8_1(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) {
    check(x, QK8, qs, ds.len());
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected.
        return unsafe { avx2::quantize_row_q8_1(x, qs, ds) };
    }
    scalar::quantize_row_q8_1(x, qs, ds)
}

/// Quantizes `x` to Q8_K (see the module docs for the rounding).
///
/// # Panics
/// If `x.len()` is not a multiple of 256, `qs.len() != x.len()`, `d.len() != x.len() / 256`
/// or `bsums.len() != x.len() / 16`.
pub fn quantize_row_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    check(x, QK_K, qs, d.len());
    assert_eq!(bsums.len(), x.len() / 16, "one sum per 16 values");
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected.
        return unsafe { avx2::quantize_row_q8_k(x, qs, d, bsums) };
    }
    scalar::quantize_row_q8_k(x, qs, d, bsums)
}

/// The activation formats, by the weight types they pair with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActFormat {
    Q8_0,
    Q8_1,
    Q8K,
}

/// A batch of quantized activation rows; buffers grow as needed and never shrink.
#[derive(Default)]
pub(crate) struct Q8Batch {
    qs: Vec<i8>,
    d: Vec<f32>,
    ds: Vec<[f32; 2]>,
    bsums: Vec<i16>,
    cols: usize,
}

/// Grows `v` to at least `n` elements (never shrinks, so steady-state calls never allocate).
fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Raw pointers to the batch buffers, shared by the threads of a parallel quantization.
#[derive(Clone, Copy)]
struct Parts {
    qs: *mut i8,
    d: *mut f32,
    ds: *mut [f32; 2],
    bsums: *mut i16,
}

// SAFETY: each thread derives slices for a disjoint range of tokens only (see `quantize`).
unsafe impl Send for Parts {}
// SAFETY: as above.
unsafe impl Sync for Parts {}

/// Tokens from which quantization is split over the pool's threads.
const PARALLEL_TOKENS: usize = 16;

impl Q8Batch {
    /// Quantizes `n_tokens` rows of `cols` values from `x` into `format`, splitting the rows
    /// over `pool`'s threads for large batches.
    pub fn quantize(
        &mut self,
        pool: Option<&ThreadPool>,
        format: ActFormat,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) {
        let n = n_tokens * cols;
        let x = &x[..n];
        let qk = if format == ActFormat::Q8K { QK_K } else { QK8 };
        assert!(
            cols.is_multiple_of(qk),
            "row length must be a multiple of {qk}"
        );
        self.cols = cols;
        grow(&mut self.qs, n);
        match format {
            ActFormat::Q8_0 => grow(&mut self.d, n / QK8),
            ActFormat::Q8_1 => grow(&mut self.ds, n / QK8),
            ActFormat::Q8K => {
                grow(&mut self.d, n / QK_K);
                grow(&mut self.bsums, n / 16);
            }
        }
        let parts = Parts {
            qs: self.qs.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            ds: self.ds.as_mut_ptr(),
            bsums: self.bsums.as_mut_ptr(),
        };
        // Quantizes tokens t0..t1 (rows are whole blocks, so a range is one long row).
        let rows = |t0: usize, t1: usize| {
            let parts = &parts; // capture the whole (Sync) struct, not its raw-pointer fields
            let (a, b) = (t0 * cols, t1 * cols);
            let xs = &x[a..b];
            // SAFETY: the buffers hold at least n_tokens rows (grown above); the ranges of
            // different calls are disjoint token ranges, so the slices never overlap.
            unsafe {
                let qs = std::slice::from_raw_parts_mut(parts.qs.add(a), b - a);
                match format {
                    ActFormat::Q8_0 => {
                        let d = std::slice::from_raw_parts_mut(parts.d.add(a / QK8), (b - a) / QK8);
                        quantize_row_q8_0(xs, qs, d);
                    }
                    ActFormat::Q8_1 => {
                        let ds =
                            std::slice::from_raw_parts_mut(parts.ds.add(a / QK8), (b - a) / QK8);
                        quantize_row_q8_1(xs, qs, ds);
                    }
                    ActFormat::Q8K => {
                        let d =
                            std::slice::from_raw_parts_mut(parts.d.add(a / QK_K), (b - a) / QK_K);
                        let bs =
                            std::slice::from_raw_parts_mut(parts.bsums.add(a / 16), (b - a) / 16);
                        quantize_row_q8_k(xs, qs, d, bs);
                    }
                }
            }
        };
        match pool {
            Some(pool) if pool.n_threads() > 1 && n_tokens >= PARALLEL_TOKENS => {
                pool.run(&|i, nt| rows(n_tokens * i / nt, n_tokens * (i + 1) / nt));
            }
            _ => rows(0, n_tokens),
        }
    }

    /// Row `t` of a batch quantized to Q8_0.
    pub fn q8_0(&self, t: usize) -> Q8_0Row<'_> {
        self.q8_0_rows(t, 1)
    }

    /// Rows `t..t + n` of a batch quantized to Q8_0, back to back in one [`Q8_0Row`].
    pub fn q8_0_rows(&self, t: usize, n: usize) -> Q8_0Row<'_> {
        let (c, nb) = (self.cols, self.cols / QK8);
        Q8_0Row {
            qs: &self.qs[t * c..(t + n) * c],
            d: &self.d[t * nb..(t + n) * nb],
        }
    }

    /// Row `t` of a batch quantized to Q8_1.
    pub fn q8_1(&self, t: usize) -> Q8_1Row<'_> {
        self.q8_1_rows(t, 1)
    }

    /// Rows `t..t + n` of a batch quantized to Q8_1, back to back in one [`Q8_1Row`].
    pub fn q8_1_rows(&self, t: usize, n: usize) -> Q8_1Row<'_> {
        let (c, nb) = (self.cols, self.cols / QK8);
        Q8_1Row {
            qs: &self.qs[t * c..(t + n) * c],
            ds: &self.ds[t * nb..(t + n) * nb],
        }
    }

    /// Row `t` of a batch quantized to Q8_K.
    pub fn q8_k(&self, t: usize) -> Q8KRow<'_> {
        self.q8_k_rows(t, 1)
    }

    /// Rows `t..t + n` of a batch quantized to Q8_K, back to back in one [`Q8KRow`].
    pub fn q8_k_rows(&self, t: usize, n: usize) -> Q8KRow<'_> {
        let (c, nb) = (self.cols, self.cols / QK_K);
        Q8KRow {
            qs: &self.qs[t * c..(t + n) * c],
            d: &self.d[t * nb..(t + n) * nb],
            bsums: &self.bsums[t * (c / 16)..(t + n) * (c / 16)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::Rng;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (126.6, 127),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
            assert_eq!(nearest_int(v), v.round_ties_even() as i32);
        }
    }

    /// The eight-lane scan equals one `f32::max` chain for every length (remainders included),
    /// with NaNs, infinities and signed zeros among the values.
    #[test]
    fn abs_max_equals_one_max_chain() {
        let mut rng = Rng::new(9);
        for len in [0, 1, 7, 8, 9, 31, 32, 33, 100] {
            let mut x = rng.f32s(len, 4.0);
            for (i, special) in [f32::NAN, -0.0, f32::NEG_INFINITY, -f32::NAN]
                .iter()
                .enumerate()
            {
                if len > 3 * i + 1 {
                    x[3 * i + 1] = *special;
                }
                let want = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert_eq!(abs_max(&x).to_bits(), want.to_bits(), "{len} values: {x:?}");
            }
        }
    }

    #[test]
    fn q8_0_matches_ggml_x86_formula() {
        let mut rng = Rng::new(1);
        let x = rng.f32s(256, 3.0);
        let (mut qs, mut d) = (vec![0i8; 256], vec![0f32; 8]);
        scalar::quantize_row_q8_0(&x, &mut qs, &mut d);
        for b in 0..8 {
            let xb = &x[32 * b..32 * b + 32];
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(d[b], f16::from_f32(amax / 127.0).to_f32());
            for j in 0..32 {
                let want = (xb[j] * (127.0 / amax)).round_ties_even() as i8;
                assert_eq!(qs[32 * b + j], want);
                assert!((xb[j] - d[b] * qs[32 * b + j] as f32).abs() <= d[b] * 0.51 + 1e-3);
            }
        }
    }

    #[test]
    fn q8_1_sum_and_zero_block() {
        let mut x = Rng::new(2).f32s(64, 1.0);
        x[32..].fill(0.0);
        let (mut qs, mut ds) = (vec![0i8; 64], vec![[0f32; 2]; 2]);
        scalar::quantize_row_q8_1(&x, &mut qs, &mut ds);
        let sum: i32 = qs[..32].iter().map(|&q| q as i32).sum();
        let amax = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(ds[0][1], f16::from_f32(amax / 127.0 * sum as f32).to_f32());
        assert_eq!(ds[1], [0.0, 0.0]);
        assert!(qs[32..].iter().all(|&q| q == 0));
    }

    #[test]
    fn q8_k_uses_signed_max_and_sums() {
        let mut rng = Rng::new(3);
        let mut x = rng.f32s(512, 2.0);
        x[10] = -9.0; // the largest magnitude maps to -127 whatever its sign
        x[256..].fill(0.0);
        let (mut qs, mut d, mut bs) = (vec![0i8; 512], vec![0f32; 2], vec![0i16; 32]);
        scalar::quantize_row_q8_k(&x, &mut qs, &mut d, &mut bs);
        assert_eq!(qs[10], -127);
        assert_eq!(d[0], 1.0 / (-127.0 / -9.0));
        for g in 0..16 {
            let s: i16 = qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
            assert_eq!(bs[g], s);
        }
        assert_eq!(d[1], 0.0);
        assert!(bs[16..].iter().all(|&s| s == 0));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_builds_are_bit_identical() {
        if !super::super::SimdLevel::Avx2.available() {
            return;
        }
        let mut rng = Rng::new(4);
        let mut x = rng.f32s(1024, 5.0);
        // A zero block, a block with one huge value, and values on rounding ties.
        x[64..96].fill(0.0);
        x[100] = 3e30;
        for (i, v) in x[128..160].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 0.5; // amax 8: v · 127/8 lands on halves
        }
        let (mut q1, mut q2) = (vec![0i8; 1024], vec![0i8; 1024]);
        let (mut d1, mut d2) = (vec![0f32; 32], vec![0f32; 32]);
        scalar::quantize_row_q8_0(&x, &mut q1, &mut d1);
        // SAFETY: AVX2/FMA/F16C were detected above.
        unsafe { avx2::quantize_row_q8_0(&x, &mut q2, &mut d2) };
        assert_eq!((&q1, &d1), (&q2, &d2));

        let (mut s1, mut s2) = (vec![[0f32; 2]; 32], vec![[0f32; 2]; 32]);
        scalar::quantize_row_q8_1(&x, &mut q1, &mut s1);
        // SAFETY: as above.
        unsafe { avx2::quantize_row_q8_1(&x, &mut q2, &mut s2) };
        assert_eq!((&q1, &s1), (&q2, &s2));

        let (mut b1, mut b2) = (vec![0i16; 64], vec![0i16; 64]);
        scalar::quantize_row_q8_k(&x, &mut q1, &mut d1[..4], &mut b1);
        // SAFETY: as above.
        unsafe { avx2::quantize_row_q8_k(&x, &mut q2, &mut d2[..4], &mut b2) };
        assert_eq!((&q1, &d1[..4], &b1), (&q2, &d2[..4], &b2));
    }
}
