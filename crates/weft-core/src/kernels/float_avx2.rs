//! AVX2 + FMA + F16C twins of the kernels in `float` (same names and contracts).
//!
//! The vector dot products of attention (`dot_f32`, `dot_f32_f16`) keep 4 independent
//! accumulators (32 values per iteration) so the FMA latency is hidden; f16 values are widened
//! 8 at a time with `vcvtph2ps`. The weight-row kernels of matmul (`vec_dot_*_bytes`, one
//! token, and the tiles `vec_dots_*`) are one function that loads each 8 weights once for 1 to
//! 4 activation rows, with two accumulators per row, so a token's result does not depend on
//! how it is batched. Every function is `unsafe` only because it needs AVX2, FMA and F16C:
//! lengths are checked.

use std::arch::x86_64::*;

use half::f16;

use super::x86::hsum_ps;

/// 8 weights at `p` widened to `f32`: `F16` = the row holds f16, else f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const F16: bool>(p: *const u8, i: usize) -> __m256 {
    if F16 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
    } else {
        _mm256_loadu_ps(p.add(4 * i) as *const f32)
    }
}

/// One weight value at element `i`, widened (for the scalar tails).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load1<const F16: bool>(p: *const u8, i: usize) -> f32 {
    if F16 {
        f16::from_bits((p.add(2 * i) as *const u16).read_unaligned()).to_f32()
    } else {
        (p.add(4 * i) as *const f32).read_unaligned()
    }
}

/// `Σ w[i] · a[i]` for `n` weights at `w` (f16 or f32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const F16: bool>(w: *const u8, a: &[f32]) -> f32 {
    let (n, ap) = (a.len(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (u, acc) in acc.iter_mut().enumerate() {
            let j = i + 8 * u;
            *acc = _mm256_fmadd_ps(load8::<F16>(w, j), _mm256_loadu_ps(ap.add(j)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load8::<F16>(w, i), _mm256_loadu_ps(ap.add(i)), acc[0]);
        i += 8;
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        sum += load1::<F16>(w, i) * a[i];
        i += 1;
    }
    sum
}

/// One weight row (f16 or f32 at `w`, `n` values) · `T` activation rows (with `T = 1`, the
/// GEMV of a matmul).
///
/// Every token's result is computed by the same sequence of floating-point operations whatever
/// `T` is and whichever slot the token occupies: per token, two vector accumulators take
/// alternate groups of 8 values (16 per iteration; a last group of 8 goes to the first), the
/// result is `hsum(acc0 + acc1)` followed by the scalar tail in order (`s + w·y`, not fused).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const F16: bool, const T: usize>(
    w: *const u8,
    n: usize,
    ys: &[&[f32]],
    out: &mut [f32],
) {
    let (ys, out) = (&ys[..T], &mut out[..T]);
    for y in ys {
        assert_eq!(y.len(), n, "shape mismatch");
    }
    let yp: [*const f32; T] = std::array::from_fn(|t| ys[t].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    let mut i = 0;
    while i + 16 <= n {
        for (u, acc) in acc.iter_mut().enumerate() {
            let j = i + 8 * u;
            let wv = load8::<F16>(w, j);
            for t in 0..T {
                acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(yp[t].add(j)), acc[t]);
            }
        }
        i += 16;
    }
    if i + 8 <= n {
        let wv = load8::<F16>(w, i);
        for t in 0..T {
            acc[0][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(yp[t].add(i)), acc[0][t]);
        }
        i += 8;
    }
    for t in 0..T {
        let tail = ys[t][i..].iter().enumerate();
        let sum = hsum_ps(_mm256_add_ps(acc[0][t], acc[1][t]));
        out[t] = tail.fold(sum, |s, (j, &y)| s + load1::<F16>(w, i + j) * y);
    }
}

/// AVX2 twin of [`super::float::dot_f32`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "shape mismatch");
    dot::<false>(b.as_ptr() as *const u8, a)
}

/// AVX2 twin of [`super::float::dot_f32_f16`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "shape mismatch");
    dot::<true>(b.as_ptr() as *const u8, a)
}

/// AVX2 twin of [`super::float::vec_dot_f32_bytes`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_f32_bytes(x: &[u8], a: &[f32]) -> f32 {
    assert_eq!(x.len(), 4 * a.len(), "shape mismatch");
    let mut out = [0f32];
    tile::<false, 1>(x.as_ptr(), a.len(), &[a], &mut out);
    out[0]
}

/// AVX2 twin of [`super::float::vec_dot_f16_bytes`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_f16_bytes(x: &[u8], a: &[f32]) -> f32 {
    assert_eq!(x.len(), 2 * a.len(), "shape mismatch");
    let mut out = [0f32];
    tile::<true, 1>(x.as_ptr(), a.len(), &[a], &mut out);
    out[0]
}

