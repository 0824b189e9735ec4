//! Q4_K and Q6_K weights interleaved by groups of 8 rows (see `interleaved` for the idea and
//! the arrangement of a 32-column sub-block's quants: in chunk `c` of 32 bytes, byte `4r + k`
//! holds element `4c + k` of row `r` in its low nibble and element `16 + 4c + k` in its high
//! nibble).
//!
//! One interleaved Q4_K super-block (8 rows × 256 columns, [`K4_GROUP_BYTES`] — 32 bytes more
//! than the file's 8 blocks, as the 6-bit scales are stored unpacked):
//! - `d`, then `dmin`: 8 × f16 each;
//! - `scales`: byte `8s + r`, the scale of sub-block `s` of row `r`;
//! - `mins`: byte `16p + 2r + i`, the min of sub-block `2p + i` of row `r` (pairs of sub-blocks,
//!   so that one `madd` with pairs of activation sums covers two);
//! - `qs`: 8 sub-blocks of 32 columns, each 4 chunks of 32 bytes.
//!
//! One interleaved Q6_K super-block (8 rows × 256 columns, [`K6_GROUP_BYTES`], the size of the
//! file's 8 blocks):
//! - `d`: 8 × f16;
//! - `scales`: byte `16p + 2r + i`, the (signed) scale of 16-column group `2p + i` of row `r`:
//!   one i16 pair per row, which is also what multiplies pairs of the activations' 16-sums;
//! - per sub-block of 32 columns (192 bytes): the low 4 bits in 4 chunks of 32 bytes, then the
//!   high 2 bits in two 32-byte vectors: byte `4r + k` of the first holds, in bits `2c..2c + 2`,
//!   those of element `4c + k` of row `r`, the second those of element `16 + 4c + k`.
//!
//! Q6_K's quants are `q − 32` with `q` in `0..64`: stored unsigned, the offset is removed with
//! the activations' 16-element sums, `Σ sc·(q − 32)·y = Σ sc·q·y − 32 · Σ sc·Σy`.

use crate::gguf::GgmlType;
use crate::quant::blocks::k4_scale_min;

use super::interleaved::GROUP_ROWS;
use super::quantize::{Q8KRow, QK_K};

/// Bytes of one interleaved Q4_K super-block of 8 rows.
pub const K4_GROUP_BYTES: usize = 32 + 64 + 64 + 8 * 128;

/// Bytes of one interleaved Q6_K super-block of 8 rows.
pub const K6_GROUP_BYTES: usize = 16 + 128 + 8 * 192;

/// Checks that `data` is `rows × cols` weights of `dtype`; returns (block bytes, blocks per row).
fn shape(dtype: GgmlType, data: &[u8], rows: usize, cols: usize) -> (usize, usize) {
    let (src_bytes, nb) = (dtype.type_size(), cols / QK_K);
    assert_eq!(
        data.len(),
        rows * nb * src_bytes,
        "data is not rows × cols weights"
    );
    (src_bytes, nb)
}

/// [`super::interleaved::repack`] for Q4_K.
pub(super) fn repack_k4(data: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    let (src_bytes, nb) = shape(GgmlType::Q4_K, data, rows, cols);
    let row_bytes = nb * src_bytes;
    for g in 0..rows / GROUP_ROWS {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * K4_GROUP_BYTES..][..K4_GROUP_BYTES];
            for r in 0..GROUP_ROWS {
                let src = &data[(g * GROUP_ROWS + r) * row_bytes + b * src_bytes..][..src_bytes];
                dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
                dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
                let (scales, qs) = (&src[4..16], &src[16..144]);
                for s in 0..8 {
                    let (sc, mn) = k4_scale_min(scales, s);
                    dst[32 + 8 * s + r] = sc;
                    dst[96 + 16 * (s / 2) + 2 * r + s % 2] = mn;
                    // Sub-block s: low (s even) or high nibbles of qs[32 · (s / 2) ..][..32].
                    let q = |l: usize| (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
                    for c in 0..4 {
                        for k in 0..4 {
                            let (lo, hi) = (q(4 * c + k), q(16 + 4 * c + k));
                            dst[160 + 128 * s + 32 * c + 4 * r + k] = lo | hi << 4;
                        }
                    }
                }
            }
        }
    }
}

