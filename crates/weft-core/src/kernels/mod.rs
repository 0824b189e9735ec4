//! Compute kernels: quantized matrix multiplication, activation quantization and the f16 helpers
//! of attention.
//!
//! [`matmul`] multiplies a weight [`Matrix`] stored as GGUF stores it (one of the ggml block
//! types) by a batch of `f32` activation rows. As in ggml, the activations are first quantized
//! to the 8-bit format that pairs with the weight type ([`quantize`]), then every output is an
//! integer dot product per block scaled in `f32`. Each kernel exists as a scalar reference
//! (always built, the test oracle, ggml-style names such as `vec_dot_q4_1_q8_1`) and, on
//! x86-64, an AVX2 + FMA + F16C variant with the same name and contract, chosen once at run time
//! ([`simd_level`]).
//!
//! Key design decision: several tokens use a tile kernel that unpacks each weight block once
//! and multiplies it with up to [`TILE_TOKENS`] activation rows held in registers, over
//! cache-sized groups of rows, so batched decode and prefill reuse each weight byte many times;
//! one token (a memory-bound GEMV that streams each weight row once) is the same tile with a
//! single row. Each thread walks a contiguous share of the chunks of output rows, then takes
//! over halves of the others' ([`crate::threadpool::ThreadPool::run_chunks`]), so a slow
//! (descheduled) thread simply does fewer chunks.
//!
//! Second decision: the weight types of the models we run (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)
//! are repacked at load time into groups of 8 rows interleaved block by block
//! ([`interleaved`], [`Layout::Interleaved8`]): one vector then holds 4 quants of each of 8
//! rows, so a `maddubs` with 4 broadcast activation bytes advances 8 dot products at once and
//! the scaling, conversion and FMA of a block serve 8 rows (2–2.7× faster GEMM, also a faster
//! GEMV). Embedding tables stay in the file's row layout, which lookups need.
//!
//! Determinism: within one kernel set, an output is a function of its weight row and its
//! activation row alone, bit for bit — not of the batch size, the token's place in the batch or
//! a tile, or the thread count. Every kernel computes a token's result with the same sequence
//! of floating-point operations whatever the tile size (in the AVX2 kernels, two accumulators
//! per token taking alternate blocks, one final reduction), and activations are quantized row
//! by row. This matters more than the size of the differences suggests: the next matmul
//! quantizes its input to 8 bits, so a 1-ulp change can flip a rounding and the logits of a
//! sequence would depend on what else was batched with it.

pub mod attention;
pub mod bandwidth;
mod cpu;
mod float;
pub mod gemm_f32;
pub mod gemm_i16;
pub mod interleaved;
mod interleaved_k;
mod interleaved_q8;
mod kquants;
mod legacy;
pub mod math;
mod matmul;
pub mod quantize;

#[cfg(target_arch = "x86_64")]
mod attention_avx2;
#[cfg(target_arch = "x86_64")]
mod attention_avx512;
#[cfg(target_arch = "x86_64")]
mod float_avx2;
#[cfg(target_arch = "x86_64")]
mod interleaved_avx2;
#[cfg(target_arch = "x86_64")]
mod interleaved_avx512;
#[cfg(target_arch = "x86_64")]
mod kquants_avx2;
#[cfg(target_arch = "x86_64")]
mod legacy_avx2;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
pub(crate) mod bench;
#[cfg(test)]
pub(crate) mod testutil;

use std::sync::OnceLock;

use half::f16;

use crate::gguf::GgmlType;
use crate::{Error, Result};

pub use cpu::{one_token_pairs, weight_prefetch};
pub use matmul::{matmul, matmul_split, MatmulScratch, MAX_SPLITS, TILE_TOKENS};
pub use quantize::{Q8KRow, Q8_0Row, Q8_1Row};

/// The instruction sets the kernels can use, best first.
///
/// The integer tiles exist once per x86 set, stamped from one generic body with the set's
/// u8 × i8 dot-product primitive (`x86::Isa`): AVX2's `maddubs` + `madd`, or VNNI's
/// `vpdpbusd`. Integer sums are exact either way, so every x86 set gives the same bits. The
/// `avx512` level also runs attention's scores and weighted sums on 512-bit registers, and the
/// interleaved tiles two row groups at a time (`interleaved_avx512`); the other float helpers
/// are AVX2 on all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// AVX-512 F/BW/VL/VNNI (Intel Ice Lake, Sapphire Rapids and later Xeons; AMD Zen 4 and
    /// later): the tiles use the EVEX `vpdpbusd` (the interleaved ones on 512-bit registers,
    /// two row groups at a time, except one-token products where [`one_token_pairs`] says
    /// no), and attention 512-bit float kernels.
    Avx512,
    /// AVX-VNNI (Intel Alder Lake and later clients): the tiles use the VEX `vpdpbusd`.
    AvxVnni,
    /// x86-64 with AVX2, FMA and F16C (Haswell, Zen 1 and later).
    Avx2,
    /// The portable scalar reference kernels.
    Scalar,
}

