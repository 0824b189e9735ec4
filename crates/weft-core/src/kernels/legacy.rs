//! Scalar reference dot products of the 32-element weight types with 8-bit activations.
//!
//! Contract shared by every `vec_dot_*` here and its AVX2 twin in `legacy_avx2`: `x` is one
//! weight row of `nb` whole blocks, `y` one activation row of `32 · nb` quants and `nb`
//! scales; the result is `Σ_blocks d_x · d_y · Σ_i q_x[i] · q_y[i]` (plus `m_x · s_y` for the
//! offset types), the integer sums exact, the `f32` sum in any order. The `vec_dots_*` variants
//! compute one weight row against 1 to 4 activation rows (the GEMM tile).
//!
//! Weight layouts are documented in [`crate::quant::blocks`].

use crate::quant::blocks::{read_f16, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES};

use super::quantize::{Q8_0Row, Q8_1Row, QK8};

/// The 32 quants of a 4-bit block (`qs` = 16 bytes): low nibbles first, then high nibbles.
#[inline]
fn nibbles(qs: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for (j, &b) in qs[..16].iter().enumerate() {
        q[j] = i32::from(b & 0x0F);
        q[j + 16] = i32::from(b >> 4);
    }
    q
}

/// The 32 quants of a 5-bit block: 4-bit nibbles plus bit `i` of the little-endian `qh`.
#[inline]
fn nibbles5(qh: &[u8], qs: &[u8]) -> [i32; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = nibbles(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) << 4) as i32;
    }
    q
}

/// `Σ (q[i] - offset) · y[i]` over one block.
#[inline]
fn idot(q: &[i32; 32], offset: i32, y: &[i8]) -> i32 {
    q.iter()
        .zip(y)
        .map(|(&q, &y)| (q - offset) * i32::from(y))
        .sum()
}

/// Q4_0 weights · Q8_0 activations.
pub fn vec_dot_q4_0_q8_0(x: &[u8], y: &Q8_0Row) -> f32 {
    let blocks = x.chunks_exact(Q4_0_BYTES).zip(y.qs.chunks_exact(QK8));
    let mut sum = 0f32;
    for ((bx, qy), &dy) in blocks.zip(y.d) {
        let isum = idot(&nibbles(&bx[2..18]), 8, qy);
        sum += isum as f32 * (read_f16(bx, 0) * dy);
    }
    sum
}

/// Q4_1 weights · Q8_1 activations (the minimum contributes `m_x · s_y` per block).
pub fn vec_dot_q4_1_q8_1(x: &[u8], y: &Q8_1Row) -> f32 {
    let blocks = x.chunks_exact(Q4_1_BYTES).zip(y.qs.chunks_exact(QK8));
    let mut sum = 0f32;
    for ((bx, qy), &[dy, sy]) in blocks.zip(y.ds) {
        let isum = idot(&nibbles(&bx[4..20]), 0, qy);
        sum += isum as f32 * (read_f16(bx, 0) * dy) + read_f16(bx, 2) * sy;
    }
    sum
}

/// Q5_0 weights · Q8_0 activations.
pub fn vec_dot_q5_0_q8_0(x: &[u8], y: &Q8_0Row) -> f32 {
    let blocks = x.chunks_exact(Q5_0_BYTES).zip(y.qs.chunks_exact(QK8));
    let mut sum = 0f32;
    for ((bx, qy), &dy) in blocks.zip(y.d) {
        let isum = idot(&nibbles5(&bx[2..6], &bx[6..22]), 16, qy);
        sum += isum as f32 * (read_f16(bx, 0) * dy);
    }
    sum
}

/// Q5_1 weights · Q8_1 activations.
pub fn vec_dot_q5_1_q8_1(x: &[u8], y: &Q8_1Row) -> f32 {
    let blocks = x.chunks_exact(Q5_1_BYTES).zip(y.qs.chunks_exact(QK8));
    let mut sum = 0f32;
    for ((bx, qy), &[dy, sy]) in blocks.zip(y.ds) {
        let isum = idot(&nibbles5(&bx[4..8], &bx[8..24]), 0, qy);
        sum += isum as f32 * (read_f16(bx, 0) * dy) + read_f16(bx, 2) * sy;
    }
    sum
}

