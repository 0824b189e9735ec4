//! Elementwise transcendental functions over slices: `e^x` (softmax), the exact GELU
//! (`x·Φ(x)`, BERT's activation), SiLU gating (`x / (1 + e^-x) · up`, SwiGLU's) and ggml's
//! tanh-GELU gating (GeGLU's, from a table of f16 values).
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

use std::sync::OnceLock;

use half::f16;

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

/// ggml's tanh-GELU constants: `√(2/π)` and the cubic term's coefficient.
const GELU_SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044_715;
/// How far the vector `tanh` of [`gelu_tanh_mul_inplace`] may be from `tanhf`'s: twice the
/// least slack that gives the table's bits for every f16 value (2⁻²³; 2⁻²⁴ misses some).
const GELU_TANH_SLACK: f32 = 1.0 / (1 << 22) as f32;

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
        // SAFETY: AVX2, FMA and F16C were detected (the avx2 level implies them).
        return unsafe { avx2::gated::<false>(gate, up, &[]) };
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// ggml's `ggml_table_gelu_f16`: the tanh-approximated GELU of every f16 value, computed in
/// f32 with the C library's `tanhf` and rounded to f16 (as bits).
fn gelu_tanh_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32())).to_bits())
            .collect()
    })
}

/// ggml's tanh-approximated GELU, `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))`, in its
/// order of operations with the C library's `tanhf`.
fn gelu_tanh(x: f32) -> f32 {
    let y = GELU_SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x);
    0.5 * x * (1.0 + y.tanh())
}

/// `gate·up` with GeGLU's gate as ggml computes it: GELU read from ggml's f16 table at the
/// f16 rounding of `gate`, 0 at or below −10 and `gate` itself at or above 10.
#[inline]
pub fn gelu_tanh_mul(gate: f32, up: f32) -> f32 {
    gelu_tanh_mul_from(gelu_tanh_table(), gate, up)
}

/// [`gelu_tanh_mul`] with the table in hand (a slice's loop fetches it once).
#[inline]
fn gelu_tanh_mul_from(table: &[u16], gate: f32, up: f32) -> f32 {
    if gate <= -10.0 {
        0.0
    } else if gate >= 10.0 {
        gate * up
    } else {
        f16::from_bits(table[f16::from_f32(gate).to_bits() as usize]).to_f32() * up
    }
}