impl SimdLevel {
    /// Every level, best first.
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Avx512,
        SimdLevel::AvxVnni,
        SimdLevel::Avx2,
        SimdLevel::Scalar,
    ];

    /// The name `WEFT_KERNELS` takes and `weft bench` prints.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Avx512 => "avx512",
            SimdLevel::AvxVnni => "avxvnni",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Scalar => "scalar",
        }
    }

    /// Whether this CPU can run the level's kernels.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            match self {
                SimdLevel::Avx512 => {
                    avx2 && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
                SimdLevel::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
                SimdLevel::Avx2 => avx2,
                SimdLevel::Scalar => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == SimdLevel::Scalar
        }
    }

    /// Whether the level includes AVX2, FMA and F16C (every level but scalar), so that the
    /// AVX2 float kernels may run.
    #[inline]
    pub fn has_avx2(self) -> bool {
        self != SimdLevel::Scalar
    }

    /// The levels this CPU can run, best first (the tests compare them with each other).
    pub fn available_levels() -> Vec<SimdLevel> {
        SimdLevel::ALL
            .into_iter()
            .filter(|l| l.available())
            .collect()
    }
}

/// The kernel variant this process uses, chosen once: the best the CPU supports, unless the
/// environment variable `WEFT_KERNELS` names one (`scalar`, `avx2`, `avxvnni` or `avx512`,
/// where the CPU has it; for comparisons). A value that names no variant this CPU can run is
/// ignored with a warning on stderr, and the detected one is used.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let detected = detect();
        match std::env::var("WEFT_KERNELS") {
            Err(_) => detected,
            Ok(v) => match forced(&v, SimdLevel::available) {
                Ok(level) => level,
                Err(why) => {
                    eprintln!(
                        "weft: WEFT_KERNELS={v:?} ignored: {why}; using {}",
                        detected.name()
                    );
                    detected
                }
            },
        }
    })
}

/// The variant `WEFT_KERNELS=value` asks for, if this CPU can run it (`available`).
fn forced(
    value: &str,
    available: impl Fn(SimdLevel) -> bool,
) -> std::result::Result<SimdLevel, String> {
    let wanted = value.trim().to_ascii_lowercase();
    let Some(level) = SimdLevel::ALL.into_iter().find(|l| l.name() == wanted) else {
        return Err("the choices are scalar, avx2, avxvnni, avx512".into());
    };
    if available(level) {
        Ok(level)
    } else {
        let needs = match level {
            SimdLevel::Avx512 => "AVX-512 F, BW, VL and VNNI",
            SimdLevel::AvxVnni => "AVX-VNNI",
            _ => "AVX2, FMA and F16C",
        };
        Err(format!("this CPU lacks {needs}"))
    }
}

/// The x86 vector extensions the CPU has beyond AVX2 that kernels could use (AVX-512
/// foundation and VNNI, AVX-VNNI), for `weft bench` to print beside the variant in use.
pub fn cpu_extensions() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            found.push("avx512f");
        }
        if is_x86_feature_detected!("avx512bw") {
            found.push("avx512bw");
        }
        if is_x86_feature_detected!("avx512vl") {
            found.push("avx512vl");
        }
        if is_x86_feature_detected!("avx512vnni") {
            found.push("avx512vnni");
        }
        if is_x86_feature_detected!("avxvnni") {
            found.push("avxvnni");
        }
    }
    found
}

/// The best level the CPU supports, ignoring the environment.
fn detect() -> SimdLevel {
    SimdLevel::ALL
        .into_iter()
        .find(|l| l.available())
        .unwrap_or(SimdLevel::Scalar)
}

/// Whether the AVX2 float kernels may run (cheap: one atomic load after the first call).
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn use_avx2() -> bool {
    simd_level().has_avx2()
}

/// Whether the AVX-512 float kernels (attention's scores and weighted sums) may run: the
/// `avx512` level, which implies AVX-512 F besides AVX2, FMA and F16C.
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn use_avx512() -> bool {
    simd_level() == SimdLevel::Avx512
}

