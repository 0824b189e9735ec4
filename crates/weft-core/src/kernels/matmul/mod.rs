//! The matmul driver: quantize the activations once, then split the output rows over the
//! pool's threads and run the GEMV or GEMM-tile kernel of the weight type on each.
//!
//! Loop order for several tokens, per chunk of rows a thread takes:
//! `for block of tokens (activations fit in L2) { for group of rows (weights fit in L1) {
//! for 4 tokens { for row in group { tile } } } }`, so each weight row comes from memory once
//! per chunk and from L1 for every further 4 tokens, the 4 activation rows of a tile stay in
//! L1 across the group, and the token block stays in L2 across the chunk.

use crate::gguf::GgmlType;
use crate::threadpool::ThreadPool;

use super::interleaved::GROUP_ROWS;
use super::quantize::{ActFormat, Q8Batch};
use super::{kquants, legacy, Layout, Matrix, SimdLevel};
#[cfg(target_arch = "x86_64")]
use super::{kquants_avx2, legacy_avx2};

mod packed;
use packed::{matmul_interleaved, Outs};

/// The `(dot, dots)` pair of one kernel: for an x86 `$level`, the twins from `$simd_mod`'s
/// module for that set (its AVX2 one where the file has no other), else the scalar references
/// from `$scalar_mod`.
macro_rules! pick {
    ($level:expr; $scalar_mod:ident, $simd_mod:ident; $dot:ident, $dots:ident) => {{
        #[cfg(target_arch = "x86_64")]
        let pair: (DotFn<_>, DotsFn<_>) = match $level {
            SimdLevel::Avx512 => ($simd_mod::avx512::$dot, $simd_mod::avx512::$dots),
            SimdLevel::AvxVnni => ($simd_mod::avxvnni::$dot, $simd_mod::avxvnni::$dots),
            SimdLevel::Avx2 => ($simd_mod::avx2::$dot, $simd_mod::avx2::$dots),
            SimdLevel::Scalar => ($scalar_mod::$dot, $scalar_mod::$dots),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let pair: (DotFn<_>, DotsFn<_>) = {
            let _ = $level;
            ($scalar_mod::$dot, $scalar_mod::$dots)
        };
        pair
    }};
}

/// As [`pick!`] for a file with AVX2 kernels only, which every x86 set runs.
macro_rules! pick_avx2 {
    ($level:expr; $scalar_mod:ident, $simd_mod:ident; $dot:ident, $dots:ident) => {{
        #[cfg(target_arch = "x86_64")]
        let pair: (DotFn<_>, DotsFn<_>) = if $level.has_avx2() {
            ($simd_mod::$dot, $simd_mod::$dots)
        } else {
            ($scalar_mod::$dot, $scalar_mod::$dots)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let pair: (DotFn<_>, DotsFn<_>) = {
            let _ = $level;
            ($scalar_mod::$dot, $scalar_mod::$dots)
        };
        pair
    }};
}

/// Activation rows per GEMM tile: each weight block is unpacked once for this many tokens.
pub const TILE_TOKENS: usize = 4;

/// Weight bytes per row group: the rows a tile loop revisits for every 4 tokens stay in L1.
const GROUP_BYTES: usize = 16 * 1024;

/// Activation bytes per token block (see `run`): well inside a 512 KB L2.
const TOKEN_BLOCK_BYTES: usize = 128 * 1024;

/// Row chunks per thread: enough for a slowed-down thread to hand work to the others, and
/// for the threads to finish together. A claim is cheap (see [`ThreadPool::run_chunks`]):
/// 16 decoded SmolLM2 3–5% faster than 8 (32: no faster). Products of several tokens (a
/// prefill, a batched decode) keep 16; one-token products take [`DECODE_CHUNKS_PER_THREAD`].
const CHUNKS_PER_THREAD: usize = 16;

/// Row chunks per thread of a one-token product (a decode step's matmuls). Fewer claims, and
/// fewer of the steals at a run's end that move each thread's share line to the other core
/// and back: where the two threads sit on different core complexes (a cache line's round
/// trip ~370 ns instead of ~50, see `bandwidth::core_round_trip`), 4 chunks a thread decoded
/// SmolLM2 2.6% faster than 16 (tg1024, the two alternated in blocks of 16 steps within a
/// run, 6 runs in each order: +0.1–1.6% with 4 first, +3.6–5.3% with 16 first — the first
/// setting's blocks take every step that faults in a new KV page, hence both orders). A first
/// measurement, in 2-step slices (the same bias, in one order only), gave 1–5% at depth
/// 4,096 (SmolLM2), a median +1.8% for Gemma 3 at depth and 1.3–4.4% for its tg; with the
/// threads on one complex 4 and 16 were alike and 2 was 0.4–4.5% slower; beside a busy-loop
/// process no slower. On a 2-vCPU AMD EPYC Zen 5.
const DECODE_CHUNKS_PER_THREAD: usize = 4;

/// Most weight bytes in one chunk: a large matrix (an LM head of 30–180 MB) is cut finer than
/// [`CHUNKS_PER_THREAD`] would, so the threads finish within a fraction of a small chunk of
/// each other rather than half of a megabyte-sized one.
const MAX_CHUNK_BYTES: usize = 256 * 1024;

/// Below this many multiply-adds a matmul runs on the calling thread alone.
const SERIAL_WORK: usize = 32 * 1024;

/// Reusable buffers for quantized activations; grows as needed, never shrinks.
///
/// One scratch per concurrent caller of [`matmul`]; reusing it across calls means steady-state
/// calls allocate nothing.
#[derive(Default)]
pub struct MatmulScratch {
    acts: Q8Batch,
    /// Per token and block, `offset · Σ q` of the activations (interleaved weights only).
    sums: Vec<i32>,
}

impl std::fmt::Debug for MatmulScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MatmulScratch")
    }
}

