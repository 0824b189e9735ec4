//! Small AVX2 building blocks shared by the x86-64 kernels.
//!
//! Every function requires AVX2, FMA and F16C (callers are `#[target_feature]` functions that
//! are only reached after run-time detection) and reads memory through raw pointers that the
//! caller guarantees to be in bounds.

use std::arch::x86_64::*;

/// The sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The two little-endian f16 values at `p` and `p + 2`, widened: lanes 0 and 1 (2 and 3 zero).
///
/// Written in assembly on purpose: from intrinsics, LLVM narrows the load to 16 bits and emits
/// `vpinsrw` into whatever register is free, often an accumulator — a false dependency that
/// serialized whole loops on the FMA chains. `vmovd` zero-extends and depends on nothing.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16x2_at(p: *const u8) -> __m128 {
    let out: __m128;
    std::arch::asm!(
        "vmovd {v}, dword ptr [{p}]",
        "vcvtph2ps {v}, {v}",
        p = in(reg) p,
        v = out(xmm_reg) out,
        options(pure, readonly, nostack, preserves_flags),
    );
    out
}

/// The little-endian f16 at `p`, widened to `f32`; reads 4 bytes (`p..p + 4` must be valid).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(f16x2_at(p))
}

/// The 32 nibbles of the 16 bytes at `p` as bytes `0..=15`: byte `j < 16` is the low nibble of
/// `p[j]`, byte `16 + j` its high nibble (the element order of the 32-element quants).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn nibbles(p: *const u8) -> __m256i {
    let lo = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_srli_epi16::<4>(lo);
    _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0x0F))
}

/// Byte `i` = 0xFF when bit `i` of the little-endian `u32` at `p` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn bit_mask(p: *const u8) -> __m256i {
    let bits = (p as *const u32).read_unaligned() as i32;
    // Bytes 0..8 take byte 0 of `bits`, bytes 8..16 byte 1, and so on …
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    // … then byte i keeps only bit i % 8 and is compared with it.
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// Partial sums (8 lanes of `i32`) of `x[i] · y[i]` for unsigned bytes `x < 64` and signed `y`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn load256<T>(p: *const T) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// How far ahead of the current weight byte the 32-element kernels prefetch.
pub const PREFETCH_BYTES: usize = 1024;

/// Hints the cache line `PREFETCH_BYTES` after `p` into L1 (no fault if out of bounds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES) as *const i8);
}
