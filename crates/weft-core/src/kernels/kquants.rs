//! Scalar reference dot products of the k-quant weight types with Q8_K activations.
//!
//! Contract shared by every `vec_dot_*` here and its AVX2 twin in `kquants_avx2`: `x` is one
//! weight row of `nb` whole 256-element super-blocks, `y` one Q8_K row of `256 · nb` quants,
//! `nb` scales and `16 · nb` sums. Per super-block the integer sums over each sub-block are
//! exact and scaled in `f32`:
//!
//! - Q4_K / Q5_K: `d_y · (d · Σ_s sc[s] · Σ_i q·y  −  dmin · Σ_s mn[s] · Σ_i y)`, where
//!   `Σ_i y` over a 32-element sub-block comes from the activation's `bsums`;
//! - Q6_K: `d_y · d · Σ_s sc[s] · Σ_i (q − 32)·y`.
//!
//! The `vec_dots_*` variants compute one weight row against 1 to 4 activation rows.
//! Weight layouts are documented in [`crate::quant::blocks`].

use crate::quant::blocks::{k4_scale_min, read_f16, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};

use super::quantize::{Q8KRow, QK_K};

/// Q4_K or Q5_K (`q5` adds the 5th bit) weights · Q8_K activations.
fn dot_k4(x: &[u8], y: &Q8KRow, q5: bool) -> f32 {
    let bytes = if q5 { Q5_K_BYTES } else { Q4_K_BYTES };
    let blocks = x.chunks_exact(bytes).zip(y.qs.chunks_exact(QK_K));
    let mut sum = 0f32;
    for (b, ((bx, qy), &dy)) in blocks.zip(y.d).enumerate() {
        let bsums = &y.bsums[16 * b..16 * b + 16];
        let (qh, qs) = if q5 {
            (&bx[16..48], &bx[48..176])
        } else {
            (&bx[0..0], &bx[16..144])
        };
        let (mut isum, mut msum) = (0i32, 0i32);
        for s in 0..8 {
            let (sc, mn) = k4_scale_min(&bx[4..16], s);
            let (p, n) = (s / 2, s % 2);
            let mut sub = 0i32;
            for l in 0..32 {
                let mut q = i32::from((qs[32 * p + l] >> (4 * n)) & 0x0F);
                if q5 {
                    q |= i32::from((qh[l] >> s) & 1) << 4;
                }
                sub += q * i32::from(qy[32 * s + l]);
            }
            isum += i32::from(sc) * sub;
            msum += i32::from(mn) * (i32::from(bsums[2 * s]) + i32::from(bsums[2 * s + 1]));
        }
        let d = dy * read_f16(bx, 0);
        let dmin = dy * read_f16(bx, 2);
        sum += d * isum as f32 - dmin * msum as f32;
    }
    sum
}

/// Q4_K weights · Q8_K activations.
pub fn vec_dot_q4_k_q8_k(x: &[u8], y: &Q8KRow) -> f32 {
    dot_k4(x, y, false)
}

/// Q5_K weights · Q8_K activations.
pub fn vec_dot_q5_k_q8_k(x: &[u8], y: &Q8KRow) -> f32 {
    dot_k4(x, y, true)
}

/// Q6_K weights · Q8_K activations.
pub fn vec_dot_q6_k_q8_k(x: &[u8], y: &Q8KRow) -> f32 {
    let blocks = x.chunks_exact(Q6_K_BYTES).zip(y.qs.chunks_exact(QK_K));
    let mut sum = 0f32;
    for ((bx, qy), &dy) in blocks.zip(y.d) {
        let (ql, qh, scales) = (&bx[0..128], &bx[128..192], &bx[192..208]);
        let mut isum = 0i32;
        for i in 0..QK_K {
            let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
            let low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
            let high = (qh[32 * h + l] >> (2 * k)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            isum += i32::from(scales[i / 16] as i8) * q * i32::from(qy[i]);
        }
        sum += dy * read_f16(bx, 208) * isum as f32;
    }
    sum
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q4_k_q8_k`].
pub fn vec_dots_q4_k_q8_k(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q4_k_q8_k(x, y);
    }
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q5_k_q8_k`].
pub fn vec_dots_q5_k_q8_k(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q5_k_q8_k(x, y);
    }
}

/// One weight row against up to 4 activation rows, by repeated [`vec_dot_q6_k_q8_k`].
pub fn vec_dots_q6_k_q8_k(x: &[u8], ys: &[Q8KRow], out: &mut [f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o = vec_dot_q6_k_q8_k(x, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::kernels::quantize::{ActFormat, Q8Batch};
    use crate::kernels::testutil::{random_weights, Rng};
    use crate::quant::dequantize_to_vec;

    #[test]
    fn scalar_dots_match_dequantized() {
        type Dot = fn(&[u8], &Q8KRow) -> f32;
        let kernels: [(GgmlType, Dot); 3] = [
            (GgmlType::Q4_K, vec_dot_q4_k_q8_k),
            (GgmlType::Q5_K, vec_dot_q5_k_q8_k),
            (GgmlType::Q6_K, vec_dot_q6_k_q8_k),
        ];
        for (dtype, dot) in kernels {
            let mut rng = Rng::new(11 + dtype.id() as u64);
            for trial in 0..10 {
                let cols = 256 * (1 + trial % 3);
                let w = random_weights(&mut rng, dtype, 1, cols);
                let x = rng.f32s(cols, 1.0 + trial as f32);
                let mut batch = Q8Batch::default();
                batch.quantize(None, ActFormat::Q8K, &x, 1, cols);
                let r = batch.q8_k(0);
                let xd: Vec<f32> = (0..cols).map(|i| r.qs[i] as f32 * r.d[i / 256]).collect();
                let wd = dequantize_to_vec(dtype, &w).unwrap();
                let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                let fx: f64 = wd.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wd
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = dot(&w, &r) as f64;
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
    }
}
