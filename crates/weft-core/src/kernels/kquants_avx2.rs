//! AVX2 dot products of the k-quants with Q8_K activations, same names and contracts as the
//! scalar references in `kquants` (which see).
//!
//! Per 32 quants: one `maddubs` (unsigned weight quants × signed activations → i16 pairs) and
//! one `madd` with the sub-block scale broadcast to i16 lanes (→ i32 lanes already scaled), so
//! a whole 256-element super-block accumulates in integers and costs a single conversion and
//! FMA. Offsets are folded in with the activation's precomputed sums: Q4_K/Q5_K subtract
//! `dmin · Σ mn[s] · Σy`, Q6_K (quants stored `+32`) subtracts `32 · Σ sc[s] · Σy` in integers.
//!
//! The tile variants (`vec_dots_*`) unpack each weight super-block (quants and scales) once and
//! use it for up to 4 activation rows; the single-row `vec_dot_*` is the same tile with
//! `T = 1`. A token's arithmetic (its integer sums, then two FMAs per super-block into its own
//! accumulator, then one horizontal sum) never depends on `T` or on its slot in the tile, so
//! the results are bit-identical however the tokens are batched. Every function is `unsafe`
//! only because it needs AVX2, FMA and F16C: lengths are checked.

use std::arch::x86_64::*;

use super::quantize::{Q8KRow, QK_K};
use super::x86::{f16x2_at, hsum_ps, load256};

/// Number of super-blocks, after checking that `x` and the activation row agree.
fn blocks(x: &[u8], bytes: usize, y: &Q8KRow) -> usize {
    let nb = x.len() / bytes;
    assert!(
        x.len() == nb * bytes
            && y.qs.len() == nb * QK_K
            && y.d.len() == nb
            && y.bsums.len() == nb * 16,
        "shape mismatch"
    );
    nb
}

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block from their 12 packed bytes at `p`,
/// widened to i16: `(scales, mins)`. Same unpacking as `quant::blocks::k4_scale_min`, four
/// bytes at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scales(p: *const u8) -> (__m128i, __m128i) {
    let u = |i: usize| (p.add(4 * i) as *const u32).read_unaligned();
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let sc_lo = u0 & 0x3f3f_3f3f;
    let mn_lo = u1 & 0x3f3f_3f3f;
    let sc_hi = (u2 & 0x0f0f_0f0f) | ((u0 >> 2) & 0x3030_3030);
    let mn_hi = ((u2 >> 4) & 0x0f0f_0f0f) | ((u1 >> 2) & 0x3030_3030);
    let sc = _mm_set_epi32(0, 0, sc_hi as i32, sc_lo as i32);
    let mn = _mm_set_epi32(0, 0, mn_hi as i32, mn_lo as i32);
    (_mm_cvtepu8_epi16(sc), _mm_cvtepu8_epi16(mn))
}

/// The sums of the 8 groups of 32 activations of a super-block, from its 16 `bsums`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bsums32(bsums: *const i16) -> __m128i {
    let b = load256(bsums);
    _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b))
}

/// `[v, 0]` as 256 bits (the upper half zero).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn zext(v: __m128) -> __m256 {
    _mm256_set_m128(_mm_setzero_ps(), v)
}

