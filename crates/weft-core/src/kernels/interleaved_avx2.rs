//! x86 twins of [`super::interleaved::tile`], [`super::interleaved::tile_k4`],
//! [`super::interleaved::tile_k6`] and [`super::interleaved::tile_q8_0`]: one group of 8 interleaved rows · 1 to 4 activation rows
//! (see `interleaved` and `interleaved_k` for the layouts), in modules `avx2`, `avxvnni` and
//! `avx512`: one generic body per tile, over the set's dot-product primitive ([`Isa`]).

use std::arch::x86_64::*;

use super::interleaved::{Legacy, LegacyActs, K4_GROUP_BYTES, K6_GROUP_BYTES, Q8_BLOCK_BYTES};
use super::quantize::{Q8KRow, QK8, QK_K};
use super::x86::{dots, dots_scaled, load256, prefetch_ahead, stamp_isas, Isa};
use crate::gguf::GgmlType;

/// Calls `$tile::<…, T>` with `T = $n` tokens (1 to 4) as a constant.
macro_rules! by_tokens {
    ($n:expr, $tile:ident $(::<$($c:tt),*>)? ($($arg:expr),*)) => {
        match $n {
            0 => {}
            1 => $tile::<$($($c,)*)? 1>($($arg),*),
            2 => $tile::<$($($c,)*)? 2>($($arg),*),
            3 => $tile::<$($($c,)*)? 3>($($arg),*),
            4 => $tile::<$($($c,)*)? 4>($($arg),*),
            n => panic!("a tile takes at most 4 rows, got {n}"),
        }
    };
}
pub(super) use by_tokens;

/// The 4 activation bytes `y[i..i + 4]` in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(y: *const i8, i: usize) -> __m256i {
    _mm256_set1_epi32((y.add(i) as *const i32).read_unaligned())
}

/// One token's products with two chunks of a 32-element block, `[lo_a, hi_a, lo_b, hi_b]`:
/// low halves against `y[i..i + 8]`, high halves against `y[16 + i..]`; the four products sum
/// in i16 on AVX2 (at most `4 · 2 · 31 · 127 < 2^15`).
#[inline(always)]
unsafe fn chunk_pair<P: Isa>(y: *const i8, i: usize, w: [__m256i; 4]) -> __m256i {
    let ys = [
        bcast4(y, i),
        bcast4(y, 16 + i),
        bcast4(y, i + 4),
        bcast4(y, 20 + i),
    ];
    dots::<P, 4>(w, ys)
}

