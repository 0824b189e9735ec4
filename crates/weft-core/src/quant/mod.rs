//! Scalar reference dequantizers for ggml tensor types.
//!
//! These turn the raw bytes of a GGUF tensor into `f32` values. They are written for clarity,
//! not speed: each block type has its own function in [`blocks`] with its byte layout and
//! formula, and faster (SIMD) kernels are tested against them. The arithmetic follows ggml's
//! `dequantize_row_*` operation by operation in plain `f32` (no FMA), so results are
//! bit-identical to gguf-py's `gguf.quants.dequantize` (checked by
//! `tests/dequant_reference.rs`) and to ggml's scalar C code built without FMA contraction.
//!
//! Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//! Q8_K. Every other type gives [`Error::UnsupportedType`].

pub mod blocks;

use crate::gguf::GgmlType;
use crate::{Error, Result};

/// The types [`dequantize`] handles, in ggml id order.
pub const SUPPORTED: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::BF16,
];

/// Whether [`dequantize`] handles `dtype`.
pub fn is_supported(dtype: GgmlType) -> bool {
    SUPPORTED.contains(&dtype)
}

/// The number of elements held by `n_bytes` bytes of `dtype`, checking that they are a whole
/// number of blocks.
///
/// Errors: [`Error::UnsupportedType`] when [`dequantize`] cannot handle `dtype`,
/// [`Error::PartialBlock`] when `n_bytes` is not a multiple of the block size in bytes.
pub fn element_count(dtype: GgmlType, n_bytes: usize) -> Result<usize> {
    if !is_supported(dtype) {
        return Err(Error::UnsupportedType { dtype });
    }
    let block_bytes = dtype.type_size();
    if !n_bytes.is_multiple_of(block_bytes) {
        return Err(Error::PartialBlock {
            dtype,
            len: n_bytes,
            block_bytes,
        });
    }
    // Cannot overflow for any slice that fits in memory, but stay panic-free regardless.
    (n_bytes / block_bytes)
        .checked_mul(dtype.block_size())
        .ok_or(Error::PartialBlock {
            dtype,
            len: n_bytes,
            block_bytes,
        })
}

/// Dequantizes `bytes`, a whole number of `dtype` blocks, into `out`.
///
/// `out.len()` must be exactly the number of elements the bytes hold
/// (`bytes.len() / dtype.type_size() * dtype.block_size()`).
///
/// Errors: [`Error::UnsupportedType`] for a type without a dequantizer,
/// [`Error::PartialBlock`] when `bytes` ends inside a block, and [`Error::OutputLength`] when
/// `out` has the wrong length. Nothing is written on error.
pub fn dequantize(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let n = element_count(dtype, bytes.len())?;
    if out.len() != n {
        return Err(Error::OutputLength {
            dtype,
            expected: n,
            found: out.len(),
        });
    }
    use GgmlType::*;
    match dtype {
        F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = blocks::read_f32(b, 0);
            }
        }
        F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = blocks::read_f16(b, 0);
            }
        }
        BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = blocks::read_bf16(b, 0);
            }
        }
        Q4_0 => each_block(bytes, out, blocks::dequantize_block_q4_0),
        Q4_1 => each_block(bytes, out, blocks::dequantize_block_q4_1),
        Q5_0 => each_block(bytes, out, blocks::dequantize_block_q5_0),
        Q5_1 => each_block(bytes, out, blocks::dequantize_block_q5_1),
        Q8_0 => each_block(bytes, out, blocks::dequantize_block_q8_0),
        Q8_1 => each_block(bytes, out, blocks::dequantize_block_q8_1),
        Q2_K => each_block(bytes, out, blocks::dequantize_block_q2_k),
        Q3_K => each_block(bytes, out, blocks::dequantize_block_q3_k),
        Q4_K => each_block(bytes, out, blocks::dequantize_block_q4_k),
        Q5_K => each_block(bytes, out, blocks::dequantize_block_q5_k),
        Q6_K => each_block(bytes, out, blocks::dequantize_block_q6_k),
        Q8_K => each_block(bytes, out, blocks::dequantize_block_q8_k),
        // `element_count` already rejected every other type.
        _ => return Err(Error::UnsupportedType { dtype }),
    }
    Ok(())
}

/// Dequantizes `bytes`, a whole number of `dtype` blocks, into a new vector.
///
/// Errors as [`dequantize`] (except the output length, which is always right).
pub fn dequantize_to_vec(dtype: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let mut out = vec![0f32; element_count(dtype, bytes.len())?];
    dequantize(dtype, bytes, &mut out)?;
    Ok(out)
}

