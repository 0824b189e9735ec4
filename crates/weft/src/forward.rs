//! The forward pass builder: what one pass runs, what it samples and what it reports.

use std::collections::BTreeMap;
use std::sync::Arc;

use weft_core::models::SlotMask;
use weft_core::sampling::{validate_logit_bias, Penalties, Sampler};

use weft_core::lora::ZoSeed;

use crate::adapter::{Adapter, PassAdapters};
use crate::brle::Brle;
use crate::constraint::TokenMask;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::output::{ForwardOutput, SampleHandle};
use crate::probe::{Probe, ProbeHandle, ProbeKind};
use crate::scheduler::{PassRequest, SampleSpec};

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
/// // Each handle reads its own type: tokens, an f32, a slice of log-probabilities.
/// let (tokens, entropy, logprobs): (&[u32], f32, &[f32]) = (out.get(next), out.get(ent), out.get(lp));
/// println!("next {} (entropy {entropy:.2} nats), log p(Paris) = {:?}", engine.detokenize(tokens)?, logprobs);
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
    /// Input vectors of this pass's inputs, by index in the pass.
    vectors: BTreeMap<usize, Arc<[f32]>>,
    attn_bias: Option<Vec<Vec<f32>>>,
    error: Option<Error>,
}

impl<'c> Forward<'c> {
    pub(crate) fn new(ctx: &'c mut Context) -> Forward<'c> {
        ctx.settle();
        let start = ctx.start_position();
        let positions = (0..ctx.pending().len() as u32).map(|i| start + i).collect();
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
            vectors: BTreeMap::new(),
            attn_bias: None,
            error: None,
        }
    }

    /// Tokens the pass runs so far (pending tokens and inputs).
    pub fn len(&self) -> usize {
        self.ctx.pending().len() + self.inputs.len()
    }

    /// Whether the pass runs no token yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `tokens` at consecutive positions after the last one.
    pub fn input(&mut self, tokens: &[u32]) -> &mut Self {
        let start = self.next_position();
        self.inputs.extend_from_slice(tokens);
        self.positions
            .extend((0..tokens.len() as u32).map(|i| start.saturating_add(i)));
        self
    }

    /// Appends `tokens` at the given positions (one per token). Positions set the rotary
    /// angle and the causal order; two tokens may share a position (e.g. two documents
    /// side by side, isolated with [`Forward::attention_mask`]). Without a mask a token sees
    /// every slot at a position up to its own, this pass's later ones included; a token run
    /// by an earlier pass never sees one added since. On a sliding-window model, a position
    /// so far back that the keys it would see were released is
    /// [`weft_core::Error::PositionBehindWindow`].
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

    /// Appends input vectors at the given positions: `rows` holds one vector of the model's
    /// width (`n_embd`) per position, which the model's first block reads in place of a
    /// token's embedding (see [`Context::fill_embeds`] for what a vector must be). They run in
    /// the same pass as ordinary tokens and are recorded in the context as token id 0; use
    /// [`Forward::input_embeds_as`] to record ids of your choice.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("A picture of")?;
    /// let rows = engine.input_embeddings(&engine.tokenize(" a cat"))?;
    /// let mut fwd = ctx.forward();
    /// let at = fwd.next_position();
    /// let positions: Vec<u32> = (at..).take(rows.len() / engine.info().n_embd).collect();
    /// fwd.input_embeds(&rows, &positions);
    /// let last = fwd.len() - 1;
    /// let next = fwd.sample(&[last], weft::Sampler::Argmax);
    /// let out = weft::block_on(fwd.execute())?;
    /// println!("{:?}", out.token(next));
    /// # Ok(()) }
    /// ```
    pub fn input_embeds(&mut self, rows: &[f32], positions: &[u32]) -> &mut Self {
        let ids = vec![0; positions.len()];
        self.input_embeds_as(&ids, rows, positions)
    }

