//! Test helpers: a tiny deterministic RNG and random weight blocks with sane scales.

use half::f16;

use crate::gguf::GgmlType;

/// xorshift64*: deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[-scale, scale)`.
    pub fn f32(&mut self, scale: f32) -> f32 {
        let u = (self.u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * scale
    }

    pub fn f32s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// `rows × cols` weights of `dtype`: random quants, scales in a realistic range.
pub fn random_weights(rng: &mut Rng, dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    use GgmlType::*;
    let n = rows * cols;
    match dtype {
        F32 => {
            return rng
                .f32s(n, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        }
        F16 => {
            let v = rng.f32s(n, 1.0);
            return v
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
        }
        BF16 => {
            let v = rng.f32s(n, 1.0);
            return v
                .iter()
                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect();
        }
        _ => {}
    }
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    let mut data = rng.bytes(n / bs * ts);
    for b in data.chunks_exact_mut(ts) {
        let d = 0.002 + rng.f32(0.001).abs() * 20.0;
        match dtype {
            Q4_0 | Q5_0 | Q8_0 | Q4_K | Q5_K => put_f16(b, 0, d),
            Q4_1 | Q5_1 => {
                put_f16(b, 0, d);
                put_f16(b, 2, rng.f32(0.1));
            }
            Q6_K => put_f16(b, 208, d / 4.0),
            _ => panic!("no random generator for {dtype}"),
        }
        if matches!(dtype, Q4_K | Q5_K) {
            put_f16(b, 2, d / 2.0); // dmin
        }
    }
    data
}