/// One weight row · one activation row. `unsafe` because the x86 kernels need the CPU
/// features that [`matmul_with`] checked before picking them.
type DotFn<R> = unsafe fn(&[u8], &R) -> f32;
/// One weight row · 1 to 4 activation rows (same safety condition as [`DotFn`]).
type DotsFn<R> = unsafe fn(&[u8], &[R], &mut [f32]);

/// `y[t * w.rows + r] = Σ_c W[r][c] · x[t * w.cols + c]` for `t < n_tokens`, `r < w.rows`.
///
/// `x` is row-major `n_tokens × cols` (`f32`), `y` row-major `n_tokens × rows`. The
/// activations are quantized once per call as ggml does for the weight type (Q8_0 for Q4_0,
/// Q5_0 and Q8_0; Q8_1 for Q4_1 and Q5_1; Q8_K for Q4_K, Q5_K and Q6_K; F32, F16 and BF16
/// weights use the `f32` activations), then the output rows are split over the pool's threads.
///
/// Determinism: `y[t][r]` is a function of weight row `r` and activation row `t` alone, bit for
/// bit: it does not depend on `n_tokens`, on `t`'s place in the batch or on the number of
/// threads (each activation row is quantized on its own, and the single-token kernel and the
/// tile kernels perform the same floating-point operations for every token). Different kernel
/// sets ([`super::simd_level`]) may give different bits.
///
/// # Panics
/// If `x.len() != n_tokens * w.cols` or `y.len() != n_tokens * w.rows`.
pub fn matmul(
    pool: &ThreadPool,
    w: &Matrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    matmul_with(super::simd_level(), pool, w, x, n_tokens, y, scratch)
}

/// Most outputs [`matmul_split`] writes to.
pub const MAX_SPLITS: usize = 4;