/// GEMM tile (and, with `T = 1`, the GEMV): one Q4_K (`Q5 = false`) or Q5_K row · `T` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_k4<const Q5: bool, const T: usize>(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    let (bytes, qs_at) = if Q5 { (176, 48) } else { (144, 16) };
    let (ys, out) = (&ys[..T], &mut out[..T]);
    let mut nb = 0;
    for y in ys {
        nb = blocks(x, bytes, y);
    }
    let xp = x.as_ptr();
    let yq: [*const i8; T] = std::array::from_fn(|t| ys[t].qs.as_ptr());
    let yd: [*const f32; T] = std::array::from_fn(|t| ys[t].d.as_ptr());
    let ybs: [*const i16; T] = std::array::from_fn(|t| ys[t].bsums.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let w = xp.add(b * bytes);
        let dm = f16x2_at(w); // d and dmin
        let (d, dmin) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
        let (sc, mn) = k4_scales(w.add(4));
        let sc2 = _mm256_broadcastsi128_si256(sc); // scales as i16, in both 128-bit lanes
        let qh = if Q5 {
            load256(w.add(16))
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); T];
        for p in 0..4 {
            // 64 elements: low nibbles are sub-block 2p, high nibbles sub-block 2p + 1.
            let bits = load256(w.add(qs_at + 32 * p));
            let mut lo = _mm256_and_si256(bits, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            if Q5 {
                // Bit s of qh[l] is the 5th bit of element l of sub-block s: move it to bit 4.
                let bit = _mm256_set1_epi8(0x10);
                let h_lo = _mm256_srlv_epi32(qh, _mm256_set1_epi32(2 * p as i32));
                let h_lo = _mm256_and_si256(_mm256_slli_epi16::<4>(h_lo), bit);
                let h_hi = _mm256_srlv_epi32(qh, _mm256_set1_epi32(2 * p as i32 + 1));
                let h_hi = _mm256_and_si256(_mm256_slli_epi16::<4>(h_hi), bit);
                lo = _mm256_or_si256(lo, h_lo);
                hi = _mm256_or_si256(hi, h_hi);
            }
            // Broadcast scale 2p (resp. 2p + 1), an i16, to all 16 lanes.
            let sl = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16(0x0100 + 0x0202 * (2 * p as i16)));
            let sh = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16(0x0302 + 0x0202 * (2 * p as i16)));
            for t in 0..T {
                let q8 = yq[t].add(b * QK_K + 64 * p);
                let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, load256(q8)));
                let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, load256(q8.add(32))));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
            }
        }
        for t in 0..T {
            let dy = *yd[t].add(b);
            // Σ mn[s] · Σy over sub-block s, 4 lanes of i32, scaled by -dmin·d_y.
            let m = _mm_madd_epi16(mn, bsums32(ybs[t].add(16 * b)));
            let m = zext(_mm_cvtepi32_ps(m));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * dy), m, acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dy), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}

/// Shuffle control that spreads byte `s` over bytes 0..8 and byte `s + 1` over bytes 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_spread(s: usize) -> __m128i {
    let rep = 0x0101_0101_0101_0101_i64;
    _mm_set_epi64x(rep * (s as i64 + 1), rep * s as i64)
}

/// GEMM tile (and, with `T = 1`, the GEMV): one Q6_K row · `T` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q6_k<const T: usize>(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    let (ys, out) = (&ys[..T], &mut out[..T]);
    let mut nb = 0;
    for y in ys {
        nb = blocks(x, 210, y);
    }
    let xp = x.as_ptr();
    let yq: [*const i8; T] = std::array::from_fn(|t| ys[t].qs.as_ptr());
    let yd: [*const f32; T] = std::array::from_fn(|t| ys[t].d.as_ptr());
    let ybs: [*const i16; T] = std::array::from_fn(|t| ys[t].bsums.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let w = xp.add(b * 210);
        let (ql, qh) = (w, w.add(128));
        let scales = _mm_loadu_si128(w.add(192) as *const __m128i); // 16 × i8
                                                                    // d is the block's last 2 bytes: load the 4 bytes ending there, take lane 1.
        let d = _mm_cvtss_f32(_mm_movehdup_ps(f16x2_at(w.add(206))));
        // The quants are stored +32: start every sum at -32 · Σ_s sc[s] · Σy (16 groups).
        let sc16 = _mm256_cvtepi8_epi16(scales);
        let mut sumi = [_mm256_setzero_si256(); T];
        for (t, sumi) in sumi.iter_mut().enumerate() {
            let c = _mm256_madd_epi16(sc16, load256(ybs[t].add(16 * b)));
            *sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(c));
        }
        for h in 0..2 {
            // 128 elements: 64 bytes of low nibbles and 32 bytes holding four 2-bit fields.
            let a = load256(ql.add(64 * h));
            let c = load256(ql.add(64 * h + 32));
            let hb = load256(qh.add(32 * h));
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(a, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(c, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
                    _mm256_and_si256(hb, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(hb), m30),
                ),
            ];
            for (k, &qk) in q.iter().enumerate() {
                // Elements 128h + 32k ..: sub-blocks s (first 16) and s + 1 (next 16).
                let s = 8 * h + 2 * k;
                let scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pair_spread(s)));
                for t in 0..T {
                    let y = load256(yq[t].add(b * QK_K + 128 * h + 32 * k));
                    let p = _mm256_madd_epi16(scv, _mm256_maddubs_epi16(qk, y));
                    sumi[t] = _mm256_add_epi32(sumi[t], p);
                }
            }
        }
        for t in 0..T {
            let dd = _mm256_set1_ps(d * *yd[t].add(b));
            acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}

/// AVX2 twin of [`super::kquants::vec_dot_q4_k_q8_k`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_q4_k_q8_k(x: &[u8], y: &Q8KRow) -> f32 {
    let mut out = [0f32];
    tile_k4::<false, 1>(x, std::slice::from_ref(y), &mut out);
    out[0]
}

