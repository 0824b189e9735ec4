//! Q8_0 weights interleaved by groups of 8 rows: the layout of a tied output projection (the
//! LM head that is also the embedding table), serving both the batched GEMM and row lookups.
//!
//! One interleaved block (8 rows × 32 columns, [`Q8_BLOCK_BYTES`] = the file's 8 blocks):
//! - `d`: 8 × f16, the rows' scales (16 bytes);
//! - `qs`: 8 chunks of 32 bytes; in chunk `c`, byte `4r + k` holds element `4c + k` of row `r`
//!   (signed), so one vector holds 4 quants of each of the 8 rows, one row per 32-bit lane.
//!
//! The quants are signed, as in the file. The x86 tiles give `maddubs` an unsigned operand
//! with the sign trick (`|q| · sign(q)·y`) on AVX2, or flip the quants' top bit (`q + 128`)
//! and subtract `128 · Σ y` of each activation block ([`super::interleaved::block_sums`],
//! offset 128) with VNNI; both give `Σ q·y` exactly.
//!
//! A row lookup ([`dequantize_row`]) reads one lane of every chunk: 32 strided 4-byte reads
//! per block instead of one contiguous 34-byte block, which costs nothing next to the GEMM it
//! makes faster (the Gemma 3 LM head is 262,144 × 640 — more than half the model's bytes).

use half::f16;

use super::interleaved::GROUP_ROWS;
use super::quantize::QK8;

/// Bytes of one interleaved Q8_0 block of 8 rows.
pub const Q8_BLOCK_BYTES: usize = 16 + 8 * 32;

/// File bytes of one Q8_0 block (f16 `d`, 32 × i8).
const SRC_BYTES: usize = 34;

/// [`super::interleaved::repack`] for Q8_0.
pub(super) fn repack_q8_0(data: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    let nb = cols / QK8;
    let row_bytes = nb * SRC_BYTES;
    assert_eq!(
        data.len(),
        rows * row_bytes,
        "data is not rows × cols weights"
    );
    for g in 0..rows / GROUP_ROWS {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * Q8_BLOCK_BYTES..][..Q8_BLOCK_BYTES];
            for r in 0..GROUP_ROWS {
                let src = &data[(g * GROUP_ROWS + r) * row_bytes + b * SRC_BYTES..][..SRC_BYTES];
                dst[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                for c in 0..8 {
                    let lane = 16 + 32 * c + 4 * r;
                    dst[lane..lane + 4].copy_from_slice(&src[2 + 4 * c..2 + 4 * c + 4]);
                }
            }
        }
    }
}

/// Row `r` of an interleaved Q8_0 matrix (`data`: `rows / 8` groups of `cols` columns),
/// dequantized into `out` (`cols` values): the same values as the file's row.
///
/// # Panics
/// If `out.len()` is not a multiple of 32 or `data` holds no row `r`.
pub fn dequantize_row(data: &[u8], r: usize, out: &mut [f32]) {
    let nb = out.len() / QK8;
    assert_eq!(out.len(), nb * QK8, "a row is whole blocks");
    let (g, lane) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let group = &data[g * nb * Q8_BLOCK_BYTES..][..nb * Q8_BLOCK_BYTES];
    for (blk, out) in group
        .chunks_exact(Q8_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK8))
    {
        let d = f16::from_le_bytes([blk[2 * lane], blk[2 * lane + 1]]).to_f32();
        for c in 0..8 {
            for k in 0..4 {
                out[4 * c + k] = d * f32::from(blk[16 + 32 * c + 4 * lane + k] as i8);
            }
        }
    }
}

/// Scalar reference: one interleaved Q8_0 group (`w`, `nb` blocks of 8 rows) · `n =
/// out.len()` Q8_0 activation rows (`qs`: `n · nb · 32` quants, `d`: `n · nb` scales);
/// `out[t][r]` gets row `r` · token `t`. Per token and row, blocks accumulate
/// `(Σ q·y · d_x) · d_y` with one FMA each in block order, as the x86 tiles do.
///
/// # Panics
/// If the lengths disagree.
pub fn tile_q8_0(w: &[u8], qs: &[i8], d: &[f32], out: &mut [[f32; 8]]) {
    let (nb, n) = (w.len() / Q8_BLOCK_BYTES, out.len());
    assert!(w.len() == nb * Q8_BLOCK_BYTES && qs.len() == n * nb * QK8 && d.len() == n * nb);
    for (t, o) in out.iter_mut().enumerate() {
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..nb {
            let blk = &w[b * Q8_BLOCK_BYTES..][..Q8_BLOCK_BYTES];
            let yq = &qs[(t * nb + b) * QK8..][..QK8];
            for (r, acc) in acc.iter_mut().enumerate() {
                let mut p = 0i32;
                for c in 0..8 {
                    for k in 0..4 {
                        let q = blk[16 + 32 * c + 4 * r + k] as i8;
                        p += i32::from(q) * i32::from(yq[4 * c + k]);
                    }
                }
                let dx = f16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]).to_f32();
                *acc = (p as f32 * dx).mul_add(d[t * nb + b], *acc);
            }
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::kernels::testutil::{random_weights, Rng};

    /// Every row read back from the interleaved layout equals the file's row, bit for bit.
    #[test]
    fn lookup_equals_the_file_rows() {
        let mut rng = Rng::new(31);
        let (rows, cols) = (24, 5 * 32);
        let data = random_weights(&mut rng, GgmlType::Q8_0, rows, cols);
        let packed = super::super::interleaved::repack(GgmlType::Q8_0, &data, rows, cols);
        assert_eq!(packed.len(), data.len());
        let all = crate::quant::dequantize_to_vec(GgmlType::Q8_0, &data).unwrap();
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(&packed, r, &mut row);
            assert_eq!(row, all[r * cols..(r + 1) * cols], "row {r}");
        }
    }
}
