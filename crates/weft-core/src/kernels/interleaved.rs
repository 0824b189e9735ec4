//! Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K and Q8_0 weights interleaved by groups of 8 rows: the
//! GEMM layout of prefill and batched decode.
//!
//! In the file's layout each row's blocks are contiguous, so a row · token product pays for its
//! own sign trick, int → float conversion, scaling and final horizontal sum, for every block.
//! Here the blocks of 8 consecutive rows at the same column are stored together, arranged so
//! that one 32-byte vector holds 4 consecutive quants of each of the 8 rows (one row per 32-bit
//! lane). Multiplied (`maddubs`) with 4 activation bytes broadcast to every lane it gives one
//! partial sum per row; 8 such products cover the block, and one conversion, scaling and FMA
//! then serve all 8 rows, whose outputs come out as one vector. Per row, token and block that
//! is about 4 vector instructions instead of 10 — the idea of ggml's repacked `q4_0_8x8` GEMM.
//! The weights are repacked once, when the model loads; the size does not change (Q4_K grows
//! by 32 bytes per 8 super-blocks, its scales stored unpacked).
//!
//! One interleaved block (8 rows × 32 columns, `8 × dtype.type_size()` bytes):
//! - `d`: 8 × f16, the rows' scales (16 bytes);
//! - `m` (Q4_1, Q5_1): 8 × f16, the rows' mins;
//! - `qh` (Q5_0, Q5_1: 32 bytes): byte `4r + k`, bit `j` is the 5th bit of element `4j + k` of
//!   row `r`;
//! - `qs` (4 × 32 bytes): in chunk `c`, byte `4r + k` holds element `4c + k` of row `r` in its
//!   low nibble and element `16 + 4c + k` in its high nibble.
//!
//! The k-quants (Q4_K, Q6_K) arrange each 32-column sub-block of their 256-column super-blocks
//! the same way, with their scales unpacked beside (`interleaved_k`); Q8_0 (a tied LM head,
//! whose rows are also looked up as embeddings) has its own arrangement (`interleaved_q8`).
//!
//! Quants stay unsigned, because `maddubs` wants an unsigned operand. For the symmetric types
//! (`x = d · (q − offset)`, offset 8 for Q4_0 and 16 for Q5_0) the integer dot product of a
//! block is `Σ q·y − offset · Σ y`, and `offset · Σ y` of every activation block is computed
//! once per matmul ([`block_sums`]); the offset types (`x = d · q + m`, Q8_1 activations) add
//! `m · s_y` instead, as ggml does. Per token and row, blocks accumulate `(p · d_x) · d_y` (and
//! then `m · s_y`) with one FMA each in block order, the same in the scalar references below
//! and in the AVX2 kernels, so the two agree bit for bit and a token's result never depends on
//! the tile it is computed in.

use crate::gguf::GgmlType;

use super::quantize::{QK8, QK_K};

use super::interleaved_k::{repack_k4, repack_k6};
pub use super::interleaved_k::{tile_k4, tile_k6, K4_GROUP_BYTES, K6_GROUP_BYTES};
use super::interleaved_q8::repack_q8_0;
pub use super::interleaved_q8::{tile_q8_0, Q8_BLOCK_BYTES};

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 8;

/// Whether weights of `dtype` can be interleaved.
pub fn supports(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_0) || Legacy::of(dtype).is_some()
}

/// Whether rows of interleaved weights of `dtype` can be looked up ([`super::dequantize_row`]):
/// Q8_0, the type of the tied embedding tables this layout is used for.
pub fn supports_lookup(dtype: GgmlType) -> bool {
    dtype == GgmlType::Q8_0
}

/// Bytes of one group of 8 interleaved rows of `cols` columns.
pub fn group_bytes(dtype: GgmlType, cols: usize) -> usize {
    match dtype {
        GgmlType::Q4_K => cols / QK_K * K4_GROUP_BYTES,
        GgmlType::Q6_K => cols / QK_K * K6_GROUP_BYTES,
        _ => cols / QK8 * GROUP_ROWS * dtype.type_size(),
    }
}

