//! One function per ggml block type: decode one block's bytes into its `f32` elements.
//!
//! Each function takes exactly one block (`&[u8; TYPE_SIZE]`) and writes exactly one block of
//! elements (`&mut [f32; BLOCK_SIZE]`). Multi-byte fields are little-endian, as in GGUF files.
//! Arithmetic is plain `f32` in the same order as ggml's `dequantize_row_*` (no fused
//! multiply-add), so the results are bit-identical to gguf-py's and to ggml's scalar code
//! (when the C compiler does not contract `a * b - c` into an FMA).
//!
//! Notation in the layout tables: `f16` is IEEE half precision, `i8`/`u8` one byte, offsets are
//! bytes from the start of the block, and `q[i]` is the integer quant of element `i`.

use half::f16;

use crate::gguf::QK_K;

/// Elements per block of the 32-element ("legacy") quants: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
pub const QK32: usize = 32;

/// Bytes of a Q4_0 block.
pub const Q4_0_BYTES: usize = 18;
/// Bytes of a Q4_1 block.
pub const Q4_1_BYTES: usize = 20;
/// Bytes of a Q5_0 block.
pub const Q5_0_BYTES: usize = 22;
/// Bytes of a Q5_1 block.
pub const Q5_1_BYTES: usize = 24;
/// Bytes of a Q8_0 block.
pub const Q8_0_BYTES: usize = 34;
/// Bytes of a Q8_1 block.
pub const Q8_1_BYTES: usize = 36;
/// Bytes of a Q2_K block.
pub const Q2_K_BYTES: usize = 84;
/// Bytes of a Q3_K block.
pub const Q3_K_BYTES: usize = 110;
/// Bytes of a Q4_K block.
pub const Q4_K_BYTES: usize = 144;
/// Bytes of a Q5_K block.
pub const Q5_K_BYTES: usize = 176;
/// Bytes of a Q6_K block.
pub const Q6_K_BYTES: usize = 210;
/// Bytes of a Q8_K block.
pub const Q8_K_BYTES: usize = 292;

/// The little-endian `f16` at `bytes[at..at + 2]`, widened to `f32` (exactly).
#[inline]
pub fn read_f16(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// The little-endian `f32` at `bytes[at..at + 4]`.
#[inline]
pub fn read_f32(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The little-endian `bf16` at `bytes[at..at + 2]`, widened to `f32`.
///
/// bf16 is the top half of an `f32`, so widening is a 16-bit shift (NaN payloads included).
#[inline]
pub fn read_bf16(bytes: &[u8], at: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])) << 16)
}

/// Q4_0: 32 elements in 18 bytes, symmetric 4-bit.
///
/// | offset | size | field | meaning                                             |
/// |--------|------|-------|-----------------------------------------------------|
/// | 0      | 2    | `d`   | `f16` scale                                         |
/// | 2      | 16   | `qs`  | byte `j`: low nibble = `q[j]`, high nibble = `q[j+16]` |
///
/// `x[i] = d * (q[i] - 8)`, with `q[i]` in `0..=15`.
pub fn dequantize_block_q4_0(block: &[u8; Q4_0_BYTES], out: &mut [f32; QK32]) {
    let d = read_f16(block, 0);
    let qs = &block[2..18];
    for (j, &byte) in qs.iter().enumerate() {
        let lo = i32::from(byte & 0x0F) - 8;
        let hi = i32::from(byte >> 4) - 8;
        out[j] = lo as f32 * d;
        out[j + 16] = hi as f32 * d;
    }
}

/// Q4_1: 32 elements in 20 bytes, 4-bit with an offset.
///
/// | offset | size | field | meaning                                             |
/// |--------|------|-------|-----------------------------------------------------|
/// | 0      | 2    | `d`   | `f16` scale                                         |
/// | 2      | 2    | `m`   | `f16` minimum (offset)                              |
/// | 4      | 16   | `qs`  | byte `j`: low nibble = `q[j]`, high nibble = `q[j+16]` |
///
/// `x[i] = d * q[i] + m`, with `q[i]` in `0..=15`.
pub fn dequantize_block_q4_1(block: &[u8; Q4_1_BYTES], out: &mut [f32; QK32]) {
    let d = read_f16(block, 0);
    let m = read_f16(block, 2);
    let qs = &block[4..20];
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = f32::from(byte & 0x0F) * d + m;
        out[j + 16] = f32::from(byte >> 4) * d + m;
    }
}

