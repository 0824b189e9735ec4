//! The AVX-512 pair tiles of the interleaved types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K,
//! Q8_0): two groups of 8 interleaved rows · 1 to 4 tokens on 512-bit registers, group `a` in
//! the low 256 bits and group `b` in the high ones.
//!
//! The activation bytes a token's 16 rows meet are the same, so every broadcast, and every
//! unpacking and `vpdpbusd` of the weights, serves 16 rows instead of 8: half the instructions
//! of two calls of the 256-bit tiles (`interleaved_avx2::avx512`). Each lane takes the same
//! operations as in those tiles (exact integer sums, then the same float multiplies and FMAs),
//! so the results have the same bits.
//!
//! Each call reads two groups side by side, and the next call the two after them: two streams
//! per core, each skipping the other's groups, which the prefetch hints follow ([`PairAhead`]).
//! For one token (a decode step) the pair tiles are used only where
//! [`super::one_token_pairs`] says so (not on AMD's CPUs, where they were slower).

use std::arch::x86_64::*;

use super::interleaved::{Legacy, LegacyActs, K4_GROUP_BYTES, K6_GROUP_BYTES, Q8_BLOCK_BYTES};
use super::interleaved_avx2::by_tokens;
use super::quantize::{Q8KRow, QK8, QK_K};
use super::x86::PairAhead;
use crate::gguf::GgmlType;

/// 32 bytes of group `a` at `pa` (low half) and 32 of group `b` at `pb` (high half).
#[inline(always)]
unsafe fn load2(pa: *const u8, pb: *const u8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256(pa as *const __m256i));
    _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(pb as *const __m256i))
}

/// The 8 f16 at `pa` (group `a`'s rows) and the 8 at `pb` (group `b`'s), widened.
#[inline(always)]
unsafe fn f16x16(pa: *const u8, pb: *const u8) -> __m512 {
    _mm512_cvtph_ps(bytes16x2(pa, pb))
}

/// The 8 bytes at `pa` (group `a`) and the 8 at `pb` (group `b`), in the low 128 bits.
#[inline(always)]
unsafe fn bytes8x2(pa: *const u8, pb: *const u8) -> __m128i {
    _mm_unpacklo_epi64(
        _mm_loadl_epi64(pa as *const __m128i),
        _mm_loadl_epi64(pb as *const __m128i),
    )
}

/// The 16 bytes at `pa` (group `a`) and the 16 at `pb` (group `b`).
#[inline(always)]
unsafe fn bytes16x2(pa: *const u8, pb: *const u8) -> __m256i {
    _mm256_set_m128i(
        _mm_loadu_si128(pb as *const __m128i),
        _mm_loadu_si128(pa as *const __m128i),
    )
}

/// The 4 activation bytes `y[i..i + 4]` in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(y: *const i8, i: usize) -> __m512i {
    _mm512_set1_epi32((y.add(i) as *const i32).read_unaligned())
}

/// One token's products with two chunks of a block, `w = [lo_a, hi_a, lo_b, hi_b]` (low
/// halves against `y[i..i + 8]`, high halves against `y[16 + i..]`), in two `vpdpbusd` chains.
#[inline(always)]
unsafe fn chunk_pair(y: *const i8, i: usize, w: [__m512i; 4]) -> __m512i {
    let zero = _mm512_setzero_si512();
    let even = _mm512_dpbusd_epi32(zero, w[0], bcast4(y, i));
    let odd = _mm512_dpbusd_epi32(zero, w[1], bcast4(y, 16 + i));
    let even = _mm512_dpbusd_epi32(even, w[2], bcast4(y, i + 4));
    let odd = _mm512_dpbusd_epi32(odd, w[3], bcast4(y, 20 + i));
    _mm512_add_epi32(even, odd)
}

