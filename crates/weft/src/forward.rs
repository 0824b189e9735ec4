//! The forward pass builder: what one pass runs, what it samples and what it reports.

use weft_core::models::SlotMask;
use weft_core::sampling::{validate_logit_bias, Penalties, Sampler};

use weft_core::lora::ZoSeed;

use crate::adapter::{Adapter, PassAdapters};
use crate::brle::Brle;
use crate::constraint::TokenMask;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::probe::{
    Distribution, Entropy, Hidden, Logits, LogprobProbe, Probe, ProbeHandle, ProbeKind, ProbeValue,
};
use crate::scheduler::{PassRequest, SampleSpec};

/// Reads the tokens a sampler chose from a pass's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleHandle {
    index: usize,
}

/// One forward pass over a [`Context`], built step by step and run with
/// [`Forward::execute`].
///
/// The pass runs the context's pending tokens (from `fill`) followed by the inputs given here.
/// **Indices** (for samplers, probes) count every token the pass runs, pending tokens first;
/// [`Forward::len`] is the count so far, so `fwd.len() - 1` is the last. Positions are
/// derived (consecutive after the context's last) unless given with [`Forward::input_at`].
///
/// The pass is submitted to the engine's scheduler, which batches it with the passes of every
/// other live context. Errors in what was asked (an index past the inputs, an id past the
/// vocabulary, a mask of the wrong length, a context too long) are returned by `execute`
/// before anything runs.
///
/// ```no_run
/// use weft::{Engine, Sampler, Entropy, Logprobs};
/// # fn main() -> weft::Result<()> {
/// let engine = Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("The capital of France is")?;
/// let mut fwd = ctx.forward();
/// let last = fwd.len() - 1;
/// let next = fwd.sample(&[last], Sampler::Argmax);
/// let ent = fwd.probe(last, Entropy);
/// let paris = engine.tokenize(" Paris");
/// let lp = fwd.probe(last, Logprobs(paris.clone()));
/// let out = weft::block_on(fwd.execute())?;
/// println!("{:?} {:?} {:?}", out.token(next), out.entropy(ent), out.logprobs(lp));
/// # Ok(()) }
/// ```
pub struct Forward<'c> {
    ctx: &'c mut Context,
    inputs: Vec<u32>,
    positions: Vec<u32>,
    masks: Option<Vec<Brle>>,
    logit_mask: Option<TokenMask>,
    samplers: Vec<SampleSpec>,
    probes: Vec<(usize, ProbeKind)>,
    penalties: Option<Penalties>,
    bias: Vec<(u32, f32)>,
    horizon: usize,
    adapters: PassAdapters,
    error: Option<Error>,
}