/// The 5th bits of Q5_0/Q5_1: bit `i` of the little-endian `u32` is the high bit of `q[i]`.
#[inline]
fn q5_high_bits(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Q5_0: 32 elements in 22 bytes, symmetric 5-bit.
///
/// | offset | size | field | meaning                                                      |
/// |--------|------|-------|--------------------------------------------------------------|
/// | 0      | 2    | `d`   | `f16` scale                                                  |
/// | 2      | 4    | `qh`  | little-endian `u32`; bit `i` = bit 4 of `q[i]`               |
/// | 6      | 16   | `qs`  | byte `j`: low nibble = low 4 bits of `q[j]`, high nibble = of `q[j+16]` |
///
/// `x[i] = d * (q[i] - 16)`, with `q[i]` in `0..=31`.
pub fn dequantize_block_q5_0(block: &[u8; Q5_0_BYTES], out: &mut [f32; QK32]) {
    let d = read_f16(block, 0);
    let qh = q5_high_bits(block, 2);
    let qs = &block[6..22];
    for (j, &byte) in qs.iter().enumerate() {
        let hi_lo = ((qh >> j) & 1) << 4;
        let hi_hi = ((qh >> (j + 16)) & 1) << 4;
        let q_lo = (u32::from(byte & 0x0F) | hi_lo) as i32 - 16;
        let q_hi = (u32::from(byte >> 4) | hi_hi) as i32 - 16;
        out[j] = q_lo as f32 * d;
        out[j + 16] = q_hi as f32 * d;
    }
}

/// Q5_1: 32 elements in 24 bytes, 5-bit with an offset.
///
/// | offset | size | field | meaning                                                      |
/// |--------|------|-------|--------------------------------------------------------------|
/// | 0      | 2    | `d`   | `f16` scale                                                  |
/// | 2      | 2    | `m`   | `f16` minimum (offset)                                       |
/// | 4      | 4    | `qh`  | little-endian `u32`; bit `i` = bit 4 of `q[i]`               |
/// | 8      | 16   | `qs`  | byte `j`: low nibble = low 4 bits of `q[j]`, high nibble = of `q[j+16]` |
///
/// `x[i] = d * q[i] + m`, with `q[i]` in `0..=31`.
pub fn dequantize_block_q5_1(block: &[u8; Q5_1_BYTES], out: &mut [f32; QK32]) {
    let d = read_f16(block, 0);
    let m = read_f16(block, 2);
    let qh = q5_high_bits(block, 4);
    let qs = &block[8..24];
    for (j, &byte) in qs.iter().enumerate() {
        let hi_lo = ((qh >> j) & 1) << 4;
        let hi_hi = ((qh >> (j + 16)) & 1) << 4;
        let q_lo = u32::from(byte & 0x0F) | hi_lo;
        let q_hi = u32::from(byte >> 4) | hi_hi;
        out[j] = q_lo as f32 * d + m;
        out[j + 16] = q_hi as f32 * d + m;
    }
}

/// Q8_0: 32 elements in 34 bytes, symmetric 8-bit.
///
/// | offset | size | field | meaning          |
/// |--------|------|-------|------------------|
/// | 0      | 2    | `d`   | `f16` scale      |
/// | 2      | 32   | `qs`  | `i8` `q[0..32]`  |
///
/// `x[i] = d * q[i]`, with `q[i]` in `-128..=127`.
pub fn dequantize_block_q8_0(block: &[u8; Q8_0_BYTES], out: &mut [f32; QK32]) {
    let d = read_f16(block, 0);
    for (o, &byte) in out.iter_mut().zip(&block[2..34]) {
        *o = f32::from(byte as i8) * d;
    }
}

/// Q8_1: 32 elements in 36 bytes, symmetric 8-bit with a precomputed sum (used by dot products
/// as the activation side; ggml itself has no dequantizer for it).
///
/// | offset | size | field | meaning                                   |
/// |--------|------|-------|-------------------------------------------|
/// | 0      | 2    | `d`   | `f16` scale                               |
/// | 2      | 2    | `s`   | `f16` `d * sum(q)` (ignored here)         |
/// | 4      | 32   | `qs`  | `i8` `q[0..32]`                           |
///
/// `x[i] = d * q[i]`.
pub fn dequantize_block_q8_1(block: &[u8; Q8_1_BYTES], out: &mut [f32; QK32]) {
    let d = read_f16(block, 0);
    for (o, &byte) in out.iter_mut().zip(&block[4..36]) {
        *o = f32::from(byte as i8) * d;
    }
}

/// Q2_K: 256 elements in 84 bytes; 16 sub-blocks of 16 elements, each with a 4-bit scale and a
/// 4-bit min.
///
/// | offset | size | field    | meaning                                                  |
/// |--------|------|----------|----------------------------------------------------------|
/// | 0      | 16   | `scales` | byte `s`: low nibble = scale `sc[s]`, high nibble = min `mn[s]` |
/// | 16     | 64   | `qs`     | 2-bit quants, see below                                  |
/// | 80     | 2    | `d`      | `f16` super-scale of the scales                          |
/// | 82     | 2    | `dmin`   | `f16` super-scale of the mins                            |
///
/// Element `i = 128*h + 32*k + l` (`h` in `0..2`, `k` in `0..4`, `l` in `0..32`) has
/// `q = (qs[32*h + l] >> 2*k) & 3` and sub-block `s = 8*h + 2*k + l/16`:
///
/// `x[i] = (d * sc[s]) * q - (dmin * mn[s])`.
pub fn dequantize_block_q2_k(block: &[u8; Q2_K_BYTES], out: &mut [f32; QK_K]) {
    let scales = &block[0..16];
    let qs = &block[16..80];
    let d = read_f16(block, 80);
    let dmin = read_f16(block, 82);
    for h in 0..2 {
        for k in 0..4 {
            for half in 0..2 {
                let s = 8 * h + 2 * k + half;
                let dl = d * f32::from(scales[s] & 0x0F);
                let ml = dmin * f32::from(scales[s] >> 4);
                for l in 16 * half..16 * half + 16 {
                    let q = (qs[32 * h + l] >> (2 * k)) & 3;
                    out[128 * h + 32 * k + l] = dl * f32::from(q) - ml;
                }
            }
        }
    }
}

/// The `j`-th (of 16) 6-bit Q3_K scale from its 12 packed bytes.
///
/// The low 4 bits of scales 0..8 are the low nibbles of bytes 0..8, of scales 8..16 the high
/// nibbles of bytes 0..8; the top 2 bits of scale `j` are bits `2*(j/4)..` of byte `8 + j%4`.
#[inline]
fn q3_k_scale(scales: &[u8], j: usize) -> u8 {
    let low = if j < 8 {
        scales[j] & 0x0F
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    low | (high << 4)
}

/// Q3_K: 256 elements in 110 bytes; 16 sub-blocks of 16 elements with signed 6-bit scales.
///
/// | offset | size | field    | meaning                                                   |
/// |--------|------|----------|-----------------------------------------------------------|
/// | 0      | 32   | `hmask`  | high bits of the quants, see below                        |
/// | 32     | 64   | `qs`     | low 2 bits of the quants, see below                       |
/// | 96     | 12   | `scales` | 16 6-bit scales `sc[s]` packed as described at the bottom  |
/// | 108    | 2    | `d`      | `f16` super-scale                                         |
///
/// Element `i = 128*h + 32*k + l` (`h` in `0..2`, `k` in `0..4`, `l` in `0..32`) has low bits
/// `lo = (qs[32*h + l] >> 2*k) & 3`, high bit `hb = (hmask[l] >> (4*h + k)) & 1`, so
/// `q = lo - 4 * (1 - hb)` (in `-4..=3`), and sub-block `s = 8*h + 2*k + l/16`:
///
/// `x[i] = (d * (sc[s] - 32)) * q`.
///
/// Scale packing: `sc[s]` low 4 bits are `scales[s] & 15` for `s < 8` and `scales[s-8] >> 4`
/// otherwise; its top 2 bits are `(scales[8 + s%4] >> 2*(s/4)) & 3`.
pub fn dequantize_block_q3_k(block: &[u8; Q3_K_BYTES], out: &mut [f32; QK_K]) {
    let hmask = &block[0..32];
    let qs = &block[32..96];
    let scales = &block[96..108];
    let d = read_f16(block, 108);
    for h in 0..2 {
        for k in 0..4 {
            for half in 0..2 {
                let s = 8 * h + 2 * k + half;
                let dl = d * f32::from(q3_k_scale(scales, s) as i8 - 32);
                for l in 16 * half..16 * half + 16 {
                    let lo = ((qs[32 * h + l] >> (2 * k)) & 3) as i8;
                    let hb = (hmask[l] >> (4 * h + k)) & 1;
                    let q = if hb == 1 { lo } else { lo - 4 };
                    out[128 * h + 32 * k + l] = dl * f32::from(q);
                }
            }
        }
    }
}

/// The `j`-th (of 8) 6-bit scale and min of Q4_K/Q5_K from their 12 packed bytes.
///
/// For `j < 4`: `sc = b[j] & 63`, `mn = b[j+4] & 63`. For `j >= 4`:
/// `sc = (b[j+4] & 15) | ((b[j-4] >> 6) << 4)`, `mn = (b[j+4] >> 4) | ((b[j] >> 6) << 4)`.
#[inline]
pub fn k4_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Q4_K: 256 elements in 144 bytes; 8 sub-blocks of 32 elements, each with a 6-bit scale and a
/// 6-bit min.
///
/// | offset | size | field    | meaning                                                   |
/// |--------|------|----------|-----------------------------------------------------------|
/// | 0      | 2    | `d`      | `f16` super-scale of the scales                           |
/// | 2      | 2    | `dmin`   | `f16` super-scale of the mins                             |
/// | 4      | 12   | `scales` | 8 scales `sc[s]` and 8 mins `mn[s]`, 6 bits each (see [`k4_scale_min`]) |
/// | 16     | 128  | `qs`     | 4-bit quants, see below                                   |
///
/// Element `i = 64*p + 32*n + l` (`p` in `0..4`, `n` in `0..2`, `l` in `0..32`) is the low
/// (`n = 0`) or high (`n = 1`) nibble of `qs[32*p + l]`, in sub-block `s = 2*p + n`:
///
/// `x[i] = (d * sc[s]) * q - (dmin * mn[s])`, with `q` in `0..=15`.
pub fn dequantize_block_q4_k(block: &[u8; Q4_K_BYTES], out: &mut [f32; QK_K]) {
    let d = read_f16(block, 0);
    let dmin = read_f16(block, 2);
    let scales = &block[4..16];
    let qs = &block[16..144];
    for p in 0..4 {
        for n in 0..2 {
            let (sc, mn) = k4_scale_min(scales, 2 * p + n);
            let d1 = d * f32::from(sc);
            let m1 = dmin * f32::from(mn);
            for l in 0..32 {
                let q = (qs[32 * p + l] >> (4 * n)) & 0x0F;
                out[64 * p + 32 * n + l] = d1 * f32::from(q) - m1;
            }
        }
    }
}

/// Q5_K: 256 elements in 176 bytes; like Q4_K with a 5th bit per quant.
///
/// | offset | size | field    | meaning                                                   |
/// |--------|------|----------|-----------------------------------------------------------|
/// | 0      | 2    | `d`      | `f16` super-scale of the scales                           |
/// | 2      | 2    | `dmin`   | `f16` super-scale of the mins                             |
/// | 4      | 12   | `scales` | 8 scales `sc[s]` and 8 mins `mn[s]`, 6 bits each (see [`k4_scale_min`]) |
/// | 16     | 32   | `qh`     | high bits: bit `s` of `qh[l]` belongs to sub-block `s`    |
/// | 48     | 128  | `qs`     | low 4 bits, laid out as in Q4_K                           |
///
/// Element `i = 64*p + 32*n + l` (`p` in `0..4`, `n` in `0..2`, `l` in `0..32`) is in sub-block
/// `s = 2*p + n` and has `q = ((qs[32*p + l] >> 4*n) & 15) | (((qh[l] >> s) & 1) << 4)`:
///
/// `x[i] = (d * sc[s]) * q - (dmin * mn[s])`, with `q` in `0..=31`.
pub fn dequantize_block_q5_k(block: &[u8; Q5_K_BYTES], out: &mut [f32; QK_K]) {
    let d = read_f16(block, 0);
    let dmin = read_f16(block, 2);
    let scales = &block[4..16];
    let qh = &block[16..48];
    let qs = &block[48..176];
    for p in 0..4 {
        for n in 0..2 {
            let s = 2 * p + n;
            let (sc, mn) = k4_scale_min(scales, s);
            let d1 = d * f32::from(sc);
            let m1 = dmin * f32::from(mn);
            for l in 0..32 {
                let low = (qs[32 * p + l] >> (4 * n)) & 0x0F;
                let high = ((qh[l] >> s) & 1) << 4;
                out[64 * p + 32 * n + l] = d1 * f32::from(low | high) - m1;
            }
        }
    }
}

/// Q6_K: 256 elements in 210 bytes; 16 sub-blocks of 16 elements with signed 8-bit scales.
///
/// | offset | size | field    | meaning                                   |
/// |--------|------|----------|-------------------------------------------|
/// | 0      | 128  | `ql`     | low 4 bits of the quants, see below       |
/// | 128    | 64   | `qh`     | high 2 bits of the quants, see below      |
/// | 192    | 16   | `scales` | `i8` scales `sc[0..16]`                   |
/// | 208    | 2    | `d`      | `f16` super-scale                         |
///
/// Element `i = 128*h + 32*k + l` (`h` in `0..2`, `k` in `0..4`, `l` in `0..32`) has
/// low bits `(ql[64*h + 32*(k%2) + l] >> 4*(k/2)) & 15`, high bits
/// `(qh[32*h + l] >> 2*k) & 3`, so `q = (low | high << 4) - 32` (in `-32..=31`), and
/// sub-block `s = 8*h + 2*k + l/16`:
///
/// `x[i] = (d * sc[s]) * q`.
pub fn dequantize_block_q6_k(block: &[u8; Q6_K_BYTES], out: &mut [f32; QK_K]) {
    let ql = &block[0..128];
    let qh = &block[128..192];
    let scales = &block[192..208];
    let d = read_f16(block, 208);
    for h in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                let high = (qh[32 * h + l] >> (2 * k)) & 3;
                let q = (low | (high << 4)) as i8 - 32;
                let sc = scales[8 * h + 2 * k + l / 16] as i8;
                out[128 * h + 32 * k + l] = d * f32::from(sc) * f32::from(q);
            }
        }
    }
}

/// Q8_K: 256 elements in 292 bytes, symmetric 8-bit with an `f32` scale (ggml's activation
/// format for k-quant dot products).
///
/// | offset | size | field   | meaning                                            |
/// |--------|------|---------|----------------------------------------------------|
/// | 0      | 4    | `d`     | `f32` scale                                        |
/// | 4      | 256  | `qs`    | `i8` `q[0..256]`                                   |
/// | 260    | 32   | `bsums` | 16 `i16`, sums of `q` over groups of 16 (ignored)  |
///
/// `x[i] = d * q[i]`.
pub fn dequantize_block_q8_k(block: &[u8; Q8_K_BYTES], out: &mut [f32; QK_K]) {
    let d = read_f32(block, 0);
    for (o, &byte) in out.iter_mut().zip(&block[4..260]) {
        *o = d * f32::from(byte as i8);
    }
}

#[cfg(test)]
#[path = "blocks_tests.rs"]
mod tests;