/// `gate[i] = gelu_tanh_mul(gate[i], up[i])` for every element (GeGLU's gating).
///
/// The AVX2 path computes the GELU of 8 values at once (a `tanh` from [`exp`]) and takes it
/// where it rounds to the same f16 as the table's value: when the GELU of `tanh ± 2⁻²²`
/// (beyond both its own and `tanhf`'s error) rounds to one f16, the table's does too; the
/// other lanes (a few in 100, and every gate below about −3.5, where `1 + tanh` cancels)
/// read the table. Same bits as the table for every f16 value (tested for all of them),
/// mostly without touching its 128 KiB, which a layer's weights push out of the cache before
/// the next layer's decode looks 2,048 values up in it: Gemma 3's activation at depth 4,096
/// took 3.6–4.0 µs a layer this way against 4.4–6.3 with every value from the table.
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_tanh_mul_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "gelu_tanh_mul: gate and up differ in length"
    );
    let table = gelu_tanh_table();
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected (the avx2 level implies them).
        return unsafe { avx2::gated::<true>(gate, up, table) };
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh_mul_from(table, *g, u);
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

    use super::{
        ERFC_P, EXP_HI, EXP_LO, EXP_P, GELU_COEF_A, GELU_SQRT_2_OVER_PI, GELU_TANH_SLACK, LN2_HI,
        LN2_LO, LOG2E,
    };

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

    /// [`super::gelu_tanh_mul`] on 8 lanes (`table`: the f16 GELU table).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gelu_tanh_mul8(g: __m256, u: __m256, table: &[u16]) -> __m256 {
        const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;
        let one = _mm256_set1_ps(1.0);
        // The table's argument: the gate rounded to f16.
        let xh = _mm256_cvtps_ph::<RNE>(g);
        let x = _mm256_cvtph_ps(xh);
        // ggml's expression, operation by operation (no fused multiply-adds).
        let x2 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_COEF_A), x), x);
        let y = _mm256_mul_ps(
            _mm256_mul_ps(_mm256_set1_ps(GELU_SQRT_2_OVER_PI), x),
            _mm256_add_ps(one, x2),
        );
        // tanh(y) = 1 − 2/(e^{2y} + 1), within a few 2⁻²⁴ of the true value.
        let e = exp8(_mm256_add_ps(y, y));
        let t = _mm256_sub_ps(
            one,
            _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)),
        );
        let h = _mm256_mul_ps(_mm256_set1_ps(0.5), x);
        let slack = _mm256_set1_ps(GELU_TANH_SLACK);
        let at = |t| _mm256_cvtps_ph::<RNE>(_mm256_mul_ps(h, _mm256_add_ps(one, t)));
        let (mid, lo, hi) = (
            at(t),
            at(_mm256_sub_ps(t, slack)),
            at(_mm256_add_ps(t, slack)),
        );
        // Lanes whose rounding the slack could change, and NaN gates, read the table.
        let sure = _mm_and_si128(_mm_cmpeq_epi16(mid, lo), _mm_cmpeq_epi16(mid, hi));
        let unsure = !_mm_movemask_epi8(sure) as u32 & 0xffff;
        let nan = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(g, g)) as u32;
        let mut gelu = mid;
        if unsure | nan != 0 {
            let (mut hs, mut xs) = ([0u16; 8], [0u16; 8]);
            _mm_storeu_si128(hs.as_mut_ptr().cast(), mid);
            _mm_storeu_si128(xs.as_mut_ptr().cast(), xh);
            for i in 0..8 {
                if (unsure >> (2 * i)) & 3 != 0 || (nan >> i) & 1 != 0 {
                    hs[i] = table[xs[i] as usize];
                }
            }
            gelu = _mm_loadu_si128(hs.as_ptr().cast());
        }
        let v = _mm256_mul_ps(_mm256_cvtph_ps(gelu), u);
        // Saturation outside ±10, decided on the gate itself.
        let low = _mm256_cmp_ps::<_CMP_LE_OQ>(g, _mm256_set1_ps(-10.0));
        let high = _mm256_cmp_ps::<_CMP_GE_OQ>(g, _mm256_set1_ps(10.0));
        let v = _mm256_blendv_ps(v, _mm256_mul_ps(g, u), high);
        _mm256_andnot_ps(low, v)
    }

    /// `gate = silu(gate) · up` (or, with `GELU`, `gelu_tanh_mul(gate, up)` with `table`, the
    /// f16 GELU table), 8 at a time, then the tail through zero-padded vectors.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gated<const GELU: bool>(gate: &mut [f32], up: &[f32], table: &[u16]) {
        let f = |g, u| {
            if GELU {
                gelu_tanh_mul8(g, u, table)
            } else {
                silu_mul8(g, u)
            }
        };
        let mut gs = gate.chunks_exact_mut(8);
        let mut us = up.chunks_exact(8);
        for (g, u) in gs.by_ref().zip(us.by_ref()) {
            let v = f(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr()));
            _mm256_storeu_ps(g.as_mut_ptr(), v);
        }
        let (g, u) = (gs.into_remainder(), us.remainder());
        if !g.is_empty() {
            let (mut gb, mut ub) = ([0f32; 8], [0f32; 8]);
            gb[..g.len()].copy_from_slice(g);
            ub[..u.len()].copy_from_slice(u);
            let v = f(_mm256_loadu_ps(gb.as_ptr()), _mm256_loadu_ps(ub.as_ptr()));
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

    /// The slice form of GeGLU's gating has the table rule's bits for every f16 value of the
    /// gate (the vector GELU covers every lane it takes, the table the rest), for gates between
    /// f16 values, beyond ±10, infinite and NaN, and for every slice length's tail.
    #[test]
    fn gelu_tanh_mul_is_the_table_rule() {
        let mut gates: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        gates.extend(samples());
        gates.extend([f32::INFINITY, f32::NEG_INFINITY, -10.0, 10.0, 9.999, -9.999]);
        let n = gates.len();
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        for len in [n, 1, 7, 8, 9, 61] {
            let mut got = gates[..len].to_vec();
            gelu_tanh_mul_inplace(&mut got, &up[..len]);
            for (i, (&x, &g)) in gates.iter().zip(&got).enumerate() {
                let want = gelu_tanh_mul(x, up[i]);
                let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                assert!(same, "gelu_tanh_mul({x}, {}) = {g}, want {want}", up[i]);
            }
        }
        // The table itself: ggml's values at a few points (GELU's tanh form, in f16).
        for (x, want) in [(0.0, 0.0), (1.0, 0.841_2), (-1.0, -0.158_8), (2.0, 1.954_6)] {
            assert!(
                (gelu_tanh_mul(x, 1.0) - want).abs() < 1e-3,
                "gelu_tanh({x})"
            );
        }
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