/// Q8_0 weights · Q8_0 activations.
pub fn vec_dot_q8_0_q8_0(x: &[u8], y: &Q8_0Row) -> f32 {
    let blocks = x.chunks_exact(Q8_0_BYTES).zip(y.qs.chunks_exact(QK8));
    let mut sum = 0f32;
    for ((bx, qy), &dy) in blocks.zip(y.d) {
        let isum: i32 = bx[2..34]
            .iter()
            .zip(qy)
            .map(|(&q, &y)| i32::from(q as i8) * i32::from(y))
            .sum();
        sum += isum as f32 * (read_f16(bx, 0) * dy);
    }
    sum
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q4_0_q8_0`].
pub fn vec_dots_q4_0_q8_0(x: &[u8], ys: &[Q8_0Row], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q4_0_q8_0(x, y);
    }
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q4_1_q8_1`].
pub fn vec_dots_q4_1_q8_1(x: &[u8], ys: &[Q8_1Row], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q4_1_q8_1(x, y);
    }
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q5_0_q8_0`].
pub fn vec_dots_q5_0_q8_0(x: &[u8], ys: &[Q8_0Row], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q5_0_q8_0(x, y);
    }
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q5_1_q8_1`].
pub fn vec_dots_q5_1_q8_1(x: &[u8], ys: &[Q8_1Row], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q5_1_q8_1(x, y);
    }
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q8_0_q8_0`].
pub fn vec_dots_q8_0_q8_0(x: &[u8], ys: &[Q8_0Row], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q8_0_q8_0(x, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::kernels::quantize::Q8Batch;
    use crate::kernels::quantize::{scalar, ActFormat};
    use crate::kernels::testutil::{random_weights, Rng};
    use crate::quant::dequantize_to_vec;

    /// Checks a scalar dot against `dequantize(w) · dequantize(q8(x))` (same value up to
    /// `f32` rounding) and against `dequantize(w) · x` (within quantization error).
    fn check_against_dequantized(
        dtype: GgmlType,
        act: ActFormat,
        dot: &dyn Fn(&[u8], &Q8Batch) -> f32,
    ) {
        let mut rng = Rng::new(dtype.id() as u64);
        let cols = 256;
        for trial in 0..20 {
            let w = random_weights(&mut rng, dtype, 1, cols);
            let x = rng.f32s(cols, 1.0 + trial as f32);
            let mut batch = Q8Batch::default();
            batch.quantize(None, act, &x, 1, cols);
            let xd: Vec<f32> = match act {
                ActFormat::Q8_0 => {
                    let r = batch.q8_0(0);
                    r.qs.iter()
                        .enumerate()
                        .map(|(i, &q)| q as f32 * r.d[i / 32])
                        .collect()
                }
                _ => {
                    let r = batch.q8_1(0);
                    r.qs.iter()
                        .enumerate()
                        .map(|(i, &q)| q as f32 * r.ds[i / 32][0])
                        .collect()
                }
            };
            let wd = dequantize_to_vec(dtype, &w).unwrap();
            let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
            let fx: f64 = wd.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = wd
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let got = dot(&w, &batch) as f64;
            assert!(
                (got - exact).abs() <= 1e-4 * mag + 1e-5,
                "{dtype}: {got} vs {exact}"
            );
            assert!(
                (got - fx).abs() <= 0.02 * mag + 1e-4,
                "{dtype}: {got} vs f32 {fx}"
            );
        }
    }

    #[test]
    fn scalar_dots_match_dequantized() {
        use ActFormat::*;
        check_against_dequantized(GgmlType::Q4_0, Q8_0, &|w, b| {
            vec_dot_q4_0_q8_0(w, &b.q8_0(0))
        });
        check_against_dequantized(GgmlType::Q4_1, Q8_1, &|w, b| {
            vec_dot_q4_1_q8_1(w, &b.q8_1(0))
        });
        check_against_dequantized(GgmlType::Q5_0, Q8_0, &|w, b| {
            vec_dot_q5_0_q8_0(w, &b.q8_0(0))
        });
        check_against_dequantized(GgmlType::Q5_1, Q8_1, &|w, b| {
            vec_dot_q5_1_q8_1(w, &b.q8_1(0))
        });
        check_against_dequantized(GgmlType::Q8_0, Q8_0, &|w, b| {
            vec_dot_q8_0_q8_0(w, &b.q8_0(0))
        });
    }

    #[test]
    fn q8_1_sum_term_matches_dequantized_min() {
        // A block whose quants are all zero: the dot is exactly m · s.
        let mut w = vec![0u8; Q4_1_BYTES];
        w[2..4].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        let x: Vec<f32> = (0..32).map(|i| i as f32 / 8.0).collect();
        let (mut qs, mut ds) = (vec![0i8; 32], vec![[0f32; 2]; 1]);
        scalar::quantize_row_q8_1(&x, &mut qs, &mut ds);
        let got = vec_dot_q4_1_q8_1(&w, &Q8_1Row { qs: &qs, ds: &ds });
        assert_eq!(got, 0.5 * ds[0][1]);
    }
}