/// A weight matrix: `rows` rows of `cols` elements (ggml `ne[0] = cols`, `ne[1] = rows`),
/// each row a whole number of `dtype` blocks, as GGUF stores it or [interleaved](Layout).
#[derive(Clone, Copy)]
pub struct Matrix<'a> {
    /// Element type of the weights.
    pub dtype: GgmlType,
    /// The raw bytes: `rows` rows of `dtype.row_bytes(cols)` bytes, or for
    /// [`Layout::Interleaved8`] `rows / 8` groups of [`interleaved::group_bytes`].
    pub data: &'a [u8],
    /// Number of rows (outputs of [`matmul`]).
    pub rows: usize,
    /// Number of columns (inputs of [`matmul`]).
    pub cols: usize,
    /// How the blocks are arranged.
    pub layout: Layout,
}

/// The arrangement of a [`Matrix`]'s blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// GGUF's: row after row.
    Rows,
    /// Groups of 8 rows interleaved block by block ([`interleaved`]; Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q4_K, Q6_K, Q8_0), made by [`interleaved::repack`] for a faster GEMM.
    Interleaved8,
}

impl std::fmt::Debug for Matrix<'_> {
    /// Type and shape only (the data can be hundreds of megabytes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Matrix({} {}x{} {:?})",
            self.dtype, self.rows, self.cols, self.layout
        )
    }
}

/// The weight types [`matmul`] handles.
pub const MATMUL_TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

impl<'a> Matrix<'a> {
    /// A matrix view, checked once so that the kernels need no checks at run time.
    ///
    /// Errors: [`Error::UnsupportedType`] for a type not in [`MATMUL_TYPES`];
    /// [`Error::BadShape`] when `cols` is not a positive multiple of the block size or
    /// `data.len()` is not exactly `rows` rows.
    pub fn new(dtype: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Matrix<'a>> {
        Self::checked(dtype, data, rows, cols, Layout::Rows)
    }

    /// A view of weights [`interleaved::repack`]ed from the row layout.
    ///
    /// Errors: as [`Matrix::new`]; [`Error::UnsupportedType`] for a type that cannot be
    /// interleaved, [`Error::BadShape`] when `rows` is not a multiple of 8.
    pub fn interleaved(
        dtype: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix<'a>> {
        Self::checked(dtype, data, rows, cols, Layout::Interleaved8)
    }

    /// The checks of [`Matrix::new`] and [`Matrix::interleaved`].
    fn checked(
        dtype: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
        layout: Layout,
    ) -> Result<Matrix<'a>> {
        let packed = layout == Layout::Interleaved8;
        let supported = if packed {
            interleaved::supports(dtype)
        } else {
            MATMUL_TYPES.contains(&dtype)
        };
        if !supported {
            return Err(Error::UnsupportedType { dtype });
        }
        let bad = |reason: &'static str| Error::BadShape {
            name: "matmul weight".to_string(),
            shape: vec![cols as u64, rows as u64],
            dtype,
            reason,
        };
        if cols == 0 || !cols.is_multiple_of(dtype.block_size()) {
            return Err(bad("columns must be a positive multiple of the block size"));
        }
        let len = if packed {
            if !rows.is_multiple_of(interleaved::GROUP_ROWS) {
                return Err(bad("interleaved rows must be a multiple of 8"));
            }
            (rows / interleaved::GROUP_ROWS).checked_mul(interleaved::group_bytes(dtype, cols))
        } else {
            rows.checked_mul(cols / dtype.block_size() * dtype.type_size())
        };
        if len != Some(data.len()) {
            return Err(bad("data length does not match the shape"));
        }
        Ok(Matrix {
            dtype,
            data,
            rows,
            cols,
            layout,
        })
    }

    /// Bytes of one row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.type_size()
    }

    /// The bytes of row `r`.
    ///
    /// # Panics
    /// If `r >= rows`, or the matrix is not in the row layout.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert_eq!(self.layout, Layout::Rows, "rows of an interleaved matrix");
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// Row `r` of `w` dequantized into `out` (an embedding lookup), from the row layout or an
/// interleaved Q8_0 matrix (a tied LM head, [`interleaved::supports_lookup`]).
///
/// # Panics
/// If `r >= w.rows`, `out.len() != w.cols`, or `w` is interleaved in a type without lookups.
pub fn dequantize_row(w: &Matrix, r: usize, out: &mut [f32]) {
    assert!(r < w.rows, "row {r} out of {} rows", w.rows);
    assert_eq!(out.len(), w.cols, "output length must equal the row length");
    if w.layout == Layout::Interleaved8 {
        assert!(
            interleaved::supports_lookup(w.dtype),
            "rows of an interleaved {} matrix cannot be looked up",
            w.dtype
        );
        return interleaved_q8::dequantize_row(w.data, r, out);
    }
    crate::quant::dequantize(w.dtype, w.row(r), out)
        .expect("Matrix::new admits only types with a dequantizer");
}

