//! The seeded random generator behind every sampler.

/// SplitMix64's increment (2⁶⁴ / φ).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One step of SplitMix64: the value after state `z` (which the step advances by
/// 2⁶⁴ / φ). A good 64-bit mix: neighbouring inputs give unrelated outputs.
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small, fast, seedable random generator (xoshiro256**, seeded through SplitMix64).
///
/// The whole output stream is determined by the seed and is the same on every platform and in
/// every build: samplers draw from it in a documented way (one [`Rng::next_f32`] per
/// non-greedy sample), so a seed reproduces a generation token for token.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        // SplitMix64's stream from the seed spreads it over the state.
        let at = |k: u64| splitmix64(seed.wrapping_add(k.wrapping_mul(GOLDEN_GAMMA)));
        Rng {
            s: [at(0), at(1), at(2), at(3)],
        }
    }

    /// The generator's whole state (for saving a session).
    pub fn state(&self) -> [u64; 4] {
        self.s
    }

    /// A generator that continues from a saved [`Rng::state`].
    pub fn from_state(s: [u64; 4]) -> Rng {
        Rng { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A uniform float in `[0, 1)` (the top 24 bits of [`Rng::next_u64`]).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_streams_repeat_and_differ() {
        let stream = |seed| -> Vec<u64> {
            let mut r = Rng::new(seed);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(stream(7), stream(7));
        assert_ne!(stream(7), stream(8));
    }

    #[test]
    fn stream_is_pinned() {
        // Pins the output stream: changing the generator would silently change every seeded
        // generation. Seed 0 through SplitMix64 gives the state below (SplitMix64's published
        // first outputs for seed 0), and xoshiro256**'s first output is computed from s[1].
        let mut r = Rng::new(0);
        assert_eq!(
            r.s,
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F,
                0xF88B_B8A8_724C_81EC
            ]
        );
        let expected = 0x6E78_9E6A_A1B9_65F4u64
            .wrapping_mul(5)
            .rotate_left(7)
            .wrapping_mul(9);
        assert_eq!(r.next_u64(), expected);
        let f = r.next_f32();
        assert!((0.0..1.0).contains(&f));
    }
}
