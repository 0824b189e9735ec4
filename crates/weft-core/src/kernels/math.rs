//! Elementwise transcendental functions over slices: `e^x` (softmax), the exact GELU
//! (`x·Φ(x)`, BERT's activation) and SiLU gating (`x / (1 + e^-x) · up`, SwiGLU's).
//!
//! The scalar functions are the reference and define the arithmetic: Cephes' `expf` (range
//! reduction by `ln 2` in two parts, a degree-5 polynomial, the exponent built in the float's
//! bits) and Numerical Recipes' `erfc` fit, every multiply-add fused. The AVX2 twins run the
//! same operations 8 lanes at a time (`vfmadd`, `vroundps` to nearest-even, `vdivps`), so both
//! paths give the same bits and a value never depends on its neighbours in the slice.
//!
//! Accuracy: `exp` within 2 ulp for inputs in [-87.3, 88.3] (smaller inputs give
//! `e^-87.3` ≈ 1.2e-38 rather than 0 or a subnormal, which is below anything a softmax or
//! `erfc` can notice); `erf` within about 1e-7 absolute.

/// Inputs are clamped to `[EXP_LO, EXP_HI]`: `2^n` stays a normal float.
const EXP_LO: f32 = -87.3;
const EXP_HI: f32 = 88.3;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n · LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial for `e^r` on `|r| ≤ ln2/2`, highest degree first.
#[allow(clippy::excessive_precision)] // the published coefficients, as printed
const EXP_P: [f32; 6] = [
    1.987_569_150_0e-4,
    1.398_199_950_7e-3,
    8.333_451_907_3e-3,
    4.166_579_589_4e-2,
    1.666_666_545_9e-1,
    5.000_000_120_1e-1,
];
/// Numerical Recipes' `erfc` fit: `erfc(z) ≈ t·exp(-z² + P(t))`, `t = 1/(1 + z/2)`; `P`'s
/// coefficients highest degree first.
#[allow(clippy::excessive_precision)] // the published coefficients, as printed
const ERFC_P: [f32; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_87,
    -1.135_203_98,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_68,
    -1.265_512_23,
];

/// `e^x` (the reference the AVX2 path reproduces bit for bit).
#[inline]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The error function, to about 1e-7 absolute.
#[inline]
pub fn erf(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / 0.5f32.mul_add(z, 1.0);
    let mut p = ERFC_P[0];
    for &c in &ERFC_P[1..] {
        p = p.mul_add(t, c);
    }
    let erfc = t * exp((-z).mul_add(z, p));
    let e = 1.0 - erfc;
    if x < 0.0 {
        -e
    } else {
        e
    }
}

/// The exact GELU, `x·Φ(x) = x/2 · (1 + erf(x/√2))`.
#[inline]
pub fn gelu(x: f32) -> f32 {
    let h = 0.5 * x;
    h.mul_add(erf(x * std::f32::consts::FRAC_1_SQRT_2), h)
}

/// SiLU, `x / (1 + e^-x)`, with [`exp`] (as ggml computes it, with its own vector `expf`).
/// Below `-EXP_HI` it gives `x · e^-88.3` (under `|x|·1e-38`) rather than 0.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `gate[i] = silu(gate[i]) · up[i]` for every element (SwiGLU's gating).
///
/// # Panics
/// If the slices differ in length.
pub fn silu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "silu_mul: gate and up differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { avx2::silu_mul(gate, up) };
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `x[i] = e^x[i]` for every element.
pub fn exp_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { avx2::map::<false>(x) };
    }
    x.iter_mut().for_each(|v| *v = exp(*v));
}