/// One group · `T` tokens. `HIGH`: a 5th bit in `qh` (Q5_0, Q5_1); `MIN`: a min per row
/// and Q8_1 activations (Q4_1, Q5_1), else an offset corrected with the block sums.
///
/// Per block: the 4 chunks of `qs` unpack to 8 vectors of unsigned quants (lane `r`: 4 quants
/// of row `r`), each `maddubs`-multiplied with 4 broadcast activation bytes. Four products of
/// at most `2 · 31 · 127` fit an i16 lane, so chunks 0–1 and 2–3 each sum in i16 before one
/// `madd` widens them; then `(Σ q·y [− offset·Σ y]) · d_x` (8 rows at once) is added times
/// `d_y` with one FMA per token, and `m · s_y` with another — the scalar reference's order, so
/// the bits agree.
#[inline(always)]
unsafe fn tile_t<P: Isa, const HIGH: bool, const MIN: bool, const T: usize>(
    w: &[u8],
    ys: &LegacyActs,
    out: &mut [[f32; 8]],
) {
    let kind = Legacy {
        high: HIGH,
        min: MIN,
    };
    let (bytes, qh0, qs0) = (kind.bytes(), kind.qh_at(), kind.qs_at());
    let ds = kind.d_stride();
    let nb = w.len() / bytes;
    assert!(w.len() == nb * bytes && out.len() == T && ys.qs.len() == T * nb * QK8);
    assert!(ys.d.len() == T * nb * ds && ys.sums.len() == if MIN { 0 } else { T * nb });
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK8));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb * ds));
    let ysum: [*const i32; T] = std::array::from_fn(|t| ys.sums.as_ptr().wrapping_add(t * nb));
    let (m4, m5) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let mut acc = [_mm256_setzero_ps(); T];
    // Whether to hint the weights ahead: off on CPUs where the hints made these tiles slower.
    let hint = super::weight_prefetch();
    for b in 0..nb {
        let p = w.as_ptr().add(b * bytes);
        if hint {
            prefetch_ahead(p, bytes);
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let bits = if HIGH {
            load256(p.add(qh0))
        } else {
            _mm256_setzero_si256()
        };
        // Chunk c: quants of elements 4c.. (low nibbles, 5th bit = bit c of `bits`) and
        // 16 + 4c.. (high nibbles, 5th bit = bit c + 4), moved to bit 4 by the shifts given.
        macro_rules! chunk {
            ($c:literal, $lo_bits:expr, $hi_bits:expr) => {{
                let v = load256(p.add(qs0 + 32 * $c));
                let mut lo = _mm256_and_si256(v, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                if HIGH {
                    lo = _mm256_or_si256(lo, _mm256_and_si256($lo_bits, m5));
                    hi = _mm256_or_si256(hi, _mm256_and_si256($hi_bits, m5));
                }
                (lo, hi)
            }};
        }
        let (w0, w1) = chunk!(0, _mm256_slli_epi16::<4>(bits), bits);
        let (w2, w3) = chunk!(
            1,
            _mm256_slli_epi16::<3>(bits),
            _mm256_srli_epi16::<1>(bits)
        );
        let mut s01 = [_mm256_setzero_si256(); T];
        for t in 0..T {
            s01[t] = chunk_pair::<P>(yq[t].add(b * QK8), 0, [w0, w1, w2, w3]);
        }
        let (w4, w5) = chunk!(
            2,
            _mm256_slli_epi16::<2>(bits),
            _mm256_srli_epi16::<2>(bits)
        );
        let (w6, w7) = chunk!(
            3,
            _mm256_slli_epi16::<1>(bits),
            _mm256_srli_epi16::<3>(bits)
        );
        let m = if MIN {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i))
        } else {
            _mm256_setzero_ps()
        };
        for t in 0..T {
            let s23 = chunk_pair::<P>(yq[t].add(b * QK8), 8, [w4, w5, w6, w7]);
            let mut s = _mm256_add_epi32(s01[t], s23);
            if !MIN {
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(*ysum[t].add(b)));
            }
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(s), dx);
            let d = yd[t].add(b * ds);
            acc[t] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(&*d), acc[t]);
            if MIN {
                acc[t] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(&*d.add(1)), acc[t]);
            }
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// One Q4_K group · `T` tokens.
///
/// Per sub-block of 32 columns: 8 products of unsigned 4-bit quants (lane `r`: 4 quants of row
/// `r`) with 4 broadcast activation bytes, scaled by the rows' scales ([`dots_scaled`]; on
/// AVX2 all 8 fit an i16 lane, `8 · 2 · 15 · 127 < 2^15`, and one `madd` widens and scales
/// them at once). The mins meet the activation sums of two sub-blocks per `madd`. Then the
/// scalar reference's two FMAs per super-block, 8 rows at a time.
#[inline(always)]
unsafe fn tile_k4_t<P: Isa, const T: usize>(w: &[u8], ys: &Q8KRow, out: &mut [[f32; 8]]) {
    let nb = w.len() / K4_GROUP_BYTES;
    assert!(w.len() == nb * K4_GROUP_BYTES && out.len() == T && ys.qs.len() == T * nb * QK_K);
    assert!(ys.d.len() == T * nb && ys.bsums.len() == T * nb * 16);
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK_K));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb));
    let ybs: [*const i16; T] = std::array::from_fn(|t| ys.bsums.as_ptr().add(t * nb * 16));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); T];
    // Whether to hint the weights ahead: off on CPUs where the hints made these tiles slower.
    let hint = super::weight_prefetch();
    for b in 0..nb {
        let p = w.as_ptr().add(b * K4_GROUP_BYTES);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
        let mut isum = [_mm256_setzero_si256(); T];
        for s in 0..8 {
            let q = p.add(160 + 128 * s);
            // An eighth of the group per sub-block, so the header's lines are hinted too.
            if hint {
                prefetch_ahead(p.add(s * K4_GROUP_BYTES / 8), K4_GROUP_BYTES / 8);
            }
            // The 8 rows' scales of sub-block s, each in both i16 halves of its lane.
            let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(32 + 8 * s) as *const __m128i));
            let sc = _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc));
            // Chunk c: low nibbles (elements 4c..) and high nibbles (16 + 4c..) of 8 rows.
            let mut w8 = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let v = load256(q.add(32 * c));
                w8[2 * c] = _mm256_and_si256(v, m4);
                w8[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            }
            for t in 0..T {
                let y = yq[t].add(b * QK_K + 32 * s);
                let mut y8 = [_mm256_setzero_si256(); 8];
                for (k, y8) in y8.iter_mut().enumerate() {
                    *y8 = bcast4(y, 4 * (k / 2) + 16 * (k % 2));
                }
                isum[t] = _mm256_add_epi32(isum[t], dots_scaled::<P, 8>(w8, y8, sc));
            }
        }
        for t in 0..T {
            // Sums of the 8 groups of 32 activations, as 4 pairs of i16 (one pair per i32).
            let bs = load256(ybs[t].add(16 * b));
            let pairs = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let mut msum = _mm256_setzero_si256();
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
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(96 + 16 * i) as *const __m128i));
                let ysum = _mm256_broadcastsi128_si256(pair);
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins, ysum));
            }
            let dy = _mm256_broadcast_ss(&*yd[t].add(b));
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t]), d);
            acc[t] = _mm256_fmadd_ps(v, dy, acc[t]);
            let m = _mm256_mul_ps(_mm256_cvtepi32_ps(msum), dmin);
            acc[t] = _mm256_fnmadd_ps(m, dy, acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// One token's products with two chunks of a Q6_K sub-block, `[lo_a, lo_b, hi_a, hi_b]`: low
/// halves against `y[i..i + 8]`, high halves against `y[16 + i..]`, each pair summed and
/// scaled by the scale of its 16-column group (`lo`, `hi`: in both i16 halves of each lane).
#[inline(always)]
unsafe fn k6_chunk_pair<P: Isa>(
    y: *const i8,
    i: usize,
    w: [__m256i; 4],
    lo: __m256i,
    hi: __m256i,
) -> __m256i {
    let a = dots_scaled::<P, 2>([w[0], w[1]], [bcast4(y, i), bcast4(y, i + 4)], lo);
    let c = dots_scaled::<P, 2>([w[2], w[3]], [bcast4(y, 16 + i), bcast4(y, 20 + i)], hi);
    _mm256_add_epi32(a, c)
}

/// One Q6_K group · `T` tokens.
///
/// Per sub-block of 32 columns: the low nibbles and the 2 high bits (moved to bits 4–5) make
/// 8 vectors of unsigned 6-bit quants; two `maddubs` products (at most `2 · 2 · 63 · 127`)
/// fit an i16 lane, so each pair of chunks is widened by a `madd` with the scale of its
/// 16-column group (in both i16 halves of each row's lane). The offset 32 leaves with one more
/// `madd` per sub-block: `32 · sc` (pairs of groups) · the activations' pairs of 16-sums.
#[inline(always)]
unsafe fn tile_k6_t<P: Isa, const T: usize>(w: &[u8], ys: &Q8KRow, out: &mut [[f32; 8]]) {
    let nb = w.len() / K6_GROUP_BYTES;
    assert!(w.len() == nb * K6_GROUP_BYTES && out.len() == T && ys.qs.len() == T * nb * QK_K);
    assert!(ys.d.len() == T * nb && ys.bsums.len() == T * nb * 16);
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK_K));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb));
    let ybs: [*const i16; T] = std::array::from_fn(|t| ys.bsums.as_ptr().add(t * nb * 16));
    let (m4, m6) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    // Within each row's lane (sc[2s], sc[2s + 1]) → (sc[2s], sc[2s]) and (sc[2s+1], sc[2s+1]).
    #[rustfmt::skip]
    let (even, odd) = (
        _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                         0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13),
        _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                         2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15),
    );
    let mut acc = [_mm256_setzero_ps(); T];
    // Whether to hint the weights ahead: off on CPUs where the hints made these tiles slower.
    let hint = super::weight_prefetch();
    for b in 0..nb {
        let p = w.as_ptr().add(b * K6_GROUP_BYTES);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mut isum = [_mm256_setzero_si256(); T];
        for s in 0..8 {
            let q = p.add(144 + 192 * s);
            if hint {
                prefetch_ahead(p.add(s * K6_GROUP_BYTES / 8), K6_GROUP_BYTES / 8);
            }
            let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16 + 16 * s) as *const __m128i));
            let (sc_lo, sc_hi) = (
                _mm256_shuffle_epi8(pair, even),
                _mm256_shuffle_epi8(pair, odd),
            );
            let pair32 = _mm256_slli_epi16::<5>(pair);
            let (ha, hb) = (load256(q.add(128)), load256(q.add(160)));
            // Chunk c: low nibbles | high bits 2c..2c+2 of `ha` (elements 4c..), and high
            // nibbles | those of `hb` (elements 16 + 4c..), the bits moved to 4–5 by $shift
            // (a macro, not a closure: a closure would not inherit the target features).
            macro_rules! chunk {
                ($c:literal, $shift:ident, $n:literal) => {{
                    let v = load256(q.add(32 * $c));
                    let lo = _mm256_and_si256(v, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    let (sa, sb) = ($shift::<$n>(ha), $shift::<$n>(hb));
                    (
                        _mm256_or_si256(lo, _mm256_and_si256(sa, m6)),
                        _mm256_or_si256(hi, _mm256_and_si256(sb, m6)),
                    )
                }};
            }
            let (l0, h0) = chunk!(0, _mm256_slli_epi16, 4);
            let (l1, h1) = chunk!(1, _mm256_slli_epi16, 2);
            for t in 0..T {
                let y = yq[t].add(b * QK_K + 32 * s);
                let v = k6_chunk_pair::<P>(y, 0, [l0, l1, h0, h1], sc_lo, sc_hi);
                isum[t] = _mm256_add_epi32(isum[t], v);
            }
            let (l2, h2) = chunk!(2, _mm256_slli_epi16, 0);
            let (l3, h3) = chunk!(3, _mm256_srli_epi16, 2);
            for t in 0..T {
                let y = yq[t].add(b * QK_K + 32 * s);
                let v = k6_chunk_pair::<P>(y, 8, [l2, l3, h2, h3], sc_lo, sc_hi);
                // 32 · (sc[2s] · Σy[2s] + sc[2s+1] · Σy[2s+1]): the offset of both groups.
                let sums = (ybs[t].add(16 * b + 2 * s) as *const i32).read_unaligned();
                let off = _mm256_madd_epi16(pair32, _mm256_set1_epi32(sums));
                isum[t] = _mm256_sub_epi32(_mm256_add_epi32(isum[t], v), off);
            }
        }
        for t in 0..T {
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t]), d);
            acc[t] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(&*yd[t].add(b)), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// One interleaved Q8_0 group · `T` tokens (`ys.sums`: `128 · Σ y` per block, read by the