impl<'c> Forward<'c> {
    pub(crate) fn new(ctx: &'c mut Context) -> Forward<'c> {
        ctx.settle();
        let start = ctx.positions.last().map_or(0, |&p| p + 1);
        let positions = (0..ctx.pending.len() as u32).map(|i| start + i).collect();
        Forward {
            ctx,
            inputs: Vec::new(),
            positions,
            masks: None,
            logit_mask: None,
            samplers: Vec::new(),
            probes: Vec::new(),
            penalties: None,
            bias: Vec::new(),
            horizon: 0,
            adapters: PassAdapters::default(),
            error: None,
        }
    }

    /// Tokens the pass runs so far (pending tokens and inputs).
    pub fn len(&self) -> usize {
        self.ctx.pending.len() + self.inputs.len()
    }

    /// Whether the pass runs no token yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `tokens` at consecutive positions after the last one.
    pub fn input(&mut self, tokens: &[u32]) -> &mut Self {
        let start = match self.positions.last() {
            Some(&p) => p + 1,
            None => self.ctx.positions.last().map_or(0, |&p| p + 1),
        };
        self.inputs.extend_from_slice(tokens);
        self.positions
            .extend((0..tokens.len() as u32).map(|i| start + i));
        self
    }

    /// Appends `tokens` at the given positions (one per token). Positions set the rotary
    /// angle and the causal order; two tokens may share a position (e.g. two documents
    /// side by side, isolated with [`Forward::attention_mask`]).
    pub fn input_at(&mut self, tokens: &[u32], positions: &[u32]) -> &mut Self {
        if tokens.len() != positions.len() {
            self.error.get_or_insert(Error::PositionCount {
                tokens: tokens.len(),
                positions: positions.len(),
            });
            return self;
        }
        self.inputs.extend_from_slice(tokens);
        self.positions.extend_from_slice(positions);
        self
    }

    /// Custom attention: one mask per token of the pass (pending tokens first). The mask of
    /// the pass's `i`-th token covers the context's tokens up to and including itself (length
    /// `ctx.len() + i + 1`) and says which of them it attends to, replacing the causal rule.
    pub fn attention_mask(&mut self, masks: Vec<Brle>) -> &mut Self {
        self.masks = Some(masks);
        self
    }

    /// A logit mask over the vocabulary (length = vocabulary size): samplers of this pass
    /// only choose allowed ids. Probes report the unmasked distribution.
    pub fn mask(&mut self, allowed: Brle) -> &mut Self {
        let vocab_size = self.ctx.engine.info().vocab_size;
        if allowed.len() != vocab_size {
            self.error.get_or_insert(Error::MaskLength {
                what: "logit mask",
                expected: vocab_size,
                got: allowed.len(),
            });
            return self;
        }
        let mut t = TokenMask::none(vocab_size);
        let mut start = 0usize;
        for (k, &run) in allowed.runs().iter().enumerate() {
            if k % 2 == 1 {
                (start..start + run as usize).for_each(|id| t.allow(id as u32));
            }
            start += run as usize;
        }
        self.logit_mask = Some(t);
        self
    }

    /// [`Forward::mask`] from a [`TokenMask`] (what constraints produce).
    pub fn mask_tokens(&mut self, allowed: &TokenMask) -> &mut Self {
        self.logit_mask = Some(allowed.clone());
        self
    }

    /// Repetition / presence / frequency penalties for this pass's samplers, over the
    /// context's tokens.
    pub fn penalties(&mut self, penalties: Penalties) -> &mut Self {
        self.penalties = Some(penalties);
        self
    }

    /// Adds `bias` to the logits of the listed ids before sampling (`-inf` bans an id).
    pub fn logit_bias(&mut self, bias: &[(u32, f32)]) -> &mut Self {
        self.bias.extend_from_slice(bias);
        self
    }

    /// Replaces the pass's adapters (the generator's).
    pub(crate) fn set_adapters(&mut self, adapters: PassAdapters) -> &mut Self {
        self.adapters = adapters;
        self
    }

    /// Runs the pass with `adapter` scaled by `scale` (call again to stack several: their
    /// deltas add up). A pass that names no adapter runs with the engine's stack
    /// ([`Engine::push_lora`](crate::Engine::push_lora)); scale 0 is the base model.
    pub fn adapter(&mut self, adapter: &Adapter, scale: f32) -> &mut Self {
        self.adapters.stack.push((adapter.clone(), scale));
        self
    }

    /// Runs the pass with its adapters' weights perturbed by `sigma · ε(seed)`, a standard
    /// normal value per weight generated from the seed on the fly (see
    /// [`weft_core::lora::zo`] for the generator); negative `sigma` is the antithetic pair.
    /// For evolution-strategies / zeroth-order training loops.
    pub fn zo_seed(&mut self, seed: u64, sigma: f32) -> &mut Self {
        self.adapters.zo = Some(ZoSeed { seed, sigma });
        self
    }

    /// A scheduling hint: about how many more passes this context will submit right after
    /// this one. The scheduler briefly waits for such contexts before its next step, so that
    /// concurrent generations share model calls.
    pub fn horizon(&mut self, n: usize) -> &mut Self {
        self.horizon = n;
        self
    }

    /// Samples a token with `sampler` after each listed index.
    pub fn sample(&mut self, indices: &[usize], sampler: Sampler) -> SampleHandle {
        self.samplers.push(SampleSpec {
            indices: indices.to_vec(),
            sampler,
            masks: Vec::new(),
        });
        SampleHandle {
            index: self.samplers.len() - 1,
        }
    }

    /// Reports `probe` for the next-token distribution after the token at `index`.
    pub fn probe<P: Probe>(&mut self, index: usize, probe: P) -> ProbeHandle<P> {
        self.probes.push((index, probe.kind()));
        ProbeHandle::new(self.probes.len() - 1)
    }

    /// Samples after each listed index, each with its own allowed set (the generator's
    /// speculative verification under constraints).
    pub(crate) fn sample_masked(
        &mut self,
        indices: &[usize],
        sampler: Sampler,
        masks: Vec<Option<TokenMask>>,
    ) -> SampleHandle {
        self.samplers.push(SampleSpec {
            indices: indices.to_vec(),
            sampler,
            masks,
        });
        SampleHandle {
            index: self.samplers.len() - 1,
        }
    }

    pub(crate) fn probe_kind(&mut self, index: usize, kind: ProbeKind) {
        self.probes.push((index, kind));
    }

    /// Drops every sampler attached so far (their handles then read `None`).
    pub fn clear_samplers(&mut self) {
        self.samplers.clear();
    }

    /// Checks the pass and turns it into a scheduler request.
    fn into_request(self) -> Result<(&'c mut Context, PassRequest)> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let ctx = self.ctx;
        let engine = ctx.engine.clone();
        let vocab_size = engine.info().vocab_size;
        let n_ctx = engine.n_ctx();
        let mut tokens = ctx.pending.clone();
        tokens.extend_from_slice(&self.inputs);
        let n = tokens.len();
        if n == 0 {
            return Err(Error::EmptyPass);
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(Error::TokenOutOfVocab { id, vocab_size });
        }
        if ctx.tokens.len() + n > n_ctx {
            return Err(Error::ContextTooLong {
                len: ctx.tokens.len() + n,
                n_ctx,
            });
        }
        if let Some(&pos) = self.positions.iter().find(|&&p| p as usize >= n_ctx) {
            return Err(Error::PositionOutOfRange { pos, n_ctx });
        }
        let check = |what, index: usize| {
            if index < n {
                Ok(())
            } else {
                Err(Error::IndexOutOfRange {
                    what,
                    index,
                    len: n,
                })
            }
        };
        for s in &self.samplers {
            s.sampler.validate(vocab_size)?;
            for &i in &s.indices {
                check("sampler", i)?;
            }
        }
        for (i, p) in &self.probes {
            check("probe", *i)?;
            p.validate(vocab_size)?;
        }
        validate_logit_bias(&self.bias, vocab_size)?;
        if let Some(p) = &self.penalties {
            p.validate()?;
        }
        let logit_mask = match self.logit_mask {
            Some(m) if m.len() != vocab_size => {
                return Err(Error::MaskLength {
                    what: "logit mask",
                    expected: vocab_size,
                    got: m.len(),
                })
            }
            m => m,
        };
        let masks = match self.masks {
            None => None,
            Some(m) if m.len() != n => {
                return Err(Error::MaskLength {
                    what: "attention mask list (one mask per token of the pass)",
                    expected: n,
                    got: m.len(),
                })
            }
            Some(m) => {
                let mut out = Vec::with_capacity(n);
                for (i, mask) in m.iter().enumerate() {
                    let expected = ctx.tokens.len() + i + 1;
                    if mask.len() != expected {
                        return Err(Error::MaskLength {
                            what: "attention mask",
                            expected,
                            got: mask.len(),
                        });
                    }
                    out.push(SlotMask::new(mask.to_bools()));
                }
                Some(out)
            }
        };
        let penalties = self.penalties.map(|p| {
            let mut history = ctx.tokens.clone();
            history.extend_from_slice(&tokens);
            (p, history)
        });
        let req = PassRequest {
            seq: ctx.seq,
            tokens,
            positions: self.positions,
            masks,
            samplers: self.samplers,
            probes: self.probes,
            logit_mask,
            penalties,
            bias: self.bias,
            rng: ctx.rng.clone(),
            horizon: self.horizon,
            adapters: self.adapters.resolve(&ctx.engine)?,
        };
        Ok((ctx, req))
    }

    /// Submits the pass to the scheduler and waits for its outputs. Works under any async
    /// runtime (tokio, `block_on`); see [`crate::block_on`] for blocking code.
    ///
    /// The context records the pass's tokens as soon as it is submitted: dropping this future
    /// before it completes does not cancel the pass.
    pub async fn execute(self) -> Result<ForwardOutput> {
        let (ctx, req) = self.into_request()?;
        let (len, pending) = (ctx.tokens.len(), std::mem::take(&mut ctx.pending));
        ctx.tokens.extend_from_slice(&req.tokens);
        ctx.positions.extend_from_slice(&req.positions);
        let rx = ctx.engine.inner.shared.submit(req);
        // Cleared below; if this future is dropped first, the context settles later.
        ctx.inflight = true;
        let result = rx.await.unwrap_or(Err(Error::EngineStopped));
        ctx.inflight = false;
        match result {
            Ok(r) => {
                ctx.rng = r.rng;
                Ok(ForwardOutput {
                    tokens: r.tokens,
                    probes: r.probes,
                })
            }
            Err(e) => {
                // The runner rolled the sequence back; so does the context.
                ctx.tokens.truncate(len);
                ctx.positions.truncate(len);
                ctx.pending = pending;
                Err(e)
            }
        }
    }
}

/// The outputs of a forward pass, read through the handles the builder returned.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOutput {
    tokens: Vec<Vec<u32>>,
    probes: Vec<ProbeValue>,
}

