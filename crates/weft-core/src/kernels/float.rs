//! Scalar reference kernels on plain floating-point data: the f16 helpers of attention and
//! the dot products of F32, F16 and BF16 weight rows (with `f32` activations).
//!
//! Weight rows arrive as little-endian bytes straight from the GGUF file (no alignment); the
//! AVX2 twins in `float_avx2` have the same names and contracts.

use half::f16;

/// `Σ a[i] · b[i]` (lengths already checked equal).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// `Σ a[i] · b[i]` for an f16 `b` (lengths already checked equal).
pub fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x * y.to_f32()).sum()
}

/// `y += alpha · x` for an f16 `x` (lengths already checked equal).
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x.to_f32();
    }
}

/// `dst = f16(src)`, round to nearest even (lengths already checked equal).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s);
    }
}

/// [`f32_to_f16`] into little-endian bytes (`2 · src.len()` of them).
pub fn f32_to_f16_bytes(src: &[f32], dst: &mut [u8]) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f16::from_f32(s).to_le_bytes());
    }
}

/// An F32 weight row (`4 · a.len()` little-endian bytes) · `a`.
pub fn vec_dot_f32_bytes(x: &[u8], a: &[f32]) -> f32 {
    assert_eq!(x.len(), 4 * a.len(), "shape mismatch");
    x.chunks_exact(4)
        .zip(a)
        .map(|(w, &v)| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * v)
        .sum()
}

/// An F16 weight row (`2 · a.len()` little-endian bytes) · `a`.
pub fn vec_dot_f16_bytes(x: &[u8], a: &[f32]) -> f32 {
    assert_eq!(x.len(), 2 * a.len(), "shape mismatch");
    x.chunks_exact(2)
        .zip(a)
        .map(|(w, &v)| f16::from_le_bytes([w[0], w[1]]).to_f32() * v)
        .sum()
}

/// A BF16 weight row (`2 · a.len()` little-endian bytes) · `a`.
pub fn vec_dot_bf16_bytes(x: &[u8], a: &[f32]) -> f32 {
    assert_eq!(x.len(), 2 * a.len(), "shape mismatch");
    x.chunks_exact(2)
        .zip(a)
        .map(|(w, &v)| f32::from_bits(u32::from(u16::from_le_bytes([w[0], w[1]])) << 16) * v)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::Rng;

    #[test]
    fn byte_rows_match_typed_dots() {
        let mut rng = Rng::new(9);
        let a = rng.f32s(37, 1.0);
        let b = rng.f32s(37, 1.0);
        let h: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
        let f32_bytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16_bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(vec_dot_f32_bytes(&f32_bytes, &a), dot_f32(&a, &b));
        assert_eq!(vec_dot_f16_bytes(&f16_bytes, &a), dot_f32_f16(&a, &h));
        // bf16 of an f16-representable value with a short mantissa is exact.
        let bf_bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        assert_eq!(vec_dot_bf16_bytes(&bf_bytes, &[2.0, 0.5]), 2.0);
    }

    #[test]
    fn axpy_and_convert() {
        let x = [f16::from_f32(1.0), f16::from_f32(-0.5)];
        let mut y = [1.0f32, 1.0];
        axpy_f16(&mut y, 2.0, &x);
        assert_eq!(y, [3.0, 0.0]);
        let mut d = [f16::ZERO; 2];
        f32_to_f16(&[1.0 + 1.0 / 4096.0, 65520.0], &mut d);
        assert_eq!(d[0].to_f32(), 1.0); // ties to even
        assert!(d[1].is_infinite());
    }
}