/// `Σ a[i] · b[i]` for an `f32` vector and an `f16` vector (attention scores over an f16 KV
/// cache). Accumulates in `f32`.
///
/// # Panics
/// If the lengths differ.
pub fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths are equal.
        return unsafe { float_avx2::dot_f32_f16(a, b) };
    }
    float::dot_f32_f16(a, b)
}

/// `y += alpha · x` for an `f16` vector `x` (attention's weighted sum of f16 values).
///
/// # Panics
/// If the lengths differ.
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths are equal.
        return unsafe { float_avx2::axpy_f16(y, alpha, x) };
    }
    float::axpy_f16(y, alpha, x)
}

/// Converts `src` to `f16` (round to nearest even, as F16C and ggml do) into `dst`.
///
/// # Panics
/// If the lengths differ.
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths are equal.
        return unsafe { float_avx2::f32_to_f16(src, dst) };
    }
    float::f32_to_f16(src, dst)
}

/// [`f32_to_f16`] into little-endian bytes, as the KV cache stores an f16 row.
///
/// # Panics
/// If `dst.len() != 2 * src.len()`.
pub fn f32_to_f16_bytes(src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        2 * src.len(),
        dst.len(),
        "f32_to_f16_bytes: length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths match.
        return unsafe { float_avx2::f32_to_f16_bytes(src, dst) };
    }
    float::f32_to_f16_bytes(src, dst)
}

/// `Σ a[i] · b[i]` in `f32`.
///
/// # Panics
/// If the lengths differ.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths are equal.
        return unsafe { float_avx2::dot_f32(a, b) };
    }
    float::dot_f32(a, b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn weft_kernels_values() {
        use super::{forced, SimdLevel};
        let avx2_only = |l: SimdLevel| matches!(l, SimdLevel::Avx2 | SimdLevel::Scalar);
        let scalar_only = |l: SimdLevel| l == SimdLevel::Scalar;
        let all = |_: SimdLevel| true;
        assert_eq!(forced("scalar", avx2_only), Ok(SimdLevel::Scalar));
        assert_eq!(forced(" AVX2 ", avx2_only), Ok(SimdLevel::Avx2));
        assert!(forced("avx2", scalar_only).is_err());
        assert!(forced("avx512", avx2_only).is_err());
        assert!(forced("avxvnni", avx2_only).is_err());
        assert_eq!(forced("avx512", all), Ok(SimdLevel::Avx512));
        assert_eq!(forced("AvxVnni", all), Ok(SimdLevel::AvxVnni));
        assert!(forced("neon", all).is_err());
    }

    use super::*;

    #[test]
    fn matrix_new_validates() {
        let data = vec![0u8; 2 * 20 * 3];
        let m = Matrix::new(GgmlType::Q4_1, &data, 3, 64).unwrap();
        assert_eq!(m.row_bytes(), 40);
        assert_eq!(m.row(2).len(), 40);
        assert!(matches!(
            Matrix::new(GgmlType::Q4_1, &data, 3, 48),
            Err(Error::BadShape { .. })
        ));
        assert!(matches!(
            Matrix::new(GgmlType::Q4_1, &data, 2, 64),
            Err(Error::BadShape { .. })
        ));
        assert!(matches!(
            Matrix::new(GgmlType::Q2_K, &data, 1, 256),
            Err(Error::UnsupportedType { .. })
        ));
        assert!(Matrix::new(GgmlType::F32, &data, 30, 1).is_ok());
    }

    #[test]
    fn dequantize_row_matches_quant() {
        let mut rng = testutil::Rng::new(3);
        let data = testutil::random_weights(&mut rng, GgmlType::Q6_K, 3, 512);
        let m = Matrix::new(GgmlType::Q6_K, &data, 3, 512).unwrap();
        let all = crate::quant::dequantize_to_vec(GgmlType::Q6_K, &data).unwrap();
        let mut out = vec![0f32; 512];
        dequantize_row(&m, 1, &mut out);
        assert_eq!(out, all[512..1024]);
    }
}
