//! Token selection from logits, logit transforms and the probability math behind probes.
//!
//! - [`rng`]: our own seedable generator ([`Rng`], xoshiro256** seeded through SplitMix64), so
//!   a seed gives the same tokens on every platform and in every build.
//! - [`sampler`]: [`argmax`], [`sample_temperature`] and the [`Sampler`] chain (top-k, top-p,
//!   min-p on the probabilities at the temperature), drawing exactly one random number per
//!   non-greedy sample.
//! - [`penalties`]: repetition / presence / frequency [`Penalties`] and logit bias, applied to a
//!   logits row in place before sampling.
//! - [`probs`]: numerically stable [`log_softmax`], [`logprobs_of`], [`entropy`] and
//!   [`distribution`] (top-k probabilities at a temperature).
//!
//! Conventions shared by every function here: a logits row is one `f32` per vocabulary entry,
//! token ids index it; a NaN logit is treated as `-inf` (the token can never be chosen, nothing
//! panics); ties between equal logits or probabilities go to the lower id.

pub mod penalties;
pub mod probs;
pub mod rng;
pub mod sampler;

pub use penalties::{apply_logit_bias, validate_logit_bias, Penalties};
pub use probs::{distribution, entropy, log_softmax, logprobs_of};
pub use rng::Rng;
pub use sampler::{argmax, sample_temperature, SampleScratch, Sampler};

use std::cmp::Ordering;

/// A sampling, penalty or logit-bias parameter that cannot be used; returned by the `validate`
/// functions of this module. Messages are written for the user who passed the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SamplerError {
    /// A temperature that is NaN, infinite or negative.
    #[error("temperature must be a finite number >= 0, got {temperature}")]
    Temperature {
        /// The temperature given.
        temperature: f32,
    },
    /// A top-p outside `(0, 1]`.
    #[error("top-p must be in (0, 1], got {p}")]
    TopP {
        /// The top-p given.
        p: f32,
    },
    /// A min-p outside `[0, 1]`.
    #[error("min-p must be in [0, 1], got {p}")]
    MinP {
        /// The min-p given.
        p: f32,
    },
    /// A top-k of zero.
    #[error("top-k must be at least 1")]
    TopK,
    /// Sampling from an empty vocabulary.
    #[error("cannot sample from an empty vocabulary")]
    EmptyVocabulary,
    /// A repetition penalty that is not a finite number > 0, or a presence / frequency
    /// penalty that is not finite.
    #[error("{name} penalty must be {expected}, got {value}")]
    Penalty {
        /// Which penalty: "repetition", "presence" or "frequency".
        name: &'static str,
        /// What the value must be.
        expected: &'static str,
        /// The value given.
        value: f32,
    },
    /// A logit bias for a token id past the end of the vocabulary.
    #[error("logit bias for token id {id}, which is out of the vocabulary (size {vocab_size})")]
    BiasTokenOutOfRange {
        /// The token id given.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A logit bias that is NaN or `+inf` (`-inf` is allowed: it bans the token).
    #[error("logit bias for token id {id} must be finite or -inf, got {bias}")]
    BiasValue {
        /// The token id given.
        id: u32,
        /// The bias given.
        bias: f32,
    },
}

/// `l`, with NaN read as `-inf` and `-0.0` as `+0.0` (so that equal logits always tie).
#[inline]
fn clean(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l + 0.0 // -0.0 + 0.0 = +0.0; every other value is unchanged
    }
}

/// Whether a temperature means greedy decoding: 0, negative or NaN.
#[inline]
fn greedy(temperature: f32) -> bool {
    temperature.is_nan() || temperature <= 0.0
}

/// The largest logit, NaNs ignored; `-inf` for an empty or all-NaN row.
fn max_logit(logits: &[f32]) -> f32 {
    logits
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| m.max(clean(l)))
}

/// `l - m` in f64 for a row whose maximum `m` is finite or `+inf`, never NaN: NaN logits give
/// `-inf`, and when `m` is `+inf` the `+inf` logits give 0 and all others `-inf` (the limit in
/// which the `+inf` tokens share all the probability).
#[inline]
fn shift(l: f32, m: f32) -> f64 {
    let l = clean(l);
    if m == f32::INFINITY {
        if l == m {
            0.0
        } else {
            f64::NEG_INFINITY
        }
    } else {
        f64::from(l) - f64::from(m)
    }
}

/// `exp(s)` for a scaled logit; 0 for NaN (an `-inf` logit at an infinite temperature).
#[inline]
fn weight(s: f32) -> f32 {
    if s.is_nan() {
        0.0
    } else {
        s.exp()
    }
}

/// Candidate order: larger value first, then lower id. A total order on non-NaN values, so the
/// ranking is deterministic whatever the sort algorithm.
#[inline]
fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the best `k` of `cand` (by [`by_rank`]), sorted: O(n + k log k) by selection.
fn keep_top_sorted(cand: &mut Vec<(u32, f32)>, k: usize) {
    if k == 0 {
        cand.clear();
        return;
    }
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, by_rank);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_rank);
}
