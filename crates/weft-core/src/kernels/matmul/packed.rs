//! The matmul driver's path for interleaved matrices (rows packed by groups of 8, see
//! [`crate::kernels::interleaved`]): the activations quantized for the weight type, then each
//! chunk of row groups · blocks of tokens through the group (or, on AVX-512, pair) tiles, the
//! results written to one output or, for stacked projections, to several ([`Outs`]).

use crate::gguf::GgmlType;
use crate::threadpool::ThreadPool;

use super::super::interleaved::{self, GROUP_ROWS};
use super::super::quantize::{ActFormat, Q8KRow};
#[cfg(target_arch = "x86_64")]
use super::super::{interleaved_avx2, interleaved_avx512};
use super::super::{one_token_pairs, Matrix, SimdLevel};
use super::{split, token_block, MatmulScratch, OutPtr, MAX_SPLITS, TILE_TOKENS};

/// The outputs of an interleaved matmul: part `i` is `(pointer, first row, rows)`, a row-major
/// `n_tokens × rows` block that receives rows `first..first + rows` of the matrix.
#[derive(Clone, Copy)]
pub(super) struct Outs {
    pub(super) parts: [(OutPtr, usize, usize); MAX_SPLITS],
    pub(super) n: usize,
}

impl Outs {
    /// The single output `y` of a matrix with `rows` rows.
    pub(super) fn one(y: &mut [f32], rows: usize) -> Outs {
        let mut parts = [(OutPtr(std::ptr::null_mut()), 0, 0); MAX_SPLITS];
        parts[0] = (OutPtr(y.as_mut_ptr()), 0, rows);
        Outs { parts, n: 1 }
    }

    /// Writes the 8 values of rows `r..r + 8` (one group, never across two parts) for token
    /// `t`.
    ///
    /// # Safety
    /// `t < n_tokens`, `r + 8 ≤` the matrix's rows, and no other thread writes these rows.
    #[inline]
    unsafe fn write8(&self, t: usize, r: usize, v: &[f32; GROUP_ROWS]) {
        let mut i = 0;
        while i + 1 < self.n && r >= self.parts[i + 1].1 {
            i += 1;
        }
        let (out, first, rows) = self.parts[i];
        out.write8(t * rows + r - first, v)
    }
}

/// One group of 8 interleaved rows (its bytes) · the tokens `t0..t0 + out.len()`, into
/// `out[i][r]`.
type GroupFn<'a> = dyn Fn(&[u8], usize, &mut [[f32; GROUP_ROWS]]) + Sync + 'a;

/// Two neighbouring groups (their bytes) · the tokens `t0..t0 + out.len()`, into `out[i][r]`
/// (rows of the first group, then of the second).
type PairFn<'a> = dyn Fn(&[u8], &[u8], usize, &mut [[f32; 2 * GROUP_ROWS]]) + Sync + 'a;