/// [`super::interleaved::repack`] for Q6_K.
pub(super) fn repack_k6(data: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    let (src_bytes, nb) = shape(GgmlType::Q6_K, data, rows, cols);
    let row_bytes = nb * src_bytes;
    for g in 0..rows / GROUP_ROWS {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * K6_GROUP_BYTES..][..K6_GROUP_BYTES];
            for r in 0..GROUP_ROWS {
                let src = &data[(g * GROUP_ROWS + r) * row_bytes + b * src_bytes..][..src_bytes];
                let (ql, qh, scales) = (&src[0..128], &src[128..192], &src[192..208]);
                dst[2 * r..2 * r + 2].copy_from_slice(&src[208..210]);
                for (grp, &sc) in scales.iter().enumerate() {
                    dst[16 + 16 * (grp / 2) + 2 * r + grp % 2] = sc;
                }
                // Element i of the block, 6 bits: ggml's Q6_K order.
                let q = |i: usize| {
                    let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
                    let low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                    let high = (qh[32 * h + l] >> (2 * k)) & 3;
                    low | high << 4
                };
                for s in 0..8 {
                    let sub = &mut dst[144 + 192 * s..][..192];
                    for c in 0..4 {
                        for k in 0..4 {
                            let (lo, hi) = (q(32 * s + 4 * c + k), q(32 * s + 16 + 4 * c + k));
                            let lane = 4 * r + k;
                            sub[32 * c + lane] = (lo & 0x0F) | (hi & 0x0F) << 4;
                            sub[128 + lane] |= (lo >> 4) << (2 * c);
                            sub[160 + lane] |= (hi >> 4) << (2 * c);
                        }
                    }
                }
            }
        }
    }
}

/// Scalar reference for Q4_K: one interleaved group (`w`, whole super-blocks of 8 rows) ·
/// `n = out.len()` Q8_K activation rows given back to back in `ys`; `out[t][r]` gets row `r` ·
/// token `t`.
///
/// Per super-block and row: `isum = Σ_s sc[s] · Σ q·y` and `msum = Σ_s mn[s] · Σ y` over the
/// 8 sub-blocks, then `acc += (isum · d) · d_y` and `acc −= (msum · dmin) · d_y`, each one FMA.
///
/// # Panics
/// If the lengths disagree.
pub fn tile_k4(w: &[u8], ys: &Q8KRow, out: &mut [[f32; 8]]) {
    let (nb, n) = (w.len() / K4_GROUP_BYTES, out.len());
    assert_eq!(w.len(), nb * K4_GROUP_BYTES);
    assert!(ys.qs.len() == n * nb * QK_K && ys.d.len() == n * nb && ys.bsums.len() == n * nb * 16);
    let f16 = |b: &[u8], i: usize| half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    for (t, o) in out.iter_mut().enumerate() {
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..nb {
            let blk = &w[b * K4_GROUP_BYTES..][..K4_GROUP_BYTES];
            let tb = t * nb + b;
            let yq = &ys.qs[tb * QK_K..][..QK_K];
            let bs = &ys.bsums[tb * 16..][..16];
            for (r, acc) in acc.iter_mut().enumerate() {
                let (mut isum, mut msum) = (0i32, 0i32);
                for s in 0..8 {
                    let mut p = 0i32;
                    for c in 0..4 {
                        for k in 0..4 {
                            let packed = blk[160 + 128 * s + 32 * c + 4 * r + k];
                            p += i32::from(packed & 0x0F) * i32::from(yq[32 * s + 4 * c + k]);
                            p += i32::from(packed >> 4) * i32::from(yq[32 * s + 16 + 4 * c + k]);
                        }
                    }
                    isum += i32::from(blk[32 + 8 * s + r]) * p;
                    let ysum = i32::from(bs[2 * s]) + i32::from(bs[2 * s + 1]);
                    msum += i32::from(blk[96 + 16 * (s / 2) + 2 * r + s % 2]) * ysum;
                }
                let dy = ys.d[tb];
                *acc = (isum as f32 * f16(blk, 2 * r)).mul_add(dy, *acc);
                *acc = (msum as f32 * f16(blk, 16 + 2 * r)).mul_add(-dy, *acc);
            }
        }
        *o = acc;
    }
}