/// [`matmul`] of a matrix whose rows are several projections stacked (fused QKV, gate-up):
/// the first `ys[0].len() / n_tokens` rows go to `ys[0]` (row-major `n_tokens × rows_0`), the
/// next to `ys[1]`, and so on, written there directly by the kernels. The bits are those of
/// [`matmul`] on each block of rows.
///
/// # Panics
/// If `x.len() != n_tokens * w.cols`, if the outputs' rows do not add up to `w.rows`, or if
/// there are several outputs (at most [`MAX_SPLITS`]) and `w` is not interleaved or a block's
/// rows are not a multiple of 8.
pub fn matmul_split(
    pool: &ThreadPool,
    w: &Matrix,
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    let level = super::simd_level();
    if let [y] = ys {
        return matmul_with(level, pool, w, x, n_tokens, y, scratch);
    }
    assert_eq!(x.len(), n_tokens * w.cols, "x must be n_tokens × cols");
    assert!(level.available());
    assert!(
        w.layout == Layout::Interleaved8 && ys.len() <= MAX_SPLITS,
        "matmul_split: several outputs need an interleaved matrix, at most {MAX_SPLITS}"
    );
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    let mut outs = Outs {
        parts: [(OutPtr(std::ptr::null_mut()), 0, 0); MAX_SPLITS],
        n: ys.len(),
    };
    let mut first = 0;
    for (part, y) in outs.parts.iter_mut().zip(ys.iter_mut()) {
        let rows = y.len() / n_tokens;
        assert!(
            y.len() == n_tokens * rows && rows.is_multiple_of(GROUP_ROWS),
            "matmul_split: each output must be n_tokens × (a multiple of 8) rows"
        );
        *part = (OutPtr(y.as_mut_ptr()), first, rows);
        first += rows;
    }
    assert_eq!(
        first, w.rows,
        "matmul_split: the outputs' rows must add up to the matrix's"
    );
    matmul_interleaved(level, pool, w, x, n_tokens, &outs, scratch);
}

/// [`matmul`] with the kernel set `level` (the tests compare every set the CPU has in one
/// process).
///
/// # Panics
/// As [`matmul`]; also if the CPU cannot run `level` ([`SimdLevel::available`]).
pub(crate) fn matmul_with(
    level: SimdLevel,
    pool: &ThreadPool,
    w: &Matrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(x.len(), n_tokens * w.cols, "x must be n_tokens × cols");
    assert_eq!(y.len(), n_tokens * w.rows, "y must be n_tokens × rows");
    // The x86 kernels are sound to call only when the CPU has the features: checked here,
    // once, for the function pointers `run` calls.
    assert!(
        level.available(),
        "{} kernels requested on a CPU without them",
        level.name()
    );
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    use GgmlType::*;
    let acts = &mut scratch.acts;
    if w.layout == Layout::Interleaved8 {
        let outs = Outs::one(y, w.rows);
        matmul_interleaved(level, pool, w, x, n_tokens, &outs, scratch);
        return;
    }
    match w.dtype {
        Q4_0 | Q5_0 | Q8_0 => {
            acts.quantize(Some(pool), ActFormat::Q8_0, x, n_tokens, w.cols);
            let (dot, dots) = match w.dtype {
                Q4_0 => pick!(level; legacy, legacy_avx2; vec_dot_q4_0_q8_0, vec_dots_q4_0_q8_0),
                Q5_0 => pick!(level; legacy, legacy_avx2; vec_dot_q5_0_q8_0, vec_dots_q5_0_q8_0),
                _ => pick!(level; legacy, legacy_avx2; vec_dot_q8_0_q8_0, vec_dots_q8_0_q8_0),
            };
            let acts = &*acts;
            run(pool, w, n_tokens, y, &|t| acts.q8_0(t), dot, dots);
        }
        Q4_1 | Q5_1 => {
            acts.quantize(Some(pool), ActFormat::Q8_1, x, n_tokens, w.cols);
            let (dot, dots) = match w.dtype {
                Q4_1 => pick!(level; legacy, legacy_avx2; vec_dot_q4_1_q8_1, vec_dots_q4_1_q8_1),
                _ => pick!(level; legacy, legacy_avx2; vec_dot_q5_1_q8_1, vec_dots_q5_1_q8_1),
            };
            let acts = &*acts;
            run(pool, w, n_tokens, y, &|t| acts.q8_1(t), dot, dots);
        }
        Q4_K | Q5_K | Q6_K => {
            acts.quantize(Some(pool), ActFormat::Q8K, x, n_tokens, w.cols);
            let (dot, dots) = match w.dtype {
                Q4_K => {
                    pick_avx2!(level; kquants, kquants_avx2; vec_dot_q4_k_q8_k, vec_dots_q4_k_q8_k)
                }
                Q5_K => {
                    pick_avx2!(level; kquants, kquants_avx2; vec_dot_q5_k_q8_k, vec_dots_q5_k_q8_k)
                }
                _ => {
                    pick_avx2!(level; kquants, kquants_avx2; vec_dot_q6_k_q8_k, vec_dots_q6_k_q8_k)
                }
            };
            let acts = &*acts;
            run(pool, w, n_tokens, y, &|t| acts.q8_k(t), dot, dots);
        }
        F32 | F16 | BF16 => {
            let (dot, dots): (DotFn<&[f32]>, DotsFn<&[f32]>) = match w.dtype {
                F32 => pick_avx2!(level; float_rows, float_rows_avx2; dot_f32, dots_f32),
                F16 => pick_avx2!(level; float_rows, float_rows_avx2; dot_f16, dots_f16),
                // BF16 has no AVX2 kernel (no model we run stores matmul weights in it).
                _ => (float_rows::dot_bf16, float_rows::dots_bf16),
            };
            let c = w.cols;
            run(pool, w, n_tokens, y, &|t| &x[t * c..(t + 1) * c], dot, dots);
        }
        // `Matrix::new` admits only the types above.
        other => unreachable!("matmul on unsupported type {other}"),
    }
}

