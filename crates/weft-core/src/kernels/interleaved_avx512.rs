//! The AVX-512 pair tile of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1): two groups of 8
//! interleaved rows · 1 to 4 tokens on 512-bit registers, group `a` in the low 256 bits and
//! group `b` in the high ones.
//!
//! The activation bytes a token's 16 rows meet are the same, so every broadcast, and every
//! unpacking and `vpdpbusd` of the weights, serves 16 rows instead of 8: half the instructions
//! of two calls of the 256-bit tile (`interleaved_avx2::avx512::tile`). Each lane takes the same
//! operations as in that tile (exact integer sums, then the same float multiply and FMAs), so
//! the results have the same bits.

use std::arch::x86_64::*;

use super::interleaved::{Legacy, LegacyActs};
use super::quantize::QK8;
use super::x86::PREFETCH_BYTES;
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
    _mm512_cvtph_ps(_mm256_set_m128i(
        _mm_loadu_si128(pb as *const __m128i),
        _mm_loadu_si128(pa as *const __m128i),
    ))
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
    for b in 0..nb {
        let (pa, pb) = (wa.as_ptr().add(b * bytes), wb.as_ptr().add(b * bytes));
        _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(PREFETCH_BYTES) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(pb.wrapping_add(PREFETCH_BYTES) as *const i8);
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
    let kind = Legacy::of(dtype).expect("a 32-element type");
    macro_rules! by_tokens {
        ($h:literal, $m:literal) => {
            match out.len() {
                0 => {}
                1 => tile_pair_t::<$h, $m, 1>(wa, wb, ys, out),
                2 => tile_pair_t::<$h, $m, 2>(wa, wb, ys, out),
                3 => tile_pair_t::<$h, $m, 3>(wa, wb, ys, out),
                4 => tile_pair_t::<$h, $m, 4>(wa, wb, ys, out),
                n => panic!("a tile takes at most 4 rows, got {n}"),
            }
        };
    }
    match (kind.high, kind.min) {
        (false, false) => by_tokens!(false, false),
        (false, true) => by_tokens!(false, true),
        (true, false) => by_tokens!(true, false),
        (true, true) => by_tokens!(true, true),
    }
}