/// Groups `wa` and `wb` · `T` tokens: `tile_t` of `interleaved_avx2` on 16 rows at once.
/// `HIGH`: a 5th bit in `qh` (Q5_0, Q5_1); `MIN`: a min per row and Q8_1 activations.
#[inline(always)]
unsafe fn tile_pair_t<const HIGH: bool, const MIN: bool, const T: usize>(
    wa: &[u8],
    wb: &[u8],
    ys: &LegacyActs,
    out: &mut [[f32; 16]],
) {
    let kind = Legacy {
        high: HIGH,
        min: MIN,
    };
    let (bytes, qh0, qs0) = (kind.bytes(), kind.qh_at(), kind.qs_at());
    let ds = kind.d_stride();
    let nb = wa.len() / bytes;
    assert!(wa.len() == nb * bytes && wb.len() == wa.len() && out.len() == T);
    assert!(ys.qs.len() == T * nb * QK8 && ys.d.len() == T * nb * ds);
    assert!(ys.sums.len() == if MIN { 0 } else { T * nb });
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK8));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb * ds));
    let ysum: [*const i32; T] = std::array::from_fn(|t| ys.sums.as_ptr().wrapping_add(t * nb));
    let (m4, m5) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let mut acc = [_mm512_setzero_ps(); T];
    let mut ahead = PairAhead::new(wa.len());
    for b in 0..nb {
        let (pa, pb) = (wa.as_ptr().add(b * bytes), wb.as_ptr().add(b * bytes));
        ahead.hint(wa.as_ptr(), 0, bytes);
        ahead.hint(wb.as_ptr(), 0, bytes);
        ahead.step(bytes);
        let dx = f16x16(pa, pb);
        let bits = if HIGH {
            load2(pa.add(qh0), pb.add(qh0))
        } else {
            _mm512_setzero_si512()
        };
        // Chunk c: quants of elements 4c.. (low nibbles, 5th bit = bit c of `bits`) and
        // 16 + 4c.. (high nibbles, 5th bit = bit c + 4), moved to bit 4 by the shifts given.
        macro_rules! chunk {
            ($c:literal, $lo_bits:expr, $hi_bits:expr) => {{
                let v = load2(pa.add(qs0 + 32 * $c), pb.add(qs0 + 32 * $c));
                let mut lo = _mm512_and_si512(v, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                if HIGH {
                    lo = _mm512_or_si512(lo, _mm512_and_si512($lo_bits, m5));
                    hi = _mm512_or_si512(hi, _mm512_and_si512($hi_bits, m5));
                }
                (lo, hi)
            }};
        }
        let (w0, w1) = chunk!(0, _mm512_slli_epi16::<4>(bits), bits);
        let (w2, w3) = chunk!(
            1,
            _mm512_slli_epi16::<3>(bits),
            _mm512_srli_epi16::<1>(bits)
        );
        let mut s01 = [_mm512_setzero_si512(); T];
        for t in 0..T {
            s01[t] = chunk_pair(yq[t].add(b * QK8), 0, [w0, w1, w2, w3]);
        }
        let (w4, w5) = chunk!(
            2,
            _mm512_slli_epi16::<2>(bits),
            _mm512_srli_epi16::<2>(bits)
        );
        let (w6, w7) = chunk!(
            3,
            _mm512_slli_epi16::<1>(bits),
            _mm512_srli_epi16::<3>(bits)
        );
        let m = if MIN {
            f16x16(pa.add(16), pb.add(16))
        } else {
            _mm512_setzero_ps()
        };
        for t in 0..T {
            let s23 = chunk_pair(yq[t].add(b * QK8), 8, [w4, w5, w6, w7]);
            let mut s = _mm512_add_epi32(s01[t], s23);
            if !MIN {
                s = _mm512_sub_epi32(s, _mm512_set1_epi32(*ysum[t].add(b)));
            }
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(s), dx);
            let d = yd[t].add(b * ds);
            acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(*d), acc[t]);
            if MIN {
                acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(*d.add(1)), acc[t]);
            }
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Two groups of a 32-element type (`wa`, `wb`: [`super::interleaved::tile`]'s `w` each) ·
/// `out.len()` of 1 to 4 tokens: `out[t][r]` gets row `r` of `wa` for `r < 8`, row `r − 8` of
/// `wb` above — the bits of two calls of the 256-bit tile.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI (with AVX2, FMA and F16C).
///
/// # Panics
/// As the reference, if the groups differ in size, or for more than 4 tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tile_pair(
    dtype: GgmlType,
    wa: &[u8],
    wb: &[u8],
    ys: &LegacyActs,
    out: &mut [[f32; 16]],
) {
    let (kind, n) = (Legacy::of(dtype).expect("a 32-element type"), out.len());
    match (kind.high, kind.min) {
        (false, false) => by_tokens!(n, tile_pair_t::<false, false>(wa, wb, ys, out)),
        (false, true) => by_tokens!(n, tile_pair_t::<false, true>(wa, wb, ys, out)),
        (true, false) => by_tokens!(n, tile_pair_t::<true, false>(wa, wb, ys, out)),
        (true, true) => by_tokens!(n, tile_pair_t::<true, true>(wa, wb, ys, out)),
    }
}

