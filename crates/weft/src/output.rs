//! A pass's outputs, read through the handles the pass builder returned: each handle type
//! reads its own kind of value, so an entropy cannot be read as logits nor a probe as a
//! sampled token.

use crate::probe::{
    Distribution, Entropy, Hidden, Logits, Logprob, LogprobProbe, Logprobs, ProbeHandle, ProbeValue,
};

/// Reads the tokens a sampler chose from a pass's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleHandle {
    index: usize,
}

impl SampleHandle {
    pub(crate) fn new(index: usize) -> SampleHandle {
        SampleHandle { index }
    }
}

/// The outputs of a forward pass, read through the handles the builder returned.
///
/// [`ForwardOutput::get`] reads any handle, and its return type follows the handle: the
/// sampled tokens (one per index the sampler was given) for a [`SampleHandle`], an `f32` for
/// [`Entropy`] and [`Logprob`], a slice for [`Logits`], [`Logprobs`] and [`Hidden`], ids and
/// probabilities for [`Distribution`]. The named readers (`token`, `logits`, …) do the same
/// and return `None` for a handle of another pass instead of panicking.
///
/// ```no_run
/// use weft::{Entropy, Logits, Sampler};
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("The capital of France is")?;
/// let mut fwd = ctx.forward();
/// let last = fwd.len() - 1;
/// let next = fwd.sample(&[last], Sampler::Argmax);
/// let ent = fwd.probe(last, Entropy);
/// let logits = fwd.probe(last, Logits);
/// let out = weft::block_on(fwd.execute())?;
/// let token: u32 = out.get(next)[0];
/// let entropy: f32 = out.get(&ent); // a handle or a reference to one
/// assert_eq!(out.get(logits).len(), engine.info().vocab_size);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOutput {
    tokens: Vec<Vec<u32>>,
    probes: Vec<ProbeValue>,
}

mod sealed {
    pub trait Sealed {}
}

/// A handle that reads one value of a pass's output ([`ForwardOutput::get`]); `Value` is
/// what it reads.
pub trait OutputHandle: sealed::Sealed + Copy {
    /// What the handle reads.
    type Value<'a>;
    #[doc(hidden)]
    fn read(self, out: &ForwardOutput) -> Option<Self::Value<'_>>;
}

impl sealed::Sealed for SampleHandle {}
impl OutputHandle for SampleHandle {
    type Value<'a> = &'a [u32];
    fn read(self, out: &ForwardOutput) -> Option<&[u32]> {
        out.tokens.get(self.index).map(Vec::as_slice)
    }
}

impl<H: OutputHandle> sealed::Sealed for &H {}
impl<H: OutputHandle> OutputHandle for &H {
    type Value<'a> = H::Value<'a>;
    fn read(self, out: &ForwardOutput) -> Option<H::Value<'_>> {
        (*self).read(out)
    }
}

/// A probe handle's reader: `$value` is read from the matching `ProbeValue` variant.
macro_rules! probe_reader {
    ($probe:ty => $value:ty, |$v:pat_param| $read:expr) => {
        impl sealed::Sealed for ProbeHandle<$probe> {}
        impl OutputHandle for ProbeHandle<$probe> {
            type Value<'a> = $value;
            fn read(self, out: &ForwardOutput) -> Option<Self::Value<'_>> {
                match out.probes.get(self.index)? {
                    $v => $read,
                    _ => None,
                }
            }
        }
    };
}

probe_reader!(Logits => &'a [f32], |ProbeValue::Logits(v)| Some(v));
probe_reader!(Distribution => (&'a [u32], &'a [f32]), |ProbeValue::Distribution(ids, p)| Some((ids, p)));
probe_reader!(Logprob => f32, |ProbeValue::Logprobs(v)| v.first().copied());
probe_reader!(Logprobs => &'a [f32], |ProbeValue::Logprobs(v)| Some(v));
probe_reader!(Entropy => f32, |ProbeValue::Entropy(v)| Some(*v));
probe_reader!(Hidden => &'a [f32], |ProbeValue::Hidden(v)| Some(v));

impl ForwardOutput {
    pub(crate) fn new(tokens: Vec<Vec<u32>>, probes: Vec<ProbeValue>) -> ForwardOutput {
        ForwardOutput { tokens, probes }
    }

    /// The value `handle` reads (see the type's docs for what each handle gives).
    ///
    /// # Panics
    /// If `handle` was made by another pass's builder and this pass has nothing of its kind
    /// at its place — as indexing a slice past its end does. [`ForwardOutput::try_get`]
    /// returns `None` instead.
    pub fn get<H: OutputHandle>(&self, handle: H) -> H::Value<'_> {
        match handle.read(self) {
            Some(v) => v,
            None => panic!("ForwardOutput::get: the handle belongs to another pass"),
        }
    }

    /// The value `handle` reads, or `None` when this pass has nothing of the handle's kind at
    /// its place. A handle is an index into its pass's outputs: one from another pass whose
    /// outputs have the same shape reads this pass's value there, so keep handles with the
    /// pass that made them.
    pub fn try_get<H: OutputHandle>(&self, handle: H) -> Option<H::Value<'_>> {
        handle.read(self)
    }

    /// The token sampled at the sampler's first index.
    pub fn token(&self, h: SampleHandle) -> Option<u32> {
        self.tokens(h).and_then(|t| t.first().copied())
    }

    /// The tokens sampled at each of the sampler's indices.
    pub fn tokens(&self, h: SampleHandle) -> Option<&[u32]> {
        h.read(self)
    }

    /// The raw logits (one per vocabulary entry).
    pub fn logits(&self, h: ProbeHandle<Logits>) -> Option<&[f32]> {
        h.read(self)
    }

    /// Ids (most likely first) and their probabilities.
    pub fn distribution(&self, h: ProbeHandle<Distribution>) -> Option<(&[u32], &[f32])> {
        h.read(self)
    }

    /// Log-probabilities of the probed ids (one for [`Logprob`]).
    pub fn logprobs<P: LogprobProbe>(&self, h: ProbeHandle<P>) -> Option<&[f32]> {
        match self.probes.get(h.index)? {
            ProbeValue::Logprobs(v) => Some(v),
            _ => None,
        }
    }

    /// Entropy in nats.
    pub fn entropy(&self, h: ProbeHandle<Entropy>) -> Option<f32> {
        h.read(self)
    }

    /// The final-norm hidden state (`n_embd` values).
    pub fn hidden(&self, h: ProbeHandle<Hidden>) -> Option<&[f32]> {
        h.read(self)
    }
}