/// VNNI sets only).
///
/// Per block, 8 chunks of signed quants (lane `r`: 4 quants of row `r`) meet 4 broadcast
/// activation bytes each. AVX2 multiplies `|q|` by `sign(q)·y` and widens every `maddubs` at
/// once (a pair sum reaches `2 · 128 · 127`, so two would overflow i16); VNNI flips the quants'
/// top bit (`q + 128`, unsigned) and subtracts `128 · Σ y`. Then `(Σ · d_x) · d_y` with one FMA
/// per token, as the scalar reference.
#[inline(always)]
unsafe fn tile_q8_t<P: Isa, const T: usize>(w: &[u8], ys: &LegacyActs, out: &mut [[f32; 8]]) {
    let nb = w.len() / Q8_BLOCK_BYTES;
    assert!(w.len() == nb * Q8_BLOCK_BYTES && out.len() == T && ys.qs.len() == T * nb * QK8);
    assert!(ys.d.len() == T * nb && (!P::VNNI || ys.sums.len() == T * nb));
    let yq: [*const i8; T] = std::array::from_fn(|t| ys.qs.as_ptr().add(t * nb * QK8));
    let yd: [*const f32; T] = std::array::from_fn(|t| ys.d.as_ptr().add(t * nb));
    let ysum: [*const i32; T] = std::array::from_fn(|t| ys.sums.as_ptr().wrapping_add(t * nb));
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let mut acc = [_mm256_setzero_ps(); T];
    // Whether to hint the weights ahead: off on CPUs where the hints made these tiles slower.
    let hint = super::weight_prefetch();
    for b in 0..nb {
        let p = w.as_ptr().add(b * Q8_BLOCK_BYTES);
        if hint {
            prefetch_ahead(p, Q8_BLOCK_BYTES);
        }
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mut s = [_mm256_setzero_si256(); T];
        for c in 0..8 {
            let q = load256(p.add(16 + 32 * c));
            if P::VNNI {
                let u = _mm256_xor_si256(q, flip);
                for t in 0..T {
                    s[t] = P::dpbusd(s[t], u, bcast4(yq[t].add(b * QK8), 4 * c));
                }
            } else {
                let a = _mm256_sign_epi8(q, q);
                for t in 0..T {
                    let sy = _mm256_sign_epi8(bcast4(yq[t].add(b * QK8), 4 * c), q);
                    s[t] = _mm256_add_epi32(s[t], dots::<P, 1>([a], [sy]));
                }
            }
        }
        for t in 0..T {
            if P::VNNI {
                s[t] = _mm256_sub_epi32(s[t], _mm256_set1_epi32(*ysum[t].add(b)));
            }
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(s[t]), dx);
            acc[t] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(&*yd[t].add(b)), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// The public tiles for one instruction set.
macro_rules! entries {
    ($isa:ident, $P:ty, $features:literal) => {
        /// The interleaved tiles compiled for one instruction set.
        pub mod $isa {
            use super::*;

            /// Twin of [`super::super::interleaved::tile`] for `out.len()` of 1 to 4 tokens.
            ///
            /// # Safety
            /// The CPU must support the module's instruction set.
            ///
            /// # Panics
            /// As the reference, or for more than 4 tokens.
            #[target_feature(enable = $features)]
            pub unsafe fn tile(dtype: GgmlType, w: &[u8], ys: &LegacyActs, out: &mut [[f32; 8]]) {
                let (kind, n) = (Legacy::of(dtype).expect("a 32-element type"), out.len());
                match (kind.high, kind.min) {
                    (false, false) => by_tokens!(n, tile_t::<$P, false, false>(w, ys, out)),
                    (false, true) => by_tokens!(n, tile_t::<$P, false, true>(w, ys, out)),
                    (true, false) => by_tokens!(n, tile_t::<$P, true, false>(w, ys, out)),
                    (true, true) => by_tokens!(n, tile_t::<$P, true, true>(w, ys, out)),
                }
            }

            /// Twin of [`super::super::interleaved::tile_k4`] for `out.len()` of 1 to 4 tokens.
            ///
            /// # Safety
            /// The CPU must support the module's instruction set.
            ///
            /// # Panics
            /// As the reference, or for more than 4 tokens.
            #[target_feature(enable = $features)]
            pub unsafe fn tile_k4(w: &[u8], ys: &Q8KRow, out: &mut [[f32; 8]]) {
                by_tokens!(out.len(), tile_k4_t::<$P>(w, ys, out))
            }

            /// Twin of [`super::super::interleaved::tile_k6`] for `out.len()` of 1 to 4 tokens.
            ///
            /// # Safety
            /// The CPU must support the module's instruction set.
            ///
            /// # Panics
            /// As the reference, or for more than 4 tokens.
            #[target_feature(enable = $features)]
            pub unsafe fn tile_k6(w: &[u8], ys: &Q8KRow, out: &mut [[f32; 8]]) {
                by_tokens!(out.len(), tile_k6_t::<$P>(w, ys, out))
            }

            /// Twin of [`super::super::interleaved::tile_q8_0`] for `out.len()` of 1 to 4
            /// tokens (`ys.sums`: the block sums with offset 128).
            ///
            /// # Safety
            /// The CPU must support the module's instruction set.
            ///
            /// # Panics
            /// As the reference, or for more than 4 tokens.
            #[target_feature(enable = $features)]
            pub unsafe fn tile_q8_0(w: &[u8], ys: &LegacyActs, out: &mut [[f32; 8]]) {
                by_tokens!(out.len(), tile_q8_t::<$P>(w, ys, out))
            }
        }
    };
}

stamp_isas!(entries);