    /// [`Forward::input_embeds`], recording `ids` (one per vector) in the context in their
    /// place (placeholders such as an image token; the model never sees them).
    pub fn input_embeds_as(&mut self, ids: &[u32], rows: &[f32], positions: &[u32]) -> &mut Self {
        let d = self.ctx.engine().info().n_embd;
        match split_vectors(rows, ids.len(), d) {
            Ok(vectors) => {
                let start = self.len();
                self.input_at(ids, positions);
                if self.len() == start + ids.len() {
                    for (k, v) in vectors.into_iter().enumerate() {
                        self.vectors.insert(start + k, v);
                    }
                }
            }
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// The position the next [`Forward::input`] token gets (after the last one so far).
    pub fn next_position(&self) -> u32 {
        match self.positions.last() {
            // Saturating: a position past the context is refused at `execute`, not here.
            Some(&p) => p.saturating_add(1),
            None => self.ctx.start_position(),
        }
    }

    /// An additive attention bias: one row per token of the pass (pending tokens first), of
    /// a length an [`Forward::attention_mask`] may have (from `ctx.len() + i + 1` for the
    /// pass's `i`-th token to `ctx.len() + n`). Entry `j` is added to the token's score for
    /// the sequence's `j`-th token; `-inf` hides it. Replaces the causal rule; combined with
    /// `attention_mask` if both are given (a slot is visible when both allow it).
    pub fn attention_bias(&mut self, rows: Vec<Vec<f32>>) -> &mut Self {
        self.attn_bias = Some(rows);
        self
    }

    /// Custom attention: one mask per token of the pass (pending tokens first), saying which
    /// of the sequence's tokens it attends to, replacing the causal rule. The mask of the
    /// pass's `i`-th token covers at least the context's tokens up to and including itself
    /// (length `ctx.len() + i + 1`) and at most every token of the pass (`ctx.len() + n` for
    /// a pass of `n`): a token may attend to tokens after it in the same pass, so a block
    /// can attend bidirectionally (a prefix-LM, or Gemma 3's image tokens). Slots past a
    /// mask's end are hidden.
    ///
    /// ```no_run
    /// # use weft::{Brle, Engine};
    /// let engine = Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// let prefix = engine.tokenize("A prefix every token of which sees all of it");
    /// let n = prefix.len();
    /// let mut fwd = ctx.forward();
    /// fwd.input(&prefix);
    /// // Every token of the prefix sees the whole prefix.
    /// fwd.attention_mask(vec![Brle::all(n, true); n]);
    /// weft::block_on(fwd.execute())?;
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn attention_mask(&mut self, masks: Vec<Brle>) -> &mut Self {
        self.masks = Some(masks);
        self
    }

    /// A logit mask over the vocabulary (length = vocabulary size): samplers of this pass
    /// only choose allowed ids. Probes report the unmasked distribution.
    pub fn mask(&mut self, allowed: Brle) -> &mut Self {
        let vocab_size = self.ctx.engine().info().vocab_size;
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
        SampleHandle::new(self.samplers.len() - 1)
    }

    /// Reports `probe` for the next-token distribution after the token at `index`.
    pub fn probe<P: Probe>(&mut self, index: usize, probe: P) -> ProbeHandle<P> {
        self.probes.push((index, probe.kind()));
        ProbeHandle::new(self.probes.len() - 1)
    }

    /// Samples with `sampler` after each listed index, each under its own logit mask
    /// (`masks[k]` for `indices[k]`, each as long as the vocabulary; both it and the pass's
    /// [`Forward::mask`] apply): verifying a draft under a constraint, one allowed set per
    /// drafted position. Masks of another count or length fail the pass
    /// ([`Error::MaskLength`]).
    ///
    /// ```no_run
    /// # use weft::{Engine, Sampler, TokenMask};
    /// let engine = Engine::load("smollm2-135m")?;
    /// let vocab = engine.info().vocab_size;
    /// let mut ctx = engine.context();
    /// ctx.fill("Yes or no:")?;
    /// let (yes, no) = (engine.tokenize(" yes")[0], engine.tokenize(" no")[0]);
    /// let mut fwd = ctx.forward();
    /// fwd.input(&[yes]);
    /// let last = fwd.len() - 1;
    /// let (mut first, mut second) = (TokenMask::none(vocab), TokenMask::none(vocab));
    /// first.allow(yes);
    /// first.allow(no);
    /// second.allow(engine.tokenize(".")[0]);
    /// let h = fwd.sample_with_masks(&[last - 1, last], Sampler::Argmax, vec![first, second]);
    /// let out = weft::block_on(fwd.execute())?;
    /// let [answer, stop] = out.tokens(h).expect("sampled")[..] else { unreachable!() };
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn sample_with_masks(
        &mut self,
        indices: &[usize],
        sampler: Sampler,
        masks: Vec<TokenMask>,
    ) -> SampleHandle {
        if masks.len() != indices.len() {
            self.error.get_or_insert(Error::MaskLength {
                what: "the list of per-index logit masks",
                expected: indices.len(),
                got: masks.len(),
            });
        }
        self.sample_masked(indices, sampler, masks.into_iter().map(Some).collect())
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
        SampleHandle::new(self.samplers.len() - 1)
    }

    pub(crate) fn probe_kind(&mut self, index: usize, kind: ProbeKind) {
        self.probes.push((index, kind));
    }

    /// Drops every sampler attached so far (their handles then read `None`).
    pub fn clear_samplers(&mut self) {
        self.samplers.clear();
    }

    /// Checks the pass and turns it into a scheduler request, with the input vectors of its
    /// own inputs (by index in the pass) for the context to record.
    #[allow(clippy::type_complexity)]
    fn into_request(self) -> Result<(&'c mut Context, PassRequest, BTreeMap<usize, Arc<[f32]>>)> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let ctx = self.ctx;
        let engine = ctx.engine().clone();
        let vocab_size = engine.info().vocab_size;
        let n_ctx = engine.n_ctx();
        let mut tokens = ctx.pending().to_vec();
        tokens.extend_from_slice(&self.inputs);
        let n = tokens.len();
        if n == 0 {
            return Err(Error::EmptyPass);
        }
        engine.check_ids(tokens.iter().copied())?;
        if ctx.len() + n > n_ctx {
            return Err(Error::ContextTooLong {
                len: ctx.len() + n,
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
            if let Some(m) = s.masks.iter().flatten().find(|m| m.len() != vocab_size) {
                return Err(Error::MaskLength {
                    what: "a sampler's logit mask",
                    expected: vocab_size,
                    got: m.len(),
                });
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
        let base = ctx.len();
        let masks = match attention(
            base,
            n,
            self.masks.as_deref(),
            self.attn_bias.as_deref(),
            ctx.pending_bias(),
        )? {
            // Positions that go back within the pass: a token sees the pass's later slots at
            // positions up to its own, as one micro-batch shows them, wherever the scheduler
            // cuts the pass: explicit masks keep such tokens together.
            None if goes_back(&self.positions) => {
                Some(position_masks(ctx.run_positions(), &self.positions))
            }
            m => m,
        };
        // Input vectors: the pending tokens' (recorded in the context) and this pass's own.
        let n_pending = ctx.pending().len();
        let embeds = if self.vectors.is_empty() && !ctx.has_vectors_from(base) {
            Vec::new()
        } else {
            (0..n)
                .map(|i| {
                    if i < n_pending {
                        ctx.vector(base + i)
                    } else {
                        self.vectors.get(&i).cloned()
                    }
                })
                .collect()
        };
        let penalties = self.penalties.map(|p| {
            let mut history = ctx.tokens().to_vec();
            history.extend_from_slice(&tokens);
            (p, history)
        });
        let reach = masks.as_deref().map_or_else(Vec::new, |m| reach(base, m));
        let req = PassRequest {
            seq: ctx.seq(),
            tokens,
            positions: self.positions,
            masks,
            reach,
            samplers: self.samplers,
            probes: self.probes,
            logit_mask,
            penalties,
            bias: self.bias,
            rng: ctx.rng().clone(),
            horizon: self.horizon,
            adapters: self.adapters.resolve(&engine)?,
            embeds,
        };
        Ok((ctx, req, self.vectors))
    }

    /// Submits the pass to the scheduler and waits for its outputs. Works under any async
    /// runtime (tokio, `block_on`); see [`crate::block_on`] for blocking code.
    ///
    /// The context records the pass's tokens as soon as it is submitted: dropping this future
    /// before it completes does not cancel the pass.
    pub async fn execute(self) -> Result<ForwardOutput> {
        let (ctx, req, vectors) = self.into_request()?;
        // If this future is dropped before the answer, the context settles later.
        ctx.begin_pass(&req.tokens, &req.positions, vectors, req.masks.as_deref());
        let rx = ctx.engine().inner.shared.submit(req);
        match rx.await.unwrap_or(Err(Error::EngineStopped)) {
            Ok(r) => {
                ctx.pass_done(r.rng);
                Ok(ForwardOutput::new(r.tokens, r.probes))
            }
            Err(e) => {
                ctx.pass_failed();
                Err(e)
            }
        }
    }
}

/// Splits `rows` into `n` vectors of `d` values, checking the shape and that every value is
/// finite.
pub(crate) fn split_vectors(rows: &[f32], n: usize, d: usize) -> Result<Vec<Arc<[f32]>>> {
    if rows.len() != n * d {
        return Err(Error::InputEmbeds {
            reason: format!(
                "{} values for {n} vectors of the model's width {d} (expected {})",
                rows.len(),
                n * d
            ),
        });
    }
    if let Some(i) = rows.iter().position(|v| !v.is_finite()) {
        return Err(Error::InputEmbeds {
            reason: format!("value {} of vector {} is {}", i % d, i / d, rows[i]),
        });
    }
    Ok(rows.chunks_exact(d.max(1)).map(Arc::from).collect())
}

/// Splits a row-major `n × (base + n)` additive attention bias into one row per token, each
/// cut after the token itself (`base + i + 1` values), refusing a row that lets a token see a
/// later one.
pub(crate) fn bias_rows(bias: &[f32], base: usize, n: usize) -> Result<Vec<Vec<f32>>> {
    let width = base + n;
    if bias.len() != n * width {
        return Err(Error::AttentionBias {
            reason: format!(
                "{} values for {n} rows of {width} (the context's {base} tokens and the {n} new ones)",
                bias.len()
            ),
        });
    }
    let mut out = Vec::with_capacity(n);
    for (i, row) in bias.chunks_exact(width.max(1)).enumerate() {
        let own = base + i + 1;
        if let Some(j) = row[own..].iter().position(|&b| b != f32::NEG_INFINITY) {
            return Err(Error::AttentionBias {
                reason: format!(
                    "row {i} lets token {} see the later token {} (entries past a token must be -inf)",
                    own - 1,
                    own + j
                ),
            });
        }
        if let Some(b) = row[..own]
            .iter()
            .find(|b| b.is_nan() || **b == f32::INFINITY)
        {
            return Err(Error::AttentionBias {
                reason: format!("row {i} holds {b}"),
            });
        }
        out.push(row[..own].to_vec());
    }
    Ok(out)
}

/// Per token `t` of a pass whose first token is slot `base`, the last token of the pass
/// that a token up to `t` attends to (`t` or less when no mask looks ahead); empty when none
/// does. The pass may be cut after token `t` (chunked prefill) only when `reach[t] <= t`.
/// Whether some position of the pass is at or before an earlier one of it.
fn goes_back(positions: &[u32]) -> bool {
    let mut top = None;
    for &p in positions {
        if top.is_some_and(|t| p <= t) {
            return true;
        }
        top = top.max(Some(p));
    }
    false
}

/// Causal attention by position, as explicit masks: token `i` sees every slot (the context's
/// and the pass's) at a position up to its own. A mask ends at its last visible slot (or the
/// token's own): a micro-batch may end where no mask reaches past it.
fn position_masks(run: &[u32], pass: &[u32]) -> Vec<SlotMask> {
    pass.iter()
        .enumerate()
        .map(|(i, &own)| {
            let mut visible: Vec<bool> = run.iter().chain(pass).map(|&p| p <= own).collect();
            let own_slot = run.len() + i;
            let end = visible.iter().rposition(|&v| v).map_or(0, |s| s + 1);
            visible.truncate(end.max(own_slot + 1));
            SlotMask::new(visible)
        })
        .collect()
}

fn reach(base: usize, masks: &[SlotMask]) -> Vec<u32> {
    let mut out = Vec::with_capacity(masks.len());
    let mut far = 0usize;
    for m in masks {
        far = far.max(m.last_visible().map_or(0, |s| s.saturating_sub(base)));
        out.push(far as u32);
    }
    if out.iter().enumerate().all(|(t, &r)| r as usize <= t) {
        out.clear();
    }
    out
}

/// The pass's attention masks, one per token, when any token has a custom mask or bias (the
/// pass's own `masks` / `bias`, one per token, or the pending tokens' bias rows recorded in
/// the context by index in the sequence); `None` when every token is causal.
fn attention(
    base: usize,
    n: usize,
    masks: Option<&[Brle]>,
    bias: Option<&[Vec<f32>]>,
    pending_bias: &BTreeMap<usize, Vec<f32>>,
) -> Result<Option<Vec<SlotMask>>> {
    if masks.is_none() && bias.is_none() && pending_bias.is_empty() {
        return Ok(None);
    }
    let check = |what, len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(Error::MaskLength {
                what,
                expected: n,
                got: len,
            })
        }
    };
    if let Some(m) = masks {
        check(
            "attention mask list (one mask per token of the pass)",
            m.len(),
        )?;
    }
    if let Some(b) = bias {
        check(
            "attention bias list (one row per token of the pass)",
            b.len(),
        )?;
    }
    // Token `i` covers at least the slots up to itself, at most those of the whole pass.
    let fits = |i: usize, len: usize| (base + i + 1..=base + n).contains(&len);
    let expected = |i: usize, len: usize| match len < base + i + 1 {
        true => base + i + 1,
        false => base + n,
    };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let row = match (bias, pending_bias.get(&(base + i))) {
            // Two biases for one token: which one holds would be a guess.
            (Some(_), Some(_)) => {
                return Err(Error::AttentionBias {
                    reason: format!(
                        "token {i} of the pass already has a bias row from fill_embeds; give \
                         the pass's attention_bias only to passes over tokens without one"
                    ),
                })
            }
            (Some(b), None) => Some(&b[i]),
            (None, row) => row,
        };
        let mut mask = match masks.map(|m| &m[i]) {
            Some(m) if !fits(i, m.len()) => {
                return Err(Error::MaskLength {
                    what: "an attention mask (token i of a pass of n covers from the len(ctx) + i + 1 slots up to itself to the len(ctx) + n of the whole pass)",
                    expected: expected(i, m.len()),
                    got: m.len(),
                })
            }
            Some(m) => SlotMask::new(m.to_bools()),
            // A bias row alone decides, up to its own length (it may look ahead too).
            None => SlotMask::new(vec![true; row.map_or(base + i + 1, Vec::len)]),
        };
        if let Some(row) = row {
            if !fits(i, row.len()) {
                return Err(Error::MaskLength {
                    what: "an attention bias row (token i of a pass of n covers from the len(ctx) + i + 1 slots up to itself to the len(ctx) + n of the whole pass)",
                    expected: expected(i, row.len()),
                    got: row.len(),
                });
            }
            if row.iter().any(|b| b.is_nan() || *b == f32::INFINITY) {
                return Err(Error::AttentionBias {
                    reason: format!("row {i} holds NaN or +inf"),
                });
            }
            mask = mask.and(&SlotMask::with_bias(row.clone()));
        }
        out.push(mask);
    }
    Ok(Some(out))
}
