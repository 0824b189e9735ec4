//! Probes: what a forward pass can report about the next-token distribution at a position,
//! without choosing a token.
//!
//! Each probe type has its own handle type, so an entropy handle cannot be read as logits and
//! a probe handle cannot be read as a sampled token (see [`crate::ForwardOutput`]).

use std::marker::PhantomData;

use weft_core::sampling;

use crate::error::{Error, Result};

/// The raw logits (one `f32` per vocabulary entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logits;

/// The softmax at `temperature` restricted to the `k` most likely ids (sorted by descending
/// probability; `k = 0` is the whole vocabulary). Temperature 0 is one-hot on the argmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Distribution {
    pub temperature: f32,
    pub k: usize,
}

/// The log-probability (natural log, temperature 1) of one token id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logprob(pub u32);

/// The log-probabilities of several token ids, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logprobs(pub Vec<u32>);

/// The entropy (nats) of the next-token distribution at temperature 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entropy;

/// The hidden state after the model's final norm at the index (`n_embd` values): what
/// embeddings are pooled from. A pass that asks only for hidden states skips the LM head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hidden;

/// What the engine computes for a probe.
#[derive(Debug, Clone, PartialEq)]
#[doc(hidden)]
pub enum ProbeKind {
    Logits,
    Distribution { temperature: f32, k: usize },
    Logprobs(Vec<u32>),
    Entropy,
    Hidden,
}

/// A probe's result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ProbeValue {
    Logits(Vec<f32>),
    Distribution(Vec<u32>, Vec<f32>),
    Logprobs(Vec<f32>),
    Entropy(f32),
    Hidden(Vec<f32>),
}

mod sealed {
    pub trait Sealed {}
}

/// A probe type: [`Logits`], [`Distribution`], [`Logprob`], [`Logprobs`], [`Entropy`] or
/// [`Hidden`].
pub trait Probe: sealed::Sealed {
    #[doc(hidden)]
    fn kind(self) -> ProbeKind;
}

/// Probes read with [`crate::ForwardOutput::logprobs`].
pub trait LogprobProbe: Probe {}

macro_rules! probe {
    ($t:ty, $s:ident => $kind:expr) => {
        impl sealed::Sealed for $t {}
        impl Probe for $t {
            fn kind(self) -> ProbeKind {
                let $s = self;
                $kind
            }
        }
    };
}
probe!(Logits, _p => ProbeKind::Logits);
probe!(Distribution, p => ProbeKind::Distribution { temperature: p.temperature, k: p.k });
probe!(Logprob, p => ProbeKind::Logprobs(vec![p.0]));
probe!(Logprobs, p => ProbeKind::Logprobs(p.0));
probe!(Entropy, _p => ProbeKind::Entropy);
probe!(Hidden, _p => ProbeKind::Hidden);
impl LogprobProbe for Logprob {}
impl LogprobProbe for Logprobs {}

/// Reads the result of a probe of type `P` from a pass's output.
#[derive(Debug)]
pub struct ProbeHandle<P> {
    pub(crate) index: usize,
    _probe: PhantomData<fn() -> P>,
}

impl<P> ProbeHandle<P> {
    pub(crate) fn new(index: usize) -> Self {
        ProbeHandle {
            index,
            _probe: PhantomData,
        }
    }
}

impl<P> Clone for ProbeHandle<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P> Copy for ProbeHandle<P> {}

impl ProbeKind {
    /// Checks the probe's parameters against the vocabulary.
    pub(crate) fn validate(&self, vocab_size: usize) -> Result<()> {
        match self {
            ProbeKind::Logprobs(ids) => {
                crate::error::check_vocab(ids.iter().copied(), vocab_size)?;
            }
            ProbeKind::Distribution { temperature, .. }
                if !(temperature.is_finite() && *temperature >= 0.0) =>
            {
                return Err(Error::Config(format!(
                    "distribution probe: temperature {temperature} must be finite and >= 0"
                )));
            }
            _ => {}
        }
        Ok(())
    }

    /// The probe's value for one row of logits (or, for [`ProbeKind::Hidden`], of hidden
    /// state).
    pub(crate) fn compute(&self, logits: &[f32]) -> ProbeValue {
        match self {
            ProbeKind::Hidden => ProbeValue::Hidden(logits.to_vec()),
            ProbeKind::Logits => ProbeValue::Logits(logits.to_vec()),
            ProbeKind::Distribution { temperature, k } => {
                let (ids, probs) = sampling::distribution(logits, *temperature, *k);
                ProbeValue::Distribution(ids, probs)
            }
            ProbeKind::Logprobs(ids) => ProbeValue::Logprobs(sampling::logprobs_of(logits, ids)),
            ProbeKind::Entropy => ProbeValue::Entropy(sampling::entropy(logits)),
        }
    }
}