/// [`super::matmul_with`] for an interleaved matrix: the activations quantized for its type (with the
/// block sums the Q4_0 / Q5_0 kernels need), then [`run_interleaved`] with its group kernel.
pub(super) fn matmul_interleaved(
    level: SimdLevel,
    pool: &ThreadPool,
    w: &Matrix,
    x: &[f32],
    n_tokens: usize,
    y: &Outs,
    scratch: &mut MatmulScratch,
) {
    let (acts, sums) = (&mut scratch.acts, &mut scratch.sums);
    let dtype = w.dtype;
    if matches!(dtype, GgmlType::Q4_K | GgmlType::Q6_K) {
        acts.quantize(Some(pool), ActFormat::Q8K, x, n_tokens, w.cols);
        let acts = &*acts;
        let k6 = dtype == GgmlType::Q6_K;
        type KTile = unsafe fn(&[u8], &Q8KRow, &mut [[f32; GROUP_ROWS]]);
        #[cfg(target_arch = "x86_64")]
        let simd: Option<KTile> = {
            use interleaved_avx2::{avx2, avx512, avxvnni};
            match (level, k6) {
                (SimdLevel::Avx512, false) => Some(avx512::tile_k4),
                (SimdLevel::Avx512, true) => Some(avx512::tile_k6),
                (SimdLevel::AvxVnni, false) => Some(avxvnni::tile_k4),
                (SimdLevel::AvxVnni, true) => Some(avxvnni::tile_k6),
                (SimdLevel::Avx2, false) => Some(avx2::tile_k4),
                (SimdLevel::Avx2, true) => Some(avx2::tile_k6),
                (SimdLevel::Scalar, _) => None,
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let simd: Option<KTile> = None;
        let kernel = |wg: &[u8], t0: usize, out: &mut [[f32; 8]]| {
            let ys = acts.q8_k_rows(t0, out.len());
            if let Some(tile) = simd {
                // SAFETY: `matmul_with` checked that the CPU runs `level`.
                return unsafe { tile(wg, &ys, out) };
            }
            if k6 {
                interleaved::tile_k6(wg, &ys, out)
            } else {
                interleaved::tile_k4(wg, &ys, out)
            }
        };
        #[cfg(target_arch = "x86_64")]
        if level == SimdLevel::Avx512 {
            let pair = |wa: &[u8], wb: &[u8], t0: usize, out: &mut [[f32; 2 * GROUP_ROWS]]| {
                let ys = acts.q8_k_rows(t0, out.len());
                // SAFETY: `matmul_with` checked that the CPU runs `level`.
                unsafe { interleaved_avx512::tile_k_pair(k6, wa, wb, &ys, out) }
            };
            run_interleaved(pool, w, n_tokens, y, &kernel, Some(&pair));
            return;
        }
        run_interleaved(pool, w, n_tokens, y, &kernel, None);
        return;
    }
    // Q4_1 / Q5_1 take Q8_1 activations (with `s_y`); Q4_0 / Q5_0 take Q8_0 and block sums.
    let min = interleaved::Legacy::of(dtype).is_some_and(|k| k.min);
    let nb = w.cols / 32;
    sums.clear();
    if min {
        acts.quantize(Some(pool), ActFormat::Q8_1, x, n_tokens, w.cols);
    } else {
        acts.quantize(Some(pool), ActFormat::Q8_0, x, n_tokens, w.cols);
        let offset = interleaved::offset(dtype);
        interleaved::block_sums(offset, acts.q8_0_rows(0, n_tokens).qs, sums);
    }
    let (acts, sums) = (&*acts, &*sums);
    // The x86 tiles of the set: Q8_0's, and the other 32-element types'.
    type Tile = unsafe fn(GgmlType, &[u8], &interleaved::LegacyActs, &mut [[f32; GROUP_ROWS]]);
    type TileQ8 = unsafe fn(&[u8], &interleaved::LegacyActs, &mut [[f32; GROUP_ROWS]]);
    let q8 = dtype == GgmlType::Q8_0;
    #[cfg(target_arch = "x86_64")]
    let simd: Option<(Tile, TileQ8)> = {
        use interleaved_avx2::{avx2, avx512, avxvnni};
        match level {
            SimdLevel::Avx512 => Some((avx512::tile, avx512::tile_q8_0)),
            SimdLevel::AvxVnni => Some((avxvnni::tile, avxvnni::tile_q8_0)),
            SimdLevel::Avx2 => Some((avx2::tile, avx2::tile_q8_0)),
            SimdLevel::Scalar => None,
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let simd: Option<(Tile, TileQ8)> = None;
    // The activations of tokens `t0..t0 + n` as the tiles take them.
    let legacy_acts = |t0: usize, n: usize| {
        if min {
            let y = acts.q8_1_rows(t0, n);
            interleaved::LegacyActs {
                qs: y.qs,
                d: y.ds.as_flattened(),
                sums: &[],
            }
        } else {
            let y = acts.q8_0_rows(t0, n);
            interleaved::LegacyActs {
                qs: y.qs,
                d: y.d,
                sums: &sums[t0 * nb..(t0 + n) * nb],
            }
        }
    };
    let kernel = |wg: &[u8], t0: usize, out: &mut [[f32; 8]]| {
        let ys = legacy_acts(t0, out.len());
        if let Some((tile, tile_q8)) = simd {
            // SAFETY: `matmul_with` checked that the CPU runs `level`.
            return unsafe {
                if q8 {
                    tile_q8(wg, &ys, out)
                } else {
                    tile(dtype, wg, &ys, out)
                }
            };
        }
        if q8 {
            interleaved::tile_q8_0(wg, ys.qs, ys.d, out)
        } else {
            interleaved::tile(dtype, wg, &ys, out)
        }
    };
    // AVX-512: two groups per call on 512-bit registers (the same bits as two calls).
    #[cfg(target_arch = "x86_64")]
    if level == SimdLevel::Avx512 {
        let pair = |wa: &[u8], wb: &[u8], t0: usize, out: &mut [[f32; 2 * GROUP_ROWS]]| {
            let ys = legacy_acts(t0, out.len());
            // SAFETY: `matmul_with` checked that the CPU runs `level`.
            unsafe {
                if q8 {
                    interleaved_avx512::tile_q8_0_pair(wa, wb, &ys, out)
                } else {
                    interleaved_avx512::tile_pair(dtype, wa, wb, &ys, out)
                }
            }
        };
        run_interleaved(pool, w, n_tokens, y, &kernel, Some(&pair));
        return;
    }
    run_interleaved(pool, w, n_tokens, y, &kernel, None);
}

/// [`super::run`] for an interleaved matrix: chunks of 8-row groups, each group · up to 4 tokens per
/// kernel call, in the same loop order (token blocks in L2, a group's weights in L1). With a
/// `pair` kernel, two neighbouring groups of a chunk share each call (for one token only where
/// [`one_token_pairs`] says so).
fn run_interleaved(
    pool: &ThreadPool,
    w: &Matrix,
    n_tokens: usize,
    out: &Outs,
    kernel: &GroupFn,
    pair: Option<&PairFn>,
) {
    let n_groups = w.rows / GROUP_ROWS;
    let group_bytes = interleaved::group_bytes(w.dtype, w.cols);
    let token_block = token_block(w.cols);
    let pair = pair.filter(|_| n_tokens > 1 || one_token_pairs());
    let granule = if pair.is_some() { 2 } else { 1 };
    split(pool, w, n_tokens, n_groups, granule, &|g0, g1| {
        for tb0 in (0..n_tokens).step_by(token_block) {
            let tb1 = (tb0 + token_block).min(n_tokens);
            let mut g = g0;
            while g < g1 {
                let wg = &w.data[g * group_bytes..][..group_bytes];
                if let Some(pair) = pair.filter(|_| g + 1 < g1) {
                    let wg2 = &w.data[(g + 1) * group_bytes..][..group_bytes];
                    for t0 in (tb0..tb1).step_by(TILE_TOKENS) {
                        let nt = TILE_TOKENS.min(tb1 - t0);
                        let mut tile = [[0f32; 2 * GROUP_ROWS]; TILE_TOKENS];
                        pair(wg, wg2, t0, &mut tile[..nt]);
                        for (i, vals) in tile[..nt].iter().enumerate() {
                            let (halves, _) = vals.as_chunks::<GROUP_ROWS>();
                            // SAFETY: t0 + i < n_tokens and (g + 1) · 8 + 8 ≤ rows; groups
                            // g, g + 1 belong to this chunk.
                            unsafe {
                                out.write8(t0 + i, g * GROUP_ROWS, &halves[0]);
                                out.write8(t0 + i, (g + 1) * GROUP_ROWS, &halves[1]);
                            }
                        }
                    }
                    g += 2;
                    continue;
                }
                for t0 in (tb0..tb1).step_by(TILE_TOKENS) {
                    let nt = TILE_TOKENS.min(tb1 - t0);
                    let mut tile = [[0f32; GROUP_ROWS]; TILE_TOKENS];
                    kernel(wg, t0, &mut tile[..nt]);
                    for (i, vals) in tile[..nt].iter().enumerate() {
                        // SAFETY: t0 + i < n_tokens and g · 8 + 8 ≤ rows; group g belongs to
                        // this thread's chunk.
                        unsafe { out.write8(t0 + i, g * GROUP_ROWS, vals) };
                    }
                }
                g += 1;
            }
        }
    });
}