/// `x[i] = gelu(x[i])` for every element.
pub fn gelu_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { avx2::map::<true>(x) };
    }
    x.iter_mut().for_each(|v| *v = gelu(*v));
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{ERFC_P, EXP_HI, EXP_LO, EXP_P, LN2_HI, LN2_LO, LOG2E};

    /// [`super::exp`] on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
            _mm256_set1_ps(EXP_HI),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
    }

    /// [`super::gelu`] on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gelu8(x: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let u = _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        let z = _mm256_andnot_ps(sign, u);
        let one = _mm256_set1_ps(1.0);
        let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5), z, one));
        let mut p = _mm256_set1_ps(ERFC_P[0]);
        for &c in &ERFC_P[1..] {
            p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
        }
        let neg_z = _mm256_xor_ps(z, sign);
        let erfc = _mm256_mul_ps(t, exp8(_mm256_fmadd_ps(neg_z, z, p)));
        let e = _mm256_sub_ps(one, erfc);
        // erf is odd: take the sign of u (x < 0 exactly when u < 0; -0 gives -0 · … = -0).
        let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(u, _mm256_setzero_ps());
        let e = _mm256_blendv_ps(e, _mm256_xor_ps(e, sign), neg);
        let h = _mm256_mul_ps(_mm256_set1_ps(0.5), x);
        _mm256_fmadd_ps(h, e, h)
    }

    /// [`super::silu`] of `g` times `u`, on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu_mul8(g: __m256, u: __m256) -> __m256 {
        let e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0)));
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
    }

    /// `gate = silu(gate) · up`, 8 at a time, then the tail through zero-padded vectors.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let mut gs = gate.chunks_exact_mut(8);
        let mut us = up.chunks_exact(8);
        for (g, u) in gs.by_ref().zip(us.by_ref()) {
            let v = silu_mul8(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr()));
            _mm256_storeu_ps(g.as_mut_ptr(), v);
        }
        let (g, u) = (gs.into_remainder(), us.remainder());
        if !g.is_empty() {
            let (mut gb, mut ub) = ([0f32; 8], [0f32; 8]);
            gb[..g.len()].copy_from_slice(g);
            ub[..u.len()].copy_from_slice(u);
            let v = silu_mul8(_mm256_loadu_ps(gb.as_ptr()), _mm256_loadu_ps(ub.as_ptr()));
            _mm256_storeu_ps(gb.as_mut_ptr(), v);
            g.copy_from_slice(&gb[..g.len()]);
        }
    }

    /// Applies `exp` (or, with `GELU`, `gelu`) to every element: 8 at a time, then the tail
    /// through a zero-padded vector (the same lanes, so the same bits as the scalar path).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn map<const GELU: bool>(x: &mut [f32]) {
        let f = |v| if GELU { gelu8(v) } else { exp8(v) };
        let mut chunks = x.chunks_exact_mut(8);
        for c in chunks.by_ref() {
            let v = _mm256_loadu_ps(c.as_ptr());
            _mm256_storeu_ps(c.as_mut_ptr(), f(v));
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut buf = [0f32; 8];
            buf[..tail.len()].copy_from_slice(tail);
            let v = f(_mm256_loadu_ps(buf.as_ptr()));
            _mm256_storeu_ps(buf.as_mut_ptr(), v);
            tail.copy_from_slice(&buf[..tail.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<f32> {
        let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.0517).collect();
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, 87.0, 88.3, 89.0, -87.3, -100.0, -1e30, 1e30,
        ]);
        xs.extend((0..1000).map(|i| ((i * 7919) % 2003) as f32 * 0.013 - 13.0));
        xs
    }

    #[test]
    fn exp_is_accurate() {
        for x in samples() {
            let (got, want) = (exp(x), (x.clamp(EXP_LO, EXP_HI) as f64).exp());
            let rel = ((got as f64 - want) / want).abs();
            assert!(rel < 3e-7, "exp({x}) = {got}, want {want} (rel {rel:e})");
        }
    }

    #[test]
    #[allow(clippy::excessive_precision)] // the table's values, as printed
    fn erf_matches_known_values() {
        // erf values from Abramowitz & Stegun table 7.1.
        for (x, want) in [
            (0.0, 0.0),
            (0.1, 0.112_462_916),
            (0.5, 0.520_499_878),
            (1.0, 0.842_700_793),
            (1.5, 0.966_105_146),
            (2.0, 0.995_322_265),
            (3.0, 0.999_977_910),
        ] {
            assert!((erf(x) - want).abs() < 3e-7, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 3e-7, "erf({}) = {}", -x, erf(-x));
        }
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu(-3.0) + 0.004_049_5).abs() < 1e-6);
    }

    /// SiLU against `x / (1 + e^-x)` in double precision, and its gated slice form.
    #[test]
    fn silu_is_accurate() {
        for x in samples() {
            let want = x as f64 / (1.0 + (-(x as f64)).exp());
            let got = silu(x) as f64;
            // Below -88.3 the clamped `exp` leaves `x · e^-88.3` instead of (nearly) 0.
            let ok = (got - want).abs() <= 4e-7 * want.abs()
                || (x < -87.0 && got.abs() <= (x as f64).abs() * 1e-37);
            assert!(ok, "silu({x}) = {got}, want {want}");
        }
        let (mut g, u) = (vec![-2.0, 0.0, 3.0], [2.0, 5.0, -1.0]);
        silu_mul_inplace(&mut g, &u);
        assert_eq!(g, [silu(-2.0) * 2.0, 0.0, -silu(3.0)]);
    }

    /// The AVX2 path gives the scalar reference's bits, whatever the slice length.
    #[test]
    fn slices_match_the_scalar_reference() {
        let xs = samples();
        for len in [0, 1, 7, 8, 9, 31, xs.len()] {
            let mut e = xs[..len].to_vec();
            exp_inplace(&mut e);
            let mut g = xs[..len].to_vec();
            gelu_inplace(&mut g);
            for (i, &x) in xs[..len].iter().enumerate() {
                assert_eq!(e[i].to_bits(), exp(x).to_bits(), "exp({x})");
                assert_eq!(g[i].to_bits(), gelu(x).to_bits(), "gelu({x})");
            }
            let up: Vec<f32> = (0..len).map(|i| 1.5 - (i % 7) as f32 * 0.37).collect();
            let mut s = xs[..len].to_vec();
            silu_mul_inplace(&mut s, &up);
            for (i, &x) in xs[..len].iter().enumerate() {
                assert_eq!(s[i].to_bits(), (silu(x) * up[i]).to_bits(), "silu({x})");
            }
        }
    }
}