impl ForwardOutput {
    /// The token sampled at the sampler's first index.
    pub fn token(&self, h: SampleHandle) -> Option<u32> {
        self.tokens(h).and_then(|t| t.first().copied())
    }

    /// The tokens sampled at each of the sampler's indices.
    pub fn tokens(&self, h: SampleHandle) -> Option<&[u32]> {
        self.tokens.get(h.index).map(Vec::as_slice)
    }

    /// The raw logits (one per vocabulary entry).
    pub fn logits(&self, h: ProbeHandle<Logits>) -> Option<&[f32]> {
        match self.probes.get(h.index)? {
            ProbeValue::Logits(v) => Some(v),
            _ => None,
        }
    }

    /// Ids (most likely first) and their probabilities.
    pub fn distribution(&self, h: ProbeHandle<Distribution>) -> Option<(&[u32], &[f32])> {
        match self.probes.get(h.index)? {
            ProbeValue::Distribution(ids, p) => Some((ids, p)),
            _ => None,
        }
    }

    /// Log-probabilities of the probed ids (one for [`crate::Logprob`]).
    pub fn logprobs<P: LogprobProbe>(&self, h: ProbeHandle<P>) -> Option<&[f32]> {
        match self.probes.get(h.index)? {
            ProbeValue::Logprobs(v) => Some(v),
            _ => None,
        }
    }

    /// Entropy in nats.
    pub fn entropy(&self, h: ProbeHandle<Entropy>) -> Option<f32> {
        match self.probes.get(h.index)? {
            ProbeValue::Entropy(v) => Some(*v),
            _ => None,
        }
    }

    /// The final-norm hidden state (`n_embd` values).
    pub fn hidden(&self, h: ProbeHandle<Hidden>) -> Option<&[f32]> {
        match self.probes.get(h.index)? {
            ProbeValue::Hidden(v) => Some(v),
            _ => None,
        }
    }
}
