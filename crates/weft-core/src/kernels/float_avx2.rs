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

/// AVX2 twin of [`super::float::dots_f32_f16`] for up to 8 query rows: the key is widened
/// once per 8 elements and used by every row (the heads that share a KV head in GQA).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dots_f32_f16(qs: &[f32], k: &[f16], out: &mut [f32]) {
    match out.len() {
        1 => dots_g::<1>(qs, k, out),
        2 => dots_g::<2>(qs, k, out),
        3 => dots_g::<3>(qs, k, out),
        4 => dots_g::<4>(qs, k, out),
        5 => dots_g::<5>(qs, k, out),
        6 => dots_g::<6>(qs, k, out),
        7 => dots_g::<7>(qs, k, out),
        8 => dots_g::<8>(qs, k, out),
        n => panic!("dots_f32_f16 takes 1 to 8 rows, got {n}"),
    }
}

/// AVX2 twin of [`super::float::dots_f32_f16_keys`]: [`dots_f32_f16`] for each of
/// `out.len() / g` keys in a row, without a dispatch per key.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dots_f32_f16_keys(qs: &[f32], keys: &[f16], g: usize, out: &mut [f32]) {
    let d = qs.len() / g;
    macro_rules! each_key {
        ($g:literal) => {
            for (k, o) in keys.chunks_exact(d).zip(out.chunks_exact_mut($g)) {
                dots_g::<$g>(qs, k, o);
            }
        };
    }
    match g {
        1 => each_key!(1),
        2 => each_key!(2),
        3 => each_key!(3),
        4 => each_key!(4),
        5 => each_key!(5),
        6 => each_key!(6),
        7 => each_key!(7),
        8 => each_key!(8),
        n => panic!("dots_f32_f16_keys takes 1 to 8 rows, got {n}"),
    }
}

// `j` indexes the query rows and both accumulator arrays at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_g<const G: usize>(qs: &[f32], k: &[f16], out: &mut [f32]) {
    let n = k.len();
    assert!(qs.len() == G * n && out.len() == G, "shape mismatch");
    let (qp, kp) = (qs.as_ptr(), k.as_ptr() as *const u8);
    // Two accumulators per row (even and odd 8-element chunks): 2·G independent FMA chains,
    // enough to keep both FMA pipes busy for G ≥ 2. A row's sums never depend on G.
    let mut acc = [[_mm256_setzero_ps(); G]; 2];
    let mut i = 0;
    while i + 16 <= n {
        let (k0, k1) = (load8::<true>(kp, i), load8::<true>(kp, i + 8));
        for j in 0..G {
            acc[0][j] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j * n + i)), k0, acc[0][j]);
            acc[1][j] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j * n + i + 8)), k1, acc[1][j]);
        }
        i += 16;
    }
    if i + 8 <= n {
        let k0 = load8::<true>(kp, i);
        for j in 0..G {
            acc[0][j] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j * n + i)), k0, acc[0][j]);
        }
        i += 8;
    }
    for (j, o) in out.iter_mut().enumerate() {
        let mut s = hsum_ps(_mm256_add_ps(acc[0][j], acc[1][j]));
        for t in i..n {
            s += qs[j * n + t] * k[t].to_f32();
        }
        *o = s;
    }
}

/// AVX2 twin of [`super::float::attend_f16`] for up to 8 heads: for each 8-wide slice of the
/// head dimension the heads' accumulators stay in registers while every listed value row is
/// widened once and added to all of them (one load and store of the accumulators per call,
/// not per key).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend_f16(acc: &mut [f32], d: usize, w: &[f32], values: &[f16], rows: &[u32]) {
    match acc.len() / d {
        1 => attend_g::<1>(acc, d, w, values, rows),
        2 => attend_g::<2>(acc, d, w, values, rows),
        3 => attend_g::<3>(acc, d, w, values, rows),
        4 => attend_g::<4>(acc, d, w, values, rows),
        5 => attend_g::<5>(acc, d, w, values, rows),
        6 => attend_g::<6>(acc, d, w, values, rows),
        7 => attend_g::<7>(acc, d, w, values, rows),
        8 => attend_g::<8>(acc, d, w, values, rows),
        n => panic!("attend_f16 takes 1 to 8 heads, got {n}"),
    }
}