/// AVX2 twin of [`super::kquants::vec_dot_q5_k_q8_k`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_q5_k_q8_k(x: &[u8], y: &Q8KRow) -> f32 {
    let mut out = [0f32];
    tile_k4::<true, 1>(x, std::slice::from_ref(y), &mut out);
    out[0]
}

/// AVX2 twin of [`super::kquants::vec_dot_q6_k_q8_k`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_q6_k_q8_k(x: &[u8], y: &Q8KRow) -> f32 {
    let mut out = [0f32];
    tile_q6_k::<1>(x, std::slice::from_ref(y), &mut out);
    out[0]
}

/// Runs a tile for `ys.len()` (1 to 4) rows.
macro_rules! dispatch_tile {
    ($tile:ident $(, $q5:expr)?; $x:expr, $ys:expr, $out:expr) => {{
        assert!($out.len() >= $ys.len());
        match $ys.len() {
            0 => {}
            1 => $tile::<$($q5,)? 1>($x, $ys, $out),
            2 => $tile::<$($q5,)? 2>($x, $ys, $out),
            3 => $tile::<$($q5,)? 3>($x, $ys, $out),
            4 => $tile::<$($q5,)? 4>($x, $ys, $out),
            n => panic!("a tile takes at most 4 rows, got {n}"),
        }
    }};
}

/// AVX2 twin of [`super::kquants::vec_dots_q4_k_q8_k`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dots_q4_k_q8_k(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    dispatch_tile!(tile_k4, false; x, ys, out)
}

/// AVX2 twin of [`super::kquants::vec_dots_q5_k_q8_k`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dots_q5_k_q8_k(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    dispatch_tile!(tile_k4, true; x, ys, out)
}

/// AVX2 twin of [`super::kquants::vec_dots_q6_k_q8_k`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dots_q6_k_q8_k(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    dispatch_tile!(tile_q6_k; x, ys, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::kernels::kquants as scalar;
    use crate::kernels::quantize::{ActFormat, Q8Batch};
    use crate::kernels::testutil::{random_weights, Rng};

    type Dot = (unsafe fn(&[u8], &Q8KRow) -> f32, fn(&[u8], &Q8KRow) -> f32);
    type Dots = unsafe fn(&[u8], &[Q8KRow], &mut [f32]);

    #[test]
    fn simd_matches_scalar() {
        if !crate::kernels::SimdLevel::Avx2.available() {
            return;
        }
        let kernels: [(GgmlType, Dot, Dots); 3] = [
            (
                GgmlType::Q4_K,
                (vec_dot_q4_k_q8_k, scalar::vec_dot_q4_k_q8_k),
                vec_dots_q4_k_q8_k,
            ),
            (
                GgmlType::Q5_K,
                (vec_dot_q5_k_q8_k, scalar::vec_dot_q5_k_q8_k),
                vec_dots_q5_k_q8_k,
            ),
            (
                GgmlType::Q6_K,
                (vec_dot_q6_k_q8_k, scalar::vec_dot_q6_k_q8_k),
                vec_dots_q6_k_q8_k,
            ),
        ];
        for (dtype, (simd, reference), simd_tile) in kernels {
            let mut rng = Rng::new(5 + dtype.id() as u64);
            for nb in 1..4 {
                let cols = 256 * nb;
                let w = random_weights(&mut rng, dtype, 1, cols);
                let mut batch = Q8Batch::default();
                batch.quantize(None, ActFormat::Q8K, &rng.f32s(4 * cols, 3.0), 4, cols);
                let rows: Vec<Q8KRow> = (0..4).map(|t| batch.q8_k(t)).collect();
                for n in 1..=4 {
                    let mut out = [0f32; 4];
                    // SAFETY: AVX2/FMA/F16C were detected above.
                    unsafe { simd_tile(&w, &rows[..n], &mut out) };
                    for t in 0..n {
                        let want = reference(&w, &rows[t]);
                        // SAFETY: as above.
                        let gemv = unsafe { simd(&w, &rows[t]) };
                        for (got, what) in [(out[t], "tile"), (gemv, "gemv")] {
                            let tol = 1e-5 * (1.0 + want.abs()) + 1e-4;
                            assert!((got - want).abs() <= tol, "{dtype} {what}: {got} vs {want}");
                        }
                        // Bit-identical whatever the tile size and the slot in it.
                        assert_eq!(
                            out[t].to_bits(),
                            gemv.to_bits(),
                            "{dtype} tile {n} slot {t}"
                        );
                    }
                }
            }
        }
    }
}