/// Scalar reference for Q6_K: one interleaved group (`w`, whole super-blocks of 8 rows) ·
/// `n = out.len()` Q8_K activation rows given back to back in `ys`; `out[t][r]` gets row `r` ·
/// token `t`.
///
/// Per super-block and row: `isum = Σ_g sc[g] · Σ q·y` over the 16 groups of 16 columns,
/// `msum = Σ_g sc[g] · Σ y`, then `acc += ((isum − 32 · msum) · d) · d_y` with one FMA.
///
/// # Panics
/// If the lengths disagree.
pub fn tile_k6(w: &[u8], ys: &Q8KRow, out: &mut [[f32; 8]]) {
    let (nb, n) = (w.len() / K6_GROUP_BYTES, out.len());
    assert_eq!(w.len(), nb * K6_GROUP_BYTES);
    assert!(ys.qs.len() == n * nb * QK_K && ys.d.len() == n * nb && ys.bsums.len() == n * nb * 16);
    for (t, o) in out.iter_mut().enumerate() {
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..nb {
            let blk = &w[b * K6_GROUP_BYTES..][..K6_GROUP_BYTES];
            let tb = t * nb + b;
            let yq = &ys.qs[tb * QK_K..][..QK_K];
            let bs = &ys.bsums[tb * 16..][..16];
            for (r, acc) in acc.iter_mut().enumerate() {
                let (mut isum, mut msum) = (0i32, 0i32);
                for s in 0..8 {
                    let sub = &blk[144 + 192 * s..][..192];
                    let (mut p_lo, mut p_hi) = (0i32, 0i32);
                    for c in 0..4 {
                        for k in 0..4 {
                            let lane = 4 * r + k;
                            let packed = sub[32 * c + lane];
                            let lo = (packed & 0x0F) | ((sub[128 + lane] >> (2 * c)) & 3) << 4;
                            let hi = (packed >> 4) | ((sub[160 + lane] >> (2 * c)) & 3) << 4;
                            p_lo += i32::from(lo) * i32::from(yq[32 * s + 4 * c + k]);
                            p_hi += i32::from(hi) * i32::from(yq[32 * s + 16 + 4 * c + k]);
                        }
                    }
                    let sc =
                        |grp: usize| i32::from(blk[16 + 16 * (grp / 2) + 2 * r + grp % 2] as i8);
                    isum += sc(2 * s) * p_lo + sc(2 * s + 1) * p_hi;
                    msum +=
                        sc(2 * s) * i32::from(bs[2 * s]) + sc(2 * s + 1) * i32::from(bs[2 * s + 1]);
                }
                let d = half::f16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]).to_f32();
                *acc = ((isum - 32 * msum) as f32 * d).mul_add(ys.d[tb], *acc);
            }
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::interleaved::{group_bytes, repack};
    use crate::kernels::kquants;
    use crate::kernels::quantize::{ActFormat, Q8Batch};
    use crate::kernels::testutil::{random_weights, Rng};

    /// The interleaved scalar tiles equal the row-layout scalar Q4_K / Q6_K · Q8_K dot
    /// products up to rounding (the integer sums are the same).
    #[test]
    fn interleaved_k_tiles_match_row_kernels() {
        let mut rng = Rng::new(12);
        for dtype in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let (rows, cols, n) = (16, 2 * 256, 3);
            let wb = random_weights(&mut rng, dtype, rows, cols);
            let packed = repack(dtype, &wb, rows, cols);
            let gb = group_bytes(dtype, cols);
            assert_eq!(packed.len(), rows / 8 * gb);
            let rb = cols / 256 * dtype.type_size();
            let mut acts = Q8Batch::default();
            acts.quantize(None, ActFormat::Q8K, &rng.f32s(n * cols, 2.0), n, cols);
            for g in 0..rows / GROUP_ROWS {
                let mut out = vec![[0f32; 8]; n];
                let w = &packed[g * gb..][..gb];
                match dtype {
                    GgmlType::Q4_K => tile_k4(w, &acts.q8_k_rows(0, n), &mut out),
                    _ => tile_k6(w, &acts.q8_k_rows(0, n), &mut out),
                }
                for (t, got) in out.iter().enumerate() {
                    for (r, &got) in got.iter().enumerate() {
                        let row = &wb[(g * 8 + r) * rb..][..rb];
                        let want = match dtype {
                            GgmlType::Q4_K => kquants::vec_dot_q4_k_q8_k(row, &acts.q8_k(t)),
                            _ => kquants::vec_dot_q6_k_q8_k(row, &acts.q8_k(t)),
                        };
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{dtype} row {} token {t}: {got} vs {want}",
                            g * 8 + r
                        );
                    }
                }
            }
        }
    }
}
