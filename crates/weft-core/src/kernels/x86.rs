//! Small AVX2 building blocks shared by the x86-64 kernels, and the u8 × i8 dot-product
//! primitive ([`Isa`]) that the integer tiles are generic over.
//!
//! Every function requires AVX2, FMA and F16C (callers are `#[target_feature]` functions that
//! are only reached after run-time detection) and reads memory through raw pointers that the
//! caller guarantees to be in bounds.

use std::arch::x86_64::*;

/// An x86 instruction set's u8 × i8 dot-product primitive, the inner step of every integer
/// tile: 4 unsigned weight bytes times 4 signed activation bytes, summed into an i32 lane.
///
/// AVX2 has no such instruction: `maddubs` multiplies pairs into saturating i16 lanes, and a
/// `madd` with ones widens them, so several products are best summed in i16 first (each tile
/// states why its sums cannot saturate). VNNI's `vpdpbusd` does the whole step in one
/// instruction, into i32. Both are exact, so the tiles give the same bits on every set.
///
/// The tile bodies are `#[inline(always)]` functions generic over this trait, instantiated in
/// one `#[target_feature]` entry point per set ([`stamp_isas`]): the primitive inlines into a
/// function compiled for its instructions.
pub trait Isa {
    /// Whether `dpbusd` is one VNNI instruction (else `maddubs` + `madd` + `add`).
    const VNNI: bool;
    /// `acc + Σ_{j<4} u[4i + j] · s[4i + j]` in each i32 lane `i`.
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// AVX2 + FMA + F16C.
pub struct Avx2;
/// AVX2 with AVX-VNNI's VEX-encoded `vpdpbusd`.
pub struct AvxVnni;
/// AVX-512 F/BW/VL/VNNI: the EVEX `vpdpbusd` on 256-bit registers (the 512-bit pair tiles
/// of `interleaved_avx512` use the instruction directly).
pub struct Avx512;

impl Isa for Avx2 {
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, dot_u8_i8(u, s))
    }
}