/// Two Q4_K groups · `T` tokens: `tile_k4_t` of `interleaved_avx2` (its VNNI form) on 16 rows.
#[inline(always)]
unsafe fn tile_k4_pair_t<const T: usize>(wa: &[u8], wb: &[u8], ys: &Q8KRow, out: &mut [[f32; 16]]) {
    let nb = wa.len() / K4_GROUP_BYTES;
    assert!(wa.len() == nb * K4_GROUP_BYTES && wb.len() == wa.len() && out.len() == T);
    assert!(ys.qs.len() == T * nb * QK_K && ys.d.len() == T * nb);
    assert!(ys.bsums.len() == T * nb * 16);
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK_K));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb));
    let ybs: [*const i16; T] = std::array::from_fn(|t| ys.bsums.as_ptr().add(t * nb * 16));
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut ahead = PairAhead::new(wa.len());
    for b in 0..nb {
        let (pa, pb) = (
            wa.as_ptr().add(b * K4_GROUP_BYTES),
            wb.as_ptr().add(b * K4_GROUP_BYTES),
        );
        let here = ahead;
        ahead.step(K4_GROUP_BYTES);
        let d = f16x16(pa, pb);
        let dmin = f16x16(pa.add(16), pb.add(16));
        let mut isum = [_mm512_setzero_si512(); T];
        for s in 0..8 {
            let (qa, qb) = (pa.add(160 + 128 * s), pb.add(160 + 128 * s));
            // An eighth of the group per sub-block, so the header's lines are hinted too.
            here.hint(wa.as_ptr(), s * K4_GROUP_BYTES / 8, K4_GROUP_BYTES / 8);
            here.hint(wb.as_ptr(), s * K4_GROUP_BYTES / 8, K4_GROUP_BYTES / 8);
            // The 16 rows' scales of sub-block s, one per lane.
            let sc = _mm512_cvtepu8_epi32(bytes8x2(pa.add(32 + 8 * s), pb.add(32 + 8 * s)));
            // Chunk c: low nibbles (elements 4c..) and high nibbles (16 + 4c..) of 16 rows.
            let mut w8 = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let v = load2(qa.add(32 * c), qb.add(32 * c));
                w8[2 * c] = _mm512_and_si512(v, m4);
                w8[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            }
            for t in 0..T {
                let y = yq[t].add(b * QK_K + 32 * s);
                let zero = _mm512_setzero_si512();
                let (mut even, mut odd) = (zero, zero);
                for k in 0..4 {
                    // Pair k: chunk k's low nibbles · y[4k..], its high nibbles · y[16 + 4k..].
                    even = _mm512_dpbusd_epi32(even, w8[2 * k], bcast4(y, 4 * k));
                    odd = _mm512_dpbusd_epi32(odd, w8[2 * k + 1], bcast4(y, 16 + 4 * k));
                }
                let v = _mm512_mullo_epi32(_mm512_add_epi32(even, odd), sc);
                isum[t] = _mm512_add_epi32(isum[t], v);
            }
        }
        for t in 0..T {
            // Sums of the 8 groups of 32 activations, as 4 pairs of i16 (one pair per i32).
            let bs = _mm256_loadu_si256(ybs[t].add(16 * b) as *const __m256i);
            let pairs = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let mut msum = _mm512_setzero_si512();
            for (i, pair) in [
                _mm_shuffle_epi32::<0x00>(pairs),
                _mm_shuffle_epi32::<0x55>(pairs),
                _mm_shuffle_epi32::<0xAA>(pairs),
                _mm_shuffle_epi32::<0xFF>(pairs),
            ]
            .into_iter()
            .enumerate()
            {
                let mins =
                    _mm512_cvtepu8_epi16(bytes16x2(pa.add(96 + 16 * i), pb.add(96 + 16 * i)));
                let ysum = _mm512_broadcast_i32x4(pair);
                msum = _mm512_add_epi32(msum, _mm512_madd_epi16(mins, ysum));
            }
            let dy = _mm512_set1_ps(*yd[t].add(b));
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), d);
            acc[t] = _mm512_fmadd_ps(v, dy, acc[t]);
            let m = _mm512_mul_ps(_mm512_cvtepi32_ps(msum), dmin);
            acc[t] = _mm512_fnmadd_ps(m, dy, acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// `Σ maddubs(u_k, s_k)` over two pairs, widened and scaled by `scale` (per i32 lane, in both
/// i16 halves): `dots_scaled` of `x86` for two products, on 512-bit registers.
#[inline(always)]
unsafe fn scaled2(u: [__m512i; 2], s: [__m512i; 2], scale: __m512i) -> __m512i {
    let p = _mm512_add_epi16(
        _mm512_maddubs_epi16(u[0], s[0]),
        _mm512_maddubs_epi16(u[1], s[1]),
    );
    _mm512_madd_epi16(p, scale)
}

/// One token's products with chunks `l`, `h` of pair `i` (`y[i..]`, `y[16 + i..]`), `w =
/// [l_lo, l_hi, h_lo, h_hi]`, scaled by the sub-block scales `lo` and `hi`.
#[inline(always)]
unsafe fn k6_chunk_pair(
    y: *const i8,
    i: usize,
    w: [__m512i; 4],
    lo: __m512i,
    hi: __m512i,
) -> __m512i {
    let a = scaled2([w[0], w[1]], [bcast4(y, i), bcast4(y, i + 4)], lo);
    let c = scaled2([w[2], w[3]], [bcast4(y, 16 + i), bcast4(y, 20 + i)], hi);
    _mm512_add_epi32(a, c)
}

/// Two Q6_K groups · `T` tokens: `tile_k6_t` of `interleaved_avx2` on 16 rows.
#[inline(always)]
unsafe fn tile_k6_pair_t<const T: usize>(wa: &[u8], wb: &[u8], ys: &Q8KRow, out: &mut [[f32; 16]]) {
    let nb = wa.len() / K6_GROUP_BYTES;
    assert!(wa.len() == nb * K6_GROUP_BYTES && wb.len() == wa.len() && out.len() == T);
    assert!(ys.qs.len() == T * nb * QK_K && ys.d.len() == T * nb);
    assert!(ys.bsums.len() == T * nb * 16);
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK_K));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb));
    let ybs: [*const i16; T] = std::array::from_fn(|t| ys.bsums.as_ptr().add(t * nb * 16));
    let (m4, m6) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    // Within each row's lane (sc[2s], sc[2s + 1]) → (sc[2s], sc[2s]) and (sc[2s+1], sc[2s+1]);
    // `vpshufb` works within each 128-bit lane, so one pattern serves all four.
    #[rustfmt::skip]
    let (even, odd) = (
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13)),
        _mm512_broadcast_i32x4(_mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15)),
    );
    let mut acc = [_mm512_setzero_ps(); T];
    let mut ahead = PairAhead::new(wa.len());
    for b in 0..nb {
        let (pa, pb) = (
            wa.as_ptr().add(b * K6_GROUP_BYTES),
            wb.as_ptr().add(b * K6_GROUP_BYTES),
        );
        let here = ahead;
        ahead.step(K6_GROUP_BYTES);
        let d = f16x16(pa, pb);
        let mut isum = [_mm512_setzero_si512(); T];
        for s in 0..8 {
            let (qa, qb) = (pa.add(144 + 192 * s), pb.add(144 + 192 * s));
            here.hint(wa.as_ptr(), s * K6_GROUP_BYTES / 8, K6_GROUP_BYTES / 8);
            here.hint(wb.as_ptr(), s * K6_GROUP_BYTES / 8, K6_GROUP_BYTES / 8);
            let pair = _mm512_cvtepi8_epi16(bytes16x2(pa.add(16 + 16 * s), pb.add(16 + 16 * s)));
            let (sc_lo, sc_hi) = (
                _mm512_shuffle_epi8(pair, even),
                _mm512_shuffle_epi8(pair, odd),
            );
            let pair32 = _mm512_slli_epi16::<5>(pair);
            let (ha, hb) = (
                load2(qa.add(128), qb.add(128)),
                load2(qa.add(160), qb.add(160)),
            );
            // Chunk c: low nibbles | high bits 2c..2c+2 of `ha` (elements 4c..), and high
            // nibbles | those of `hb` (elements 16 + 4c..), the bits moved to 4–5 by $shift
            // (a macro, not a closure: a closure would not inherit the target features).
            macro_rules! chunk {
                ($c:literal, $shift:ident, $n:literal) => {{
                    let v = load2(qa.add(32 * $c), qb.add(32 * $c));
                    let lo = _mm512_and_si512(v, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    let (sa, sb) = ($shift::<$n>(ha), $shift::<$n>(hb));
                    (
                        _mm512_or_si512(lo, _mm512_and_si512(sa, m6)),
                        _mm512_or_si512(hi, _mm512_and_si512(sb, m6)),
                    )
                }};
            }
            let (l0, h0) = chunk!(0, _mm512_slli_epi16, 4);
            let (l1, h1) = chunk!(1, _mm512_slli_epi16, 2);
            for t in 0..T {
                let y = yq[t].add(b * QK_K + 32 * s);
                let v = k6_chunk_pair(y, 0, [l0, l1, h0, h1], sc_lo, sc_hi);
                isum[t] = _mm512_add_epi32(isum[t], v);
            }
            let (l2, h2) = chunk!(2, _mm512_slli_epi16, 0);
            let (l3, h3) = chunk!(3, _mm512_srli_epi16, 2);
            for t in 0..T {
                let y = yq[t].add(b * QK_K + 32 * s);
                let v = k6_chunk_pair(y, 8, [l2, l3, h2, h3], sc_lo, sc_hi);
                // 32 · (sc[2s] · Σy[2s] + sc[2s+1] · Σy[2s+1]): the offset of both groups.
                let sums = (ybs[t].add(16 * b + 2 * s) as *const i32).read_unaligned();
                let off = _mm512_madd_epi16(pair32, _mm512_set1_epi32(sums));
                isum[t] = _mm512_sub_epi32(_mm512_add_epi32(isum[t], v), off);
            }
        }
        for t in 0..T {
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), d);
            acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(*yd[t].add(b)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Two groups of Q4_K (`k6` false) or Q6_K (`wa`, `wb`: [`super::interleaved::tile_k4`]'s or
/// `tile_k6`'s `w` each) · `out.len()` of 1 to 4 tokens, as [`tile_pair`] lays them out.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI (with AVX2, FMA and F16C).
///
/// # Panics
/// As the reference, if the groups differ in size, or for more than 4 tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tile_k_pair(k6: bool, wa: &[u8], wb: &[u8], ys: &Q8KRow, out: &mut [[f32; 16]]) {
    if k6 {
        by_tokens!(out.len(), tile_k6_pair_t(wa, wb, ys, out))
    } else {
        by_tokens!(out.len(), tile_k4_pair_t(wa, wb, ys, out))
    }
}

/// Two Q8_0 groups · `T` tokens: the VNNI form of `tile_q8_t` of `interleaved_avx2` on 16 rows
/// (the quants' top bit flipped, `q + 128` unsigned, then `128 · Σ y` subtracted: `ys.sums`).
#[inline(always)]
unsafe fn tile_q8_pair_t<const T: usize>(
    wa: &[u8],
    wb: &[u8],
    ys: &LegacyActs,
    out: &mut [[f32; 16]],
) {
    let nb = wa.len() / Q8_BLOCK_BYTES;
    assert!(wa.len() == nb * Q8_BLOCK_BYTES && wb.len() == wa.len() && out.len() == T);
    assert!(ys.qs.len() == T * nb * QK8 && ys.d.len() == T * nb && ys.sums.len() == T * nb);
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK8));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb));
    let ysum: [*const i32; T] = std::array::from_fn(|t| ys.sums.as_ptr().add(t * nb));
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut ahead = PairAhead::new(wa.len());
    for b in 0..nb {
        let (pa, pb) = (
            wa.as_ptr().add(b * Q8_BLOCK_BYTES),
            wb.as_ptr().add(b * Q8_BLOCK_BYTES),
        );
        ahead.hint(wa.as_ptr(), 0, Q8_BLOCK_BYTES);
        ahead.hint(wb.as_ptr(), 0, Q8_BLOCK_BYTES);
        ahead.step(Q8_BLOCK_BYTES);
        let dx = f16x16(pa, pb);
        let mut s = [_mm512_setzero_si512(); T];
        for c in 0..8 {
            let u = _mm512_xor_si512(load2(pa.add(16 + 32 * c), pb.add(16 + 32 * c)), flip);
            for t in 0..T {
                s[t] = _mm512_dpbusd_epi32(s[t], u, bcast4(yq[t].add(b * QK8), 4 * c));
            }
        }
        for t in 0..T {
            let s = _mm512_sub_epi32(s[t], _mm512_set1_epi32(*ysum[t].add(b)));
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(s), dx);
            acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(*yd[t].add(b)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Two interleaved Q8_0 groups (`wa`, `wb`) · `out.len()` of 1 to 4 tokens, as [`tile_pair`]
/// lays them out (`ys.sums`: the block sums with offset 128).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI (with AVX2, FMA and F16C).
///
/// # Panics
/// As the reference, if the groups differ in size, or for more than 4 tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn tile_q8_0_pair(wa: &[u8], wb: &[u8], ys: &LegacyActs, out: &mut [[f32; 16]]) {
    by_tokens!(out.len(), tile_q8_pair_t(wa, wb, ys, out))
}