/// Value offset of the unsigned quants of a symmetric type (`x = d · (q − offset)`); 0 for the
/// offset types, whose min is added instead. For Q8_0, the offset the VNNI tiles give the
/// signed quants (`q + 128`).
pub fn offset(dtype: GgmlType) -> i32 {
    match dtype {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        _ => 0,
    }
}

/// The shape of a 32-element type: a 5th bit (`qh`) or not, a min (`m`) or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Legacy {
    pub high: bool,
    pub min: bool,
}

impl Legacy {
    /// Q4_0, Q4_1, Q5_0 or Q5_1.
    pub fn of(dtype: GgmlType) -> Option<Legacy> {
        let (high, min) = match dtype {
            GgmlType::Q4_0 => (false, false),
            GgmlType::Q4_1 => (false, true),
            GgmlType::Q5_0 => (true, false),
            GgmlType::Q5_1 => (true, true),
            _ => return None,
        };
        Some(Legacy { high, min })
    }

    /// Bytes of one interleaved block of 8 rows.
    pub fn bytes(self) -> usize {
        GROUP_ROWS * (2 + 2 * usize::from(self.min) + 4 * usize::from(self.high) + 16)
    }

    /// Floats per block in [`LegacyActs::d`]: 2 with `s_y` (offset types), else 1.
    pub fn d_stride(self) -> usize {
        1 + usize::from(self.min)
    }

    /// Byte offset of `qh` in an interleaved block: after the scales and mins.
    pub fn qh_at(self) -> usize {
        16 + 16 * usize::from(self.min)
    }

    /// Byte offset of `qs` in an interleaved block.
    pub fn qs_at(self) -> usize {
        self.qh_at() + 32 * usize::from(self.high)
    }
}

/// Repacks `rows × cols` weights of `dtype` from the file's row layout into groups of
/// [`GROUP_ROWS`] interleaved rows, [`group_bytes`] each: group `g`, block column `b` at
/// `g · group_bytes + b · (block bytes of 8 rows)`.
///
/// # Panics
/// If the type is not supported, `rows` is not a multiple of 8, `cols` of the block size, or
/// `data` is not `rows × cols` weights.
pub fn repack(dtype: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows / GROUP_ROWS * group_bytes(dtype, cols)];
    repack_into(dtype, data, rows, cols, &mut out);
    out
}

/// [`repack`] into `out`, which must be zeroed and `rows / 8 · group_bytes(dtype, cols)` long
/// (so a tensor can be repacked a slice of rows at a time into its parts of one buffer).
///
/// # Panics
/// As [`repack`], and if `out` has another length.
pub fn repack_into(dtype: GgmlType, data: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    assert!(supports(dtype), "{dtype} cannot be interleaved");
    assert!(rows.is_multiple_of(GROUP_ROWS) && cols.is_multiple_of(dtype.block_size()));
    assert_eq!(
        out.len(),
        rows / GROUP_ROWS * group_bytes(dtype, cols),
        "the output does not fit rows × cols interleaved weights"
    );
    match dtype {
        GgmlType::Q4_K => return repack_k4(data, rows, cols, out),
        GgmlType::Q6_K => return repack_k6(data, rows, cols, out),
        GgmlType::Q8_0 => return repack_q8_0(data, rows, cols, out),
        _ => {}
    }
    let kind = Legacy::of(dtype).expect("supported");
    let (src_bytes, nb) = (dtype.type_size(), cols / QK8);
    let row_bytes = nb * src_bytes;
    assert_eq!(
        data.len(),
        rows * row_bytes,
        "data is not rows × cols weights"
    );
    let dst_bytes = kind.bytes();
    let (qh0, qs0) = (kind.qh_at(), kind.qs_at());
    for g in 0..rows / GROUP_ROWS {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * dst_bytes..][..dst_bytes];
            for r in 0..GROUP_ROWS {
                let src = &data[(g * GROUP_ROWS + r) * row_bytes + b * src_bytes..][..src_bytes];
                dst[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                if kind.min {
                    dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
                }
                // Row r's lanes of the interleaved block are 4r..4r+4 of each 32-byte column
                // group. Lane 4r+k, byte c of `qs` holds elements 4c+k (low nibble) and
                // 16+4c+k (high nibble): those of the file's `qs[4c+k]`, so `qs` moves in
                // 4-byte pieces; bit j of `qh` byte 4r+k is the 5th bit of element 4j+k.
                let at = 2 + 2 * usize::from(kind.min);
                let qs = &src[at + 4 * usize::from(kind.high)..][..16];
                for c in 0..4 {
                    let lanes = qs0 + 32 * c + 4 * r;
                    dst[lanes..lanes + 4].copy_from_slice(&qs[4 * c..4 * c + 4]);
                }
                if kind.high {
                    let qh = u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]]);
                    for k in 0..4 {
                        dst[qh0 + 4 * r + k] =
                            (0..8).fold(0, |m, j| m | (((qh >> (4 * j + k)) & 1) as u8) << j);
                    }
                }
            }
        }
    }
}