impl Isa for AvxVnni {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

impl Isa for Avx512 {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// Stamps the entry points of a kernel file once per x86 instruction set: calls
/// `$entries!(module, Isa type, "target features")` for AVX2, AVX-VNNI and AVX-512, so each
/// file gets modules `avx2`, `avxvnni` and `avx512` with the same functions.
macro_rules! stamp_isas {
    ($entries:ident) => {
        $entries!(avx2, $crate::kernels::x86::Avx2, "avx2,fma,f16c");
        $entries!(
            avxvnni,
            $crate::kernels::x86::AvxVnni,
            "avx2,fma,f16c,avxvnni"
        );
        $entries!(
            avx512,
            $crate::kernels::x86::Avx512,
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
        );
    };
}
pub(crate) use stamp_isas;

/// `Σ_k dot4(u[k], s[k])` per i32 lane (`dot4`: the lane's 4 byte products), from zero.
///
/// AVX2 sums all the `maddubs` products in i16 before one `madd`: the caller guarantees that
/// the `2N` products of each i16 lane sum below 2^15 in magnitude. With VNNI, two chains of
/// `vpdpbusd` (even and odd `k`) halve the latency.
#[inline(always)]
pub unsafe fn dots<P: Isa, const N: usize>(u: [__m256i; N], s: [__m256i; N]) -> __m256i {
    if P::VNNI {
        // Plain counted loops over constant indices: fully unrolled, every value in a register.
        let zero = _mm256_setzero_si256();
        let (mut even, mut odd) = (zero, zero);
        for k in 0..N / 2 {
            even = P::dpbusd(even, u[2 * k], s[2 * k]);
            odd = P::dpbusd(odd, u[2 * k + 1], s[2 * k + 1]);
        }
        if N % 2 == 1 {
            even = P::dpbusd(even, u[N - 1], s[N - 1]);
        }
        if N > 1 {
            _mm256_add_epi32(even, odd)
        } else {
            even
        }
    } else {
        _mm256_madd_epi16(sum_maddubs(u, s), _mm256_set1_epi16(1))
    }
}

/// `Σ_k dot4(u[k], s[k]) · scale` per i32 lane, where `scale` holds the lane's factor in both
/// of its i16 halves (so that AVX2 scales with the widening `madd`). Same saturation condition
/// as [`dots`]. VNNI takes it below 4 products (a `vpmulld` costs two instructions, more than it
/// saves on 1 or 2 `maddubs`).
#[inline(always)]
pub unsafe fn dots_scaled<P: Isa, const N: usize>(
    u: [__m256i; N],
    s: [__m256i; N],
    scale: __m256i,
) -> __m256i {
    if P::VNNI && N >= 4 {
        _mm256_mullo_epi32(dots::<P, N>(u, s), _mm256_srai_epi32::<16>(scale))
    } else {
        _mm256_madd_epi16(sum_maddubs(u, s), scale)
    }
}

/// `Σ_k maddubs(u[k], s[k])` in i16 lanes, summed as a balanced tree (spelled out for the
/// sizes the tiles use, so that every product stays in a register).
#[inline(always)]
unsafe fn sum_maddubs<const N: usize>(u: [__m256i; N], s: [__m256i; N]) -> __m256i {
    let p = |k: usize| _mm256_maddubs_epi16(u[k], s[k]);
    let add = |a, b| _mm256_add_epi16(a, b);
    match N {
        1 => p(0),
        2 => add(p(0), p(1)),
        4 => add(add(p(0), p(1)), add(p(2), p(3))),
        8 => add(
            add(add(p(0), p(1)), add(p(2), p(3))),
            add(add(p(4), p(5)), add(p(6), p(7))),
        ),
        _ => (1..N).fold(p(0), |acc, k| add(acc, p(k))),
    }
}

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

/// Hints the cache lines of bytes `at..at + len` from `p` into L2 (`prefetcht1`); nothing when
/// `p` is null. Attention passes the next page's rows here as it reads the same rows of this
/// page. Into L2 rather than L1: a decode at depth streams its KV pages mostly on these hints (a
/// page of one head is short, and the hardware prefetchers alone fall behind even when a head's
/// pages are consecutive; see `models::attention`), and on a Xeon (model 167)
/// SmolLM2's decode at depth 4,096 ran 0.3–6% faster (median 3% over 9 alternating pairs) and
/// Gemma 3's −1.4–4% (median 2% over 6) with `t1` than with `t0`; tg128 unchanged. Hinting
/// every second or fourth line into L2, leaving the rest to the hardware, was 7–20% slower.
/// On an AMD EPYC Zen 4 (family 25, model 17) `t1` was the best level too: over 3 alternating
/// rounds of tg64 @ d4096, `t0` ran SmolLM2 27–31% slower and Gemma 3 3–8% slower, `t2` within
/// 0–16% below `t1`.
///
/// # Safety
/// None beyond the caller's: a prefetch reads nothing architecturally, whatever the address.
#[inline(always)]
pub unsafe fn prefetch_rows(p: *const u8, at: usize, len: usize) {
    if p.is_null() {
        return;
    }
    prefetch_lines::<_MM_HINT_T1>(p as usize + at, len)
}

/// Hints the cache line holding byte `at` of `p` (null: none) as [`prefetch_rows`] does: the
/// score kernels' one line a step (a key page's lines are whole: the pages are 64-byte
/// aligned), without the loop over lines that left each step of SmolLM2's score kernel with
/// two more branches and a reloaded pointer.
///
/// # Safety
/// None beyond the caller's: a prefetch reads nothing architecturally, whatever the address.
#[inline(always)]
pub unsafe fn prefetch_line(p: *const u8, at: usize) {
    if !p.is_null() {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(at) as *const i8);
    }
}

/// Hints of a page spread evenly over the steps of a kernel's loop: `steps` calls of
/// [`SpreadHints::at`] hint the `len` bytes at `p` (as [`prefetch_rows`] does) a part each, in
/// order, so the lines stream in at the pace of the arithmetic instead of in one burst that
/// fills the core's miss buffers and stalls it.
#[derive(Clone, Copy)]
pub struct SpreadHints {
    p: *const u8,
    len: usize,
    /// Bytes hinted per step: whole lines.
    per: usize,
}

impl SpreadHints {
    /// `len` bytes at `p` (null: no hints) over `steps` steps.
    #[inline(always)]
    pub fn new(p: *const u8, len: usize, steps: usize) -> Self {
        let per = len.div_ceil(steps.max(1)).next_multiple_of(64);
        Self { p, len, per }
    }