/// One F32 (`F16 = false`) or F16 weight row in bytes · 1 to 4 activation rows.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dots_float_bytes<const F16: bool>(x: &[u8], ys: &[&[f32]], out: &mut [f32]) {
    let n = x.len() / if F16 { 2 } else { 4 };
    assert!(x.len() == n * if F16 { 2 } else { 4 } && out.len() >= ys.len());
    match ys.len() {
        0 => {}
        1 => tile::<F16, 1>(x.as_ptr(), n, ys, out),
        2 => tile::<F16, 2>(x.as_ptr(), n, ys, out),
        3 => tile::<F16, 3>(x.as_ptr(), n, ys, out),
        4 => tile::<F16, 4>(x.as_ptr(), n, ys, out),
        n => panic!("a tile takes at most 4 rows, got {n}"),
    }
}

/// AVX2 twin of [`super::float::axpy_f16`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    assert_eq!(y.len(), x.len(), "shape mismatch");
    let (n, yp, xp) = (y.len(), y.as_mut_ptr(), x.as_ptr() as *const u8);
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_fmadd_ps(va, load8::<true>(xp, i), _mm256_loadu_ps(yp.add(i)));
        _mm256_storeu_ps(yp.add(i), v);
        i += 8;
    }
    for j in i..n {
        y[j] += alpha * x[j].to_f32();
    }
}

/// AVX2 twin of [`super::float::f32_to_f16`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "shape mismatch");
    let (n, sp, dp) = (src.len(), src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(sp.add(i)));
        _mm_storeu_si128(dp.add(i) as *mut __m128i, h);
        i += 8;
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// AVX2 twin of [`super::float::f32_to_f16_bytes`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_to_f16_bytes(src: &[f32], dst: &mut [u8]) {
    assert_eq!(2 * src.len(), dst.len(), "shape mismatch");
    let (n, sp, dp) = (src.len(), src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(sp.add(i)));
        _mm_storeu_si128(dp.add(2 * i) as *mut __m128i, h);
        i += 8;
    }
    super::float::f32_to_f16_bytes(&src[i..], &mut dst[2 * i..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::float as scalar;
    use crate::kernels::testutil::Rng;

    fn close(a: f32, b: f32) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "simd {a} vs scalar {b}"
        );
    }

    #[test]
    fn simd_matches_scalar() {
        if !crate::kernels::SimdLevel::Avx2.available() {
            return;
        }
        let mut rng = Rng::new(21);
        for n in [0, 1, 7, 8, 31, 32, 33, 100, 257] {
            let a = rng.f32s(n, 1.0);
            let b = rng.f32s(n, 1.0);
            let h: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
            let wf: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
            let wh: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
            // SAFETY (this block and the ones below): AVX2/FMA/F16C were detected above.
            unsafe {
                close(dot_f32(&a, &b), scalar::dot_f32(&a, &b));
                close(dot_f32_f16(&a, &h), scalar::dot_f32_f16(&a, &h));
                close(
                    vec_dot_f32_bytes(&wf, &a),
                    scalar::vec_dot_f32_bytes(&wf, &a),
                );
                close(
                    vec_dot_f16_bytes(&wh, &a),
                    scalar::vec_dot_f16_bytes(&wh, &a),
                );
            }
            let c = rng.f32s(n, 1.0);
            let ys: [&[f32]; 3] = [&a, &b, &c];
            for k in 1..=3 {
                let mut out = [0f32; 3];
                unsafe { vec_dots_float_bytes::<true>(&wh, &ys[..k], &mut out) };
                for t in 0..k {
                    close(out[t], scalar::vec_dot_f16_bytes(&wh, ys[t]));
                    // Bit-identical to the single-row kernel, whatever the tile size and slot.
                    let one = unsafe { vec_dot_f16_bytes(&wh, ys[t]) };
                    assert_eq!(
                        out[t].to_bits(),
                        one.to_bits(),
                        "f16 n {n} tile {k} slot {t}"
                    );
                }
                unsafe { vec_dots_float_bytes::<false>(&wf, &ys[..k], &mut out) };
                for t in 0..k {
                    close(out[t], scalar::vec_dot_f32_bytes(&wf, ys[t]));
                    let one = unsafe { vec_dot_f32_bytes(&wf, ys[t]) };
                    assert_eq!(
                        out[t].to_bits(),
                        one.to_bits(),
                        "f32 n {n} tile {k} slot {t}"
                    );
                }
            }
            let (mut y1, mut y2) = (c.clone(), c.clone());
            scalar::axpy_f16(&mut y1, 0.7, &h);
            unsafe { axpy_f16(&mut y2, 0.7, &h) };
            for (p, q) in y1.iter().zip(&y2) {
                close(*q, *p);
            }
            let (mut d1, mut d2) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
            scalar::f32_to_f16(&a, &mut d1);
            unsafe { f32_to_f16(&a, &mut d2) };
            assert_eq!(d1, d2);
            let (mut b1, mut b2) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
            scalar::f32_to_f16_bytes(&a, &mut b1);
            unsafe { f32_to_f16_bytes(&a, &mut b2) };
            assert_eq!(b1, b2);
            let le: Vec<u8> = d1.iter().flat_map(|h| h.to_le_bytes()).collect();
            assert_eq!(b1, le);
        }
    }
}