/// The output pointer shared by the threads of one matmul.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: the pointer is only written through `OutPtr::write` / `write8`, at indices of the
// rows that `split` hands to exactly one thread each.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes `v` at index `i`.
    ///
    /// # Safety
    /// `i` is in bounds of the output slice and no other thread accesses index `i`.
    #[inline]
    unsafe fn write(self, i: usize, v: f32) {
        self.0.add(i).write(v)
    }

    /// Writes `v` at indices `i..i + 8`.
    ///
    /// # Safety
    /// As [`OutPtr::write`], for each of the 8 indices.
    #[inline]
    unsafe fn write8(self, i: usize, v: &[f32; 8]) {
        std::ptr::copy_nonoverlapping(v.as_ptr(), self.0.add(i), 8)
    }
}

/// Splits the rows of `w` into chunks shared out by [`split`] and computes them.
fn run<R: Copy + Sync>(
    pool: &ThreadPool,
    w: &Matrix,
    n_tokens: usize,
    y: &mut [f32],
    row: &(dyn Fn(usize) -> R + Sync),
    dot: DotFn<R>,
    dots: DotsFn<R>,
) {
    let rows = w.rows;
    // Rows per group: for a GEMV only the chunk granularity; for tiles, the rows whose
    // weights stay in L1 while every group of 4 tokens passes over them.
    let group = if n_tokens == 1 {
        16
    } else {
        (GROUP_BYTES / w.row_bytes()).clamp(4, 64)
    };
    let token_block = token_block(w.cols);
    let out = OutPtr(y.as_mut_ptr());
    // Chunks: a multiple of the row group.
    split(pool, w, n_tokens, rows, group, &|r0, r1| {
        if n_tokens == 1 {
            let y0 = row(0);
            for r in r0..r1 {
                // SAFETY: `dot` may be called (see `DotFn`); r < rows = y.len() for one token;
                // `split` hands rows r0..r1 to exactly one thread.
                unsafe { out.write(r, dot(w.row(r), &y0)) };
            }
            return;
        }
        for tb0 in (0..n_tokens).step_by(token_block) {
            let tb1 = (tb0 + token_block).min(n_tokens);
            for g0 in (r0..r1).step_by(group) {
                let g1 = (g0 + group).min(r1);
                for t0 in (tb0..tb1).step_by(TILE_TOKENS) {
                    let nt = TILE_TOKENS.min(tb1 - t0);
                    let ys: [R; TILE_TOKENS] = std::array::from_fn(|i| row(t0 + i.min(nt - 1)));
                    let mut tile = [0f32; TILE_TOKENS];
                    for r in g0..g1 {
                        // SAFETY: `dots` may be called (see `DotsFn`).
                        unsafe { dots(w.row(r), &ys[..nt], &mut tile[..nt]) };
                        for (i, &v) in tile[..nt].iter().enumerate() {
                            // SAFETY: (t0 + i) < n_tokens and r < rows, so the index is below
                            // y.len() = n_tokens · rows; row r belongs to this thread's chunk.
                            unsafe { out.write((t0 + i) * rows + r, v) };
                        }
                    }
                }
            }
        }
    });
}