// `j` indexes the weights and both accumulator arrays at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_g<const G: usize>(
    acc: &mut [f32],
    d: usize,
    w: &[f32],
    values: &[f16],
    rows: &[u32],
) {
    assert!(
        acc.len() == G * d && w.len() >= rows.len() * G,
        "shape mismatch"
    );
    for &r in rows {
        assert!(
            (r as usize + 1) * d <= values.len(),
            "value row out of range"
        );
    }
    let (ap, vp) = (acc.as_mut_ptr(), values.as_ptr() as *const u8);
    let mut c = 0;
    // Two 8-wide slices at a time: 2·G accumulators in registers, independent FMA chains.
    while c + 16 <= d {
        let mut a: [[__m256; G]; 2] = std::array::from_fn(|h| {
            std::array::from_fn(|j| _mm256_loadu_ps(ap.add(j * d + c + 8 * h)))
        });
        for (i, &r) in rows.iter().enumerate() {
            let v0 = load8::<true>(vp, r as usize * d + c);
            let v1 = load8::<true>(vp, r as usize * d + c + 8);
            for j in 0..G {
                let wj = _mm256_broadcast_ss(&w[i * G + j]);
                a[0][j] = _mm256_fmadd_ps(wj, v0, a[0][j]);
                a[1][j] = _mm256_fmadd_ps(wj, v1, a[1][j]);
            }
        }
        for (h, a) in a.iter().enumerate() {
            for (j, a) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(j * d + c + 8 * h), *a);
            }
        }
        c += 16;
    }
    while c + 8 <= d {
        let mut a: [__m256; G] = std::array::from_fn(|j| _mm256_loadu_ps(ap.add(j * d + c)));
        for (i, &r) in rows.iter().enumerate() {
            let v = load8::<true>(vp, r as usize * d + c);
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&w[i * G + j]), v, *a);
            }
        }
        for (j, a) in a.iter().enumerate() {
            _mm256_storeu_ps(ap.add(j * d + c), *a);
        }
        c += 8;
    }
    for t in c..d {
        for (i, &r) in rows.iter().enumerate() {
            let v = values[r as usize * d + t].to_f32();
            for j in 0..G {
                acc[j * d + t] += w[i * G + j] * v;
            }
        }
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
        }
    }

    #[test]
    fn attention_kernels_match_scalar() {
        if !crate::kernels::SimdLevel::Avx2.available() {
            return;
        }
        let mut rng = Rng::new(5);
        for d in [4, 8, 20, 64] {
            let values: Vec<f16> = rng
                .f32s(10 * d, 1.0)
                .iter()
                .map(|&v| f16::from_f32(v))
                .collect();
            let rows = [7u32, 0, 3, 9, 4];
            for g in 1..=8 {
                let qs = rng.f32s(g * d, 1.0);
                let (mut o1, mut o2) = (vec![0f32; g], vec![0f32; g]);
                scalar::dots_f32_f16(&qs, &values[2 * d..3 * d], &mut o1);
                // SAFETY (both blocks): AVX2/FMA/F16C were detected above.
                unsafe { dots_f32_f16(&qs, &values[2 * d..3 * d], &mut o2) };
                o1.iter().zip(&o2).for_each(|(&a, &b)| close(b, a));
                let w = rng.f32s(rows.len() * g, 1.0);
                let init = rng.f32s(g * d, 1.0);
                let (mut a1, mut a2) = (init.clone(), init);
                scalar::attend_f16(&mut a1, d, &w, &values, &rows);
                unsafe { attend_f16(&mut a2, d, &w, &values, &rows) };
                a1.iter().zip(&a2).for_each(|(&a, &b)| close(b, a));
            }
        }
    }
}