/// `offset · Σ q` of every 32-element block of `qs` (the quants of one or more activation
/// rows), appended to `out`: the correction [`tile`] subtracts from `Σ q_w · q_y` for the
/// symmetric types.
pub fn block_sums(offset: i32, qs: &[i8], out: &mut Vec<i32>) {
    out.extend(
        qs.chunks_exact(QK8)
            .map(|b| offset * b.iter().map(|&v| i32::from(v)).sum::<i32>()),
    );
}

/// Back-to-back activation rows as the 32-element interleaved kernels read them.
#[derive(Clone, Copy, Debug)]
pub struct LegacyActs<'a> {
    /// The quants of `n` rows.
    pub qs: &'a [i8],
    /// Per block, the scale `d_y`; for Q8_1 (offset weight types) followed by `s_y = d_y · Σ q`.
    pub d: &'a [f32],
    /// For the symmetric weight types, per block the [`block_sums`]; else empty.
    pub sums: &'a [i32],
}

/// Scalar reference: one interleaved group of a 32-element type (`w`, `nb` blocks of 8 rows)
/// · `n = out.len()` activation rows (Q8_0 with block sums for Q4_0 / Q5_0, Q8_1 for Q4_1 /
/// Q5_1); `out[t][r]` gets row `r` · token `t`.
///
/// # Panics
/// If the type is not a 32-element one or the lengths disagree.
pub fn tile(dtype: GgmlType, w: &[u8], ys: &LegacyActs, out: &mut [[f32; 8]]) {
    let kind = Legacy::of(dtype).expect("a 32-element type");
    let bytes = kind.bytes();
    let (nb, n, ds) = (w.len() / bytes, out.len(), kind.d_stride());
    assert!(w.len() == nb * bytes && ys.qs.len() == n * nb * QK8 && ys.d.len() == n * nb * ds);
    assert_eq!(ys.sums.len(), if kind.min { 0 } else { n * nb });
    let (qh0, qs0) = (kind.qh_at(), kind.qs_at());
    let f16 = |b: &[u8], i: usize| half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    for (t, o) in out.iter_mut().enumerate() {
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..nb {
            let blk = &w[b * bytes..][..bytes];
            let tb = t * nb + b;
            let yq = &ys.qs[tb * QK8..][..QK8];
            for (r, acc) in acc.iter_mut().enumerate() {
                let mut p = 0i32;
                for c in 0..4 {
                    for k in 0..4 {
                        let lane = 4 * r + k;
                        let packed = blk[qs0 + 32 * c + lane];
                        let bits = if kind.high { blk[qh0 + lane] } else { 0 };
                        let lo = (packed & 0x0F) | ((bits >> c) & 1) << 4;
                        let hi = (packed >> 4) | ((bits >> (c + 4)) & 1) << 4;
                        p += i32::from(lo) * i32::from(yq[4 * c + k]);
                        p += i32::from(hi) * i32::from(yq[16 + 4 * c + k]);
                    }
                }
                if !kind.min {
                    p -= ys.sums[tb];
                }
                let v = p as f32 * f16(blk, 2 * r);
                *acc = v.mul_add(ys.d[tb * ds], *acc);
                if kind.min {
                    *acc = f16(blk, 16 + 2 * r).mul_add(ys.d[tb * ds + 1], *acc);
                }
            }
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::legacy;
    use crate::kernels::quantize::{ActFormat, Q8Batch};
    use crate::kernels::testutil::{random_weights, Rng};

    /// Repacking a tensor a slice of rows at a time into its parts of one buffer (as the
    /// loader does, to release the file's pages as it goes) gives the whole tensor's bytes.
    #[test]
    fn repacking_slices_of_rows_gives_the_whole_layout() {
        let mut rng = Rng::new(5);
        let types = crate::kernels::MATMUL_TYPES
            .into_iter()
            .filter(|&t| supports(t));
        for dtype in types {
            let (rows, cols) = (40, 2 * QK_K);
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let whole = repack(dtype, &wb, rows, cols);
            let (row_bytes, gb) = (wb.len() / rows, group_bytes(dtype, cols));
            let mut sliced = vec![0u8; whole.len()];
            for (r0, r1) in [(0, 16), (16, 24), (24, 40)] {
                let dst = &mut sliced[r0 / GROUP_ROWS * gb..r1 / GROUP_ROWS * gb];
                repack_into(
                    dtype,
                    &wb[r0 * row_bytes..r1 * row_bytes],
                    r1 - r0,
                    cols,
                    dst,
                );
            }
            assert!(sliced == whole, "{dtype}");
        }
    }

    /// The interleaved scalar tile equals the row-layout scalar dot product up to rounding
    /// (the integer sums are the same; only the order of the float scaling differs).
    #[test]
    fn interleaved_tile_matches_row_kernels() {
        let mut rng = Rng::new(11);
        for dtype in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            let (rows, cols, n) = (16, 5 * 32, 3);
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let packed = repack(dtype, &wb, rows, cols);
            let min = Legacy::of(dtype).unwrap().min;
            let fmt = if min {
                ActFormat::Q8_1
            } else {
                ActFormat::Q8_0
            };
            let mut acts = Q8Batch::default();
            acts.quantize(None, fmt, &rng.f32s(n * cols, 2.0), n, cols);
            let mut sums = Vec::new();
            let ys = if min {
                let y = acts.q8_1_rows(0, n);
                LegacyActs {
                    qs: y.qs,
                    d: y.ds.as_flattened(),
                    sums: &[],
                }
            } else {
                let y = acts.q8_0_rows(0, n);
                block_sums(offset(dtype), y.qs, &mut sums);
                LegacyActs {
                    qs: y.qs,
                    d: y.d,
                    sums: &sums,
                }
            };
            let group = packed.len() / (rows / GROUP_ROWS);
            let rb = cols / 32 * dtype.type_size();
            for g in 0..rows / GROUP_ROWS {
                let mut out = vec![[0f32; 8]; n];
                tile(dtype, &packed[g * group..][..group], &ys, &mut out);
                for (t, got) in out.iter().enumerate() {
                    for (r, &got) in got.iter().enumerate() {
                        let row = &wb[(g * 8 + r) * rb..][..rb];
                        let want = match dtype {
                            GgmlType::Q4_0 => legacy::vec_dot_q4_0_q8_0(row, &acts.q8_0(t)),
                            GgmlType::Q5_0 => legacy::vec_dot_q5_0_q8_0(row, &acts.q8_0(t)),
                            GgmlType::Q4_1 => legacy::vec_dot_q4_1_q8_1(row, &acts.q8_1(t)),
                            _ => legacy::vec_dot_q5_1_q8_1(row, &acts.q8_1(t)),
                        };
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{dtype} row {} token {t}: {got} vs {want}",
                            g * 8 + r
                        );
                    }
                }
            }
        }
    }
}