/// Tokens per pass over a chunk: their quantized activations (about one byte per value) stay
/// in L2 while the chunk's rows stream past.
fn token_block(cols: usize) -> usize {
    (TOKEN_BLOCK_BYTES / cols)
        .max(1)
        .next_multiple_of(TILE_TOKENS)
}

/// Calls `work(u0, u1)` for chunks of `n_units` units (rows or row groups), a multiple of
/// `granule` units each and about [`CHUNKS_PER_THREAD`] per thread (for one token
/// [`DECODE_CHUNKS_PER_THREAD`]), on the pool's threads
/// (each walks a contiguous share and then helps with the others', see
/// [`ThreadPool::run_chunks`]) — or all on the caller when the matmul is small.
fn split(
    pool: &ThreadPool,
    w: &Matrix,
    n_tokens: usize,
    n_units: usize,
    granule: usize,
    work: &(dyn Fn(usize, usize) + Sync),
) {
    let serial = pool.n_threads() == 1 || w.rows * w.cols * n_tokens < SERIAL_WORK;
    let n_threads = if serial { 1 } else { pool.n_threads() };
    let per_thread = match n_tokens {
        1 => DECODE_CHUNKS_PER_THREAD,
        _ => CHUNKS_PER_THREAD,
    };
    let n_chunks = (n_threads * per_thread).max(w.data.len().div_ceil(MAX_CHUNK_BYTES));
    let chunk = n_units.div_ceil(n_chunks).div_ceil(granule).max(1) * granule;
    let n_chunks = n_units.div_ceil(chunk);
    let body = |c: usize| work(c * chunk, ((c + 1) * chunk).min(n_units));
    if serial {
        (0..n_chunks).for_each(body);
    } else {
        pool.run_chunks(n_chunks, &body);
    }
}

/// The float weight rows with the signatures of [`DotFn`] and [`DotsFn`] (the scalar
/// references).
mod float_rows {
    use super::super::float;

    pub fn dot_f32(x: &[u8], a: &&[f32]) -> f32 {
        float::vec_dot_f32_bytes(x, a)
    }

    pub fn dot_f16(x: &[u8], a: &&[f32]) -> f32 {
        float::vec_dot_f16_bytes(x, a)
    }

    pub fn dot_bf16(x: &[u8], a: &&[f32]) -> f32 {
        float::vec_dot_bf16_bytes(x, a)
    }

    pub fn dots_f32(x: &[u8], ys: &[&[f32]], out: &mut [f32]) {
        for (o, y) in out.iter_mut().zip(ys) {
            *o = float::vec_dot_f32_bytes(x, y);
        }
    }

    pub fn dots_f16(x: &[u8], ys: &[&[f32]], out: &mut [f32]) {
        for (o, y) in out.iter_mut().zip(ys) {
            *o = float::vec_dot_f16_bytes(x, y);
        }
    }

    pub fn dots_bf16(x: &[u8], ys: &[&[f32]], out: &mut [f32]) {
        for (o, y) in out.iter_mut().zip(ys) {
            *o = float::vec_dot_bf16_bytes(x, y);
        }
    }
}

/// The AVX2 float weight rows with the signatures of [`DotFn`] and [`DotsFn`].
///
/// # Safety (every function)
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
mod float_rows_avx2 {
    use super::super::float_avx2;

    pub unsafe fn dot_f32(x: &[u8], a: &&[f32]) -> f32 {
        float_avx2::vec_dot_f32_bytes(x, a)
    }

    pub unsafe fn dot_f16(x: &[u8], a: &&[f32]) -> f32 {
        float_avx2::vec_dot_f16_bytes(x, a)
    }

    pub unsafe fn dots_f32(x: &[u8], ys: &[&[f32]], out: &mut [f32]) {
        float_avx2::vec_dots_float_bytes::<false>(x, ys, out)
    }

    pub unsafe fn dots_f16(x: &[u8], ys: &[&[f32]], out: &mut [f32]) {
        float_avx2::vec_dots_float_bytes::<true>(x, ys, out)
    }
}

#[cfg(test)]
mod tests;
