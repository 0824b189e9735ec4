//! The noise of zeroth-order (evolution-strategies) passes: `ε(seed)`, one standard-normal
//! value per adapter weight, generated on the fly from the seed and never stored.
//!
//! A pass with `zo_seed(seed, sigma)` runs with every `A` and `B` weight `w` of its adapters
//! replaced by `w + sigma · ε`, where for the weight at flat index `j` (row-major, in the
//! PEFT layout: `A` is `rank × in`, `B` is `out × rank`) of the projection with key `k`
//! (`layer · 8 + p`, `p` = 0 q, 1 k, 2 v, 3 o, 4 gate, 5 up, 6 down; see [`super::key`]):
//!
//! ```text
//! splitmix64(z):  z += 0x9E3779B97F4A7C15
//!                 z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//!                 z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//!                 return z ^ (z >> 31)                        (all mod 2⁶⁴)
//! c  = (k << 33) | (m << 32) | j           m = 0 for A, 1 for B
//! h1 = splitmix64(seed ^ splitmix64(c));  h2 = splitmix64(h1)
//! u1 = ((h1 >> 11) + 1) / 2⁵³              in (0, 1]
//! u2 = (h2 >> 11) / 2⁵³                    in [0, 1)
//! ε  = sqrt(-2 ln u1) · cos(2π u2)          (Box–Muller, computed in f64, then rounded to f32)
//! ```
//!
//! A Python trainer reproduces it with integer arithmetic modulo 2⁶⁴ (e.g. numpy `uint64`).
//! Negative `sigma` gives the antithetic pair of the same `ε`.

pub use crate::sampling::rng::splitmix64;

/// `ε` for weight `j` of matrix `m` (0 = A, 1 = B) of projection `key`, under `seed`.
pub fn epsilon(seed: u64, key: u32, m: u32, j: usize) -> f32 {
    let c = (u64::from(key) << 33) | (u64::from(m & 1) << 32) | (j as u64 & 0xFFFF_FFFF);
    let h1 = splitmix64(seed ^ splitmix64(c));
    let h2 = splitmix64(h1);
    let u1 = ((h1 >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let u2 = (h2 >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epsilon_is_standard_normal_and_depends_on_every_input() {
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|j| f64::from(epsilon(7, 3, 0, j))).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
        let e = epsilon(7, 3, 0, 5);
        assert_eq!(e, epsilon(7, 3, 0, 5));
        for other in [
            epsilon(8, 3, 0, 5),
            epsilon(7, 4, 0, 5),
            epsilon(7, 3, 1, 5),
            epsilon(7, 3, 0, 6),
        ] {
            assert_ne!(e, other);
        }
        // A value a Python port must reproduce (splitmix64 of 0 is the published first output
        // of SplitMix64 seeded with 0).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }
}