/// Runs a block function over matching `B`-byte input and `N`-element output blocks.
///
/// The caller has checked that `bytes` and `out` hold the same whole number of blocks.
fn each_block<const B: usize, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    block_fn: fn(&[u8; B], &mut [f32; N]),
) {
    for (b, o) in bytes.chunks_exact(B).zip(out.chunks_exact_mut(N)) {
        let b: &[u8; B] = b.try_into().expect("chunks_exact yields B bytes");
        let o: &mut [f32; N] = o.try_into().expect("chunks_exact_mut yields N elements");
        block_fn(b, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_decodes_zero_blocks_to_zero() {
        for dtype in GgmlType::ALL.into_iter().filter(|&t| is_supported(t)) {
            let bytes = vec![0u8; 3 * dtype.type_size()];
            let out = dequantize_to_vec(dtype, &bytes).unwrap();
            assert_eq!(out.len(), 3 * dtype.block_size(), "{dtype}");
            // All-zero bytes mean zero scales (and for the offset types a zero minimum).
            assert!(out.iter().all(|&x| x == 0.0), "{dtype}");
        }
    }

    #[test]
    fn empty_input_is_fine() {
        assert!(dequantize_to_vec(GgmlType::Q4_K, &[]).unwrap().is_empty());
        dequantize(GgmlType::F16, &[], &mut []).unwrap();
    }

    #[test]
    fn plain_types() {
        let f32s = [1.5f32, -0.0, f32::INFINITY];
        let bytes: Vec<u8> = f32s.iter().flat_map(|x| x.to_le_bytes()).collect();
        let out = dequantize_to_vec(GgmlType::F32, &bytes).unwrap();
        assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), {
            f32s.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        });

        // f16: 1.0, -2.0, 65504 (max), smallest subnormal.
        let out =
            dequantize_to_vec(GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 1, 0]).unwrap();
        assert_eq!(out, [1.0, -2.0, 65504.0, 2f32.powi(-24)]);

        // bf16: 1.0, -6.0, 3.140625 (0x4049).
        let out = dequantize_to_vec(GgmlType::BF16, &[0x80, 0x3F, 0xC0, 0xC0, 0x49, 0x40]).unwrap();
        assert_eq!(out, [1.0, -6.0, 3.140625]);
    }

    #[test]
    fn dispatch_reaches_the_block_function() {
        // Two Q4_0 blocks: d = 0.5 / d = -1, nibbles 0..15 in the low halves.
        let mut bytes = Vec::new();
        for d in [0x3800u16, 0xBC00] {
            bytes.extend_from_slice(&d.to_le_bytes());
            bytes.extend((0..16u8).map(|j| j | (j << 4)));
        }
        let out = dequantize_to_vec(GgmlType::Q4_0, &bytes).unwrap();
        for j in 0..16 {
            let q = j as f32 - 8.0;
            assert_eq!(out[j], q * 0.5);
            assert_eq!(out[j + 16], q * 0.5);
            assert_eq!(out[32 + j], -q);
            assert_eq!(out[48 + j], -q);
        }
    }

    #[test]
    fn partial_block_is_an_error() {
        let err = dequantize_to_vec(GgmlType::Q4_0, &[0u8; 19]).unwrap_err();
        assert!(matches!(
            err,
            Error::PartialBlock {
                dtype: GgmlType::Q4_0,
                len: 19,
                block_bytes: 18
            }
        ));
        let err = dequantize_to_vec(GgmlType::F32, &[0u8; 6]).unwrap_err();
        assert!(matches!(err, Error::PartialBlock { len: 6, .. }));
    }

    #[test]
    fn wrong_output_length_is_an_error_and_writes_nothing() {
        let bytes = [0u8; 2 * 34];
        for len in [0, 63, 65] {
            let mut out = vec![7f32; len];
            let err = dequantize(GgmlType::Q8_0, &bytes, &mut out).unwrap_err();
            assert!(matches!(err, Error::OutputLength { expected: 64, found, .. } if found == len));
            assert!(out.iter().all(|&x| x == 7.0));
        }
    }

    #[test]
    fn unsupported_types_are_errors() {
        for dtype in [
            GgmlType::IQ2_XXS,
            GgmlType::I32,
            GgmlType::MXFP4,
            GgmlType::TQ1_0,
        ] {
            assert!(!is_supported(dtype));
            let bytes = vec![0u8; dtype.type_size()];
            let err = dequantize_to_vec(dtype, &bytes).unwrap_err();
            assert!(matches!(err, Error::UnsupportedType { dtype: d } if d == dtype));
        }
    }
}