    /// The hints of step `k` (none past the last step).
    ///
    /// # Safety
    /// None beyond the caller's: a prefetch reads nothing architecturally, whatever the address.
    #[inline(always)]
    pub unsafe fn at(&self, k: usize) {
        let at = k * self.per;
        if at < self.len {
            prefetch_rows(self.p, at, self.per.min(self.len - at));
        }
    }
}

/// Hints the cache lines of the `len` bytes from address `start` with `HINT`.
#[inline(always)]
unsafe fn prefetch_lines<const HINT: i32>(start: usize, len: usize) {
    let mut line = start & !63;
    while line < start + len {
        _mm_prefetch::<HINT>(line as *const i8);
        line += 64;
    }
}

/// How far ahead of the current weight byte the weight kernels prefetch. On a Xeon (model
/// 167) SmolLM2's decode ran 6% faster and Gemma 3's 16% faster at 8 KiB than at 1 KiB
/// (medians over alternating runs; 6–16 KiB all alike): the hardware prefetchers alone keep
/// too few lines in flight to fill the bus, and a step's two groups (the AVX-512 pair tiles)
/// are two streams. 8 KiB is a sixth of a 48 KiB L1 (a quarter of Zen 3's 32 KiB). On an AMD
/// EPYC Zen 4 2, 4, 8 and 16 KiB were all alike (tg64 of both models, 3 alternating rounds).
pub const PREFETCH_BYTES: usize = 8192;

/// Hints the cache line `PREFETCH_BYTES` after `p` into L1 (no fault if out of bounds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES) as *const i8);
}

/// Hints into L1 every cache line of the `len` bytes that start `PREFETCH_BYTES` after `p`:
/// for a loop whose step reads `len` bytes at `p`. One hint per step leaves most lines to the
/// hardware prefetcher when a step reads more than a line (an interleaved Q4_1 block of 8 rows
/// is 160 bytes); hinting them all made SmolLM2's decode 5–19% faster. Into L1: into L2
/// (`t1`, as attention hints its pages) Gemma 3's tg128 ran 4% faster but SmolLM2's 1–4% slower.
/// The 256-bit tiles hint only where [`super::weight_prefetch`] says so (not on Zen 4).
///
/// # Safety
/// None beyond the caller's: a prefetch reads nothing architecturally, whatever the address.
#[inline(always)]
pub unsafe fn prefetch_ahead(p: *const u8, len: usize) {
    prefetch_lines::<_MM_HINT_T0>(p as usize + PREFETCH_BYTES, len)
}

/// Where the AVX-512 pair tiles hint ahead. A pair tile reads groups `g` and `g + 1` side by
/// side and the next call takes `g + 2` and `g + 3`, so each of its two streams skips every
/// other group: straight ahead of group `g` lies group `g + 1`, which the other stream is
/// reading already. This follows one stream `PREFETCH_BYTES` ahead through its own groups.
#[derive(Clone, Copy)]
pub struct PairAhead {
    /// Bytes per group.
    group: usize,
    /// Offset of the hinted byte within its group.
    into: usize,
    /// Offset of that group from the current one: `2 · group` per group skipped ahead.
    skip: usize,
}

impl PairAhead {
    /// At the start of a pair of groups of `group` bytes each.
    #[inline(always)]
    pub fn new(group: usize) -> Self {
        let ahead = PREFETCH_BYTES / group.max(1);
        Self {
            group,
            into: PREFETCH_BYTES - ahead * group,
            skip: 2 * ahead * group,
        }
    }

    /// Hints the `len` bytes `at` bytes past the current step, `PREFETCH_BYTES` ahead in the
    /// stream of the group that starts at `base`.
    ///
    /// # Safety
    /// None beyond the caller's: a prefetch reads nothing architecturally, whatever the address.
    #[inline(always)]
    pub unsafe fn hint(&self, base: *const u8, at: usize, len: usize) {
        prefetch_lines::<_MM_HINT_T0>(base as usize + self.offset() + at, len)
    }

    /// The offset from the current group's start that [`Self::hint`] hints at `at = 0`.
    #[inline(always)]
    fn offset(&self) -> usize {
        self.skip + self.into
    }

    /// Moves on by one step of `n` bytes (at most a group).
    #[inline(always)]
    pub fn step(&mut self, n: usize) {
        self.into += n;
        if self.into >= self.group {
            self.into -= self.group;
            self.skip += 2 * self.group;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PairAhead, PREFETCH_BYTES};

    /// The hint goes to the byte `PREFETCH_BYTES` further along the stream of groups `g`,
    /// `g + 2`, `g + 4`, … (each `group` bytes, with the other stream's between them).
    #[test]
    fn pair_ahead_follows_one_stream() {
        // Groups smaller than, about as large as, and larger than the distance; steps of an
        // interleaved Q4_1 block, a Q8_0 block, a Q6_K and a Q4_K block of 8 rows. Three
        // groups' worth of steps, so the hint crosses into further groups of its stream.
        for (group, step) in [(2880, 160), (5440, 272), (13440, 1680), (9216, 1152)] {
            let mut ahead = PairAhead::new(group);
            for k in 0..3 * group / step {
                let x = k * step + PREFETCH_BYTES;
                assert_eq!(ahead.offset(), 2 * group * (x / group) + x % group);
                ahead.step(step);
            }
        }
    }
}
