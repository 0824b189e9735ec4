//! A context: one sequence of tokens in the engine's KV cache, with its own sampling seed.

use std::collections::BTreeMap;
use std::sync::Arc;

use weft_core::kv::SeqId;
use weft_core::sampling::{Rng, Sampler};

use crate::chat::Message;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::forward::Forward;
use crate::generator::Generator;
use crate::probe::Logits;
use crate::scheduler::Command;

mod passes;

pub(crate) use passes::{AbandonSlot, Mark, PassRecord};

/// One sequence in the engine: the tokens already run (their keys and values live in the KV
/// cache's pages), tokens filled but not yet run (the pending buffer, run by the next pass),
/// and a random generator for sampling.
///
/// Dropping a context frees its pages. [`Context::fork`] makes a copy that shares every full
/// page with this one (copy-on-write), which is how tree searches and prefix reuse are cheap.
///
/// ```no_run
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("The capital of France is")?;
/// let logits = weft::block_on(ctx.flush_logits())?; // runs the pending tokens
/// let mut branch = ctx.fork()?;
/// assert_eq!(branch.len(), ctx.len());
/// branch.truncate(1)?;
/// # Ok(()) }
/// ```
///
/// The context alone keeps its invariant — its run tokens are exactly what the KV cache holds
/// for its sequence — so every field is private; passes and generators change it only through
/// the methods below.
pub struct Context {
    engine: Engine,
    seq: SeqId,
    /// Tokens in the KV cache and their positions.
    tokens: Vec<u32>,
    positions: Vec<u32>,
    pending: Vec<u32>,
    rng: Rng,
    /// A pass was submitted and its `execute` future has not finished (it may have been
    /// dropped): wait for the scheduler before touching the sequence again. It holds what the
    /// pass took (pending tokens, bias rows), given back if the pass fails.
    inflight: Option<PassRecord>,
    /// A generator saved in the snapshot this context was resumed from (JSON), until
    /// [`Context::resume_generator`] takes it.
    saved_generator: Option<String>,
    /// Input vectors of tokens (run or pending) that stand for a vector rather than their id,
    /// by index in the sequence (run tokens first, then pending ones).
    embeds: BTreeMap<usize, Arc<[f32]>>,
    /// Additive attention bias rows of pending tokens, by index in the sequence.
    pending_bias: BTreeMap<usize, Vec<f32>>,
    /// Some token ran with a custom attention mask or bias (so its KV cannot be recomputed).
    custom_attention: bool,
    /// Per run token: whether it ran with plain causal attention (its pass had no masks).
    causal: Vec<bool>,
    /// The attention row (as a bias row: `-inf` where hidden) the last token of the latest
    /// pass with masks ran with, and that token's index, so that running it again to get its
    /// logits back ([`Context::unrun_last`]) attends as it did.
    last_row: Option<(usize, Vec<f32>)>,
    /// A step abandoned with its generator (see [`AbandonSlot`]).
    abandoned: AbandonSlot,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("len", &self.tokens.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let shared = &self.engine.inner.shared;
        shared.forget(self.seq);
        shared.command(Command::Free(self.seq));
    }
}

impl Context {
    pub(crate) fn new(engine: Engine) -> Context {
        let seq = engine.inner.shared.create_sequence();
        Context {
            engine,
            seq,
            tokens: Vec::new(),
            positions: Vec::new(),
            pending: Vec::new(),
            rng: Rng::new(0),
            inflight: None,
            saved_generator: None,
            embeds: BTreeMap::new(),
            pending_bias: BTreeMap::new(),
            custom_attention: false,
            causal: Vec::new(),
            last_row: None,
            abandoned: AbandonSlot::default(),
        }
    }

    /// The scheduler's id of this context's sequence.
    pub(crate) fn seq(&self) -> SeqId {
        self.seq
    }

    /// The sampling state the next pass starts from.
    pub(crate) fn rng(&self) -> &Rng {
        &self.rng
    }

    /// The positions of the run tokens, slot by slot.
    pub(crate) fn run_positions(&self) -> &[u32] {
        &self.positions
    }

    /// The position after the last run token (the first pending token's).
    pub(crate) fn start_position(&self) -> u32 {
        self.positions.last().map_or(0, |&p| p + 1)
    }

    /// Additive attention bias rows of pending tokens, by index in the sequence.
    pub(crate) fn pending_bias(&self) -> &BTreeMap<usize, Vec<f32>> {
        &self.pending_bias
    }

    /// The input vector of the sequence's `i`-th token, if it stands for one.
    pub(crate) fn vector(&self, i: usize) -> Option<Arc<[f32]>> {
        self.embeds.get(&i).cloned()
    }

    /// Whether any token from index `from` on stands for an input vector.
    pub(crate) fn has_vectors_from(&self, from: usize) -> bool {
        self.embeds.range(from..).next().is_some()
    }

    /// Whether the context holds input vectors or attention bias rows (a snapshot cannot
    /// record them).
    pub(crate) fn has_vectors_or_bias(&self) -> bool {
        !self.embeds.is_empty() || !self.pending_bias.is_empty()
    }

    /// The run tokens followed by the pending ones.
    pub(crate) fn history(&self) -> Vec<u32> {
        let mut h = Vec::with_capacity(self.tokens.len() + self.pending.len());
        h.extend_from_slice(&self.tokens);
        h.extend_from_slice(&self.pending);
        h
    }

    /// Appends tokens to the pending buffer (ids already checked against the vocabulary).
    pub(crate) fn push_pending(&mut self, ids: &[u32]) {
        self.pending.extend_from_slice(ids);
    }

    /// Sets the state of a context whose sequence was just imported from a snapshot.
    pub(crate) fn restore_imported(
        &mut self,
        tokens: Vec<u32>,
        positions: Vec<u32>,
        pending: Vec<u32>,
        rng: Rng,
        generator: Option<String>,
        custom_attention: bool,
    ) {
        self.tokens = tokens;
        self.positions = positions;
        self.pending = pending;
        self.rng = rng;
        self.saved_generator = generator;
        self.custom_attention = custom_attention;
        // A snapshot keeps no masks: its tokens count as custom if any was.
        self.causal = vec![!custom_attention; self.tokens.len()];
        self.last_row = None;
    }

    /// Whether tokens of this context ran under custom attention masks.
    pub(crate) fn ran_custom_attention(&self) -> bool {
        self.custom_attention
    }

    /// Whether this context was resumed from a generator's snapshot that
    /// [`Context::resume_generator`] has not taken up yet.
    pub fn has_saved_generator(&self) -> bool {
        self.saved_generator.is_some()
    }

    /// Takes the generator saved in the snapshot this context was resumed from.
    pub(crate) fn take_saved_generator(&mut self) -> Option<String> {
        self.saved_generator.take()
    }

    /// The engine this context runs on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Sets the sampling seed: the same seed gives the same tokens, whatever else the engine
    /// runs at the same time. A new context has seed 0.
    pub fn set_seed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Tokens already run (in the KV cache).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Number of tokens already run.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing has been run or filled.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.pending.is_empty()
    }

    /// Tokens filled but not yet run.
    pub fn pending(&self) -> &[u32] {
        &self.pending
    }

    /// The position the next token gets.
    pub fn next_position(&self) -> u32 {
        self.positions.last().map_or(0, |&p| p + 1) + self.pending.len() as u32
    }

    /// Buffers the tokens of `text` for the next pass. The first fill of an empty context
    /// starts with the model's BOS token when the model wants one; special tokens written in
    /// the text (`<|im_start|>`…) are parsed.
    pub fn fill(&mut self, text: &str) -> Result<()> {
        // A dropped pass's failure first gives its tokens back: new ones go after them.
        self.settle();
        let first = self.is_empty();
        let ids = self.engine.inner.tokenizer.encode(text, first, true);
        self.pending.extend(ids);
        Ok(())
    }

    /// Buffers `ids` for the next pass.
    pub fn fill_tokens(&mut self, ids: &[u32]) -> Result<()> {
        self.engine.check_ids(ids.iter().copied())?;
        self.settle();
        self.pending.extend_from_slice(ids);
        Ok(())
    }

    /// Makes the context hold `messages` rendered with the model's chat template, ending with
    /// the assistant's turn opened (the template's generation prompt). The template writes its
    /// own BOS and markers, so no BOS is added here.
    ///
    /// On an empty context this buffers the rendering. On one that holds an earlier turn of
    /// the same conversation (its rendering and the reply generated into it), it keeps the
    /// longest start of the context's tokens that the new rendering shares and buffers only
    /// the rest: call it with the whole conversation at every turn, and each turn computes
    /// only its new tokens. A sliding-window model (Gemma 3) that cannot rewind that far
    /// starts again from nothing (the prefix cache still holds the conversation's full pages).
    ///
    /// ```no_run
    /// use weft::{Engine, Message, Sampler};
    /// let engine = Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// let mut messages = vec![Message::user("Name a colour.")];
    /// for next in ["Another one.", "And a third."] {
    ///     ctx.fill_chat(&messages)?;
    ///     let reply = weft::block_on(ctx.generate(Sampler::Argmax).collect_text())?;
    ///     messages.push(Message::assistant(reply));
    ///     messages.push(Message::user(next));
    /// }
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn fill_chat(&mut self, messages: &[Message]) -> Result<()> {
        let text = self.engine.chat_template()?.render(messages, true)?;
        let ids = self.engine.inner.tokenizer.encode(&text, false, true);
        let keep = match self.rewind_to_shared(&ids) {
            Err(e) if e.is_rewind_past_window() => {
                self.truncate(0)?;
                0
            }
            other => other?,
        };
        self.pending.extend_from_slice(&ids[keep..]);
        Ok(())
    }

    /// Keeps the longest start of the tokens already run that `ids` shares and drops the rest
    /// (and the pending buffer), as [`Context::truncate`] does; returns how many it kept.
    /// Buffering `ids[kept..]` then makes the context hold `ids`, computing only what it did
    /// not hold. Fails as `truncate` does (a sliding window that cannot rewind that far),
    /// leaving the context as it was.
    pub fn rewind_to_shared(&mut self, ids: &[u32]) -> Result<usize> {
        self.settle();
        let shared = self
            .tokens
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count();
        self.truncate(shared)?;
        Ok(shared)
    }

    /// A copy of this context (tokens, pending buffer, random state) that shares every KV page
    /// with it; a page is copied only when one of them first writes into it (the partial last
    /// page, on the next pass). Forking does not wait for the engine's current step.
    pub fn fork(&self) -> Result<Context> {
        let shared = &self.engine.inner.shared;
        let mut n = self.tokens.len();
        if self.inflight.is_some() {
            // A dropped pass may have failed: the cache then holds fewer tokens than recorded.
            shared.wait_idle(self.seq);
            n = n.min(shared.runner().kv().len(self.seq).unwrap_or(0));
        }
        let mut fork = Context {
            engine: self.engine.clone(),
            seq: shared.fork_sequence(self.seq),
            tokens: self.tokens[..n].to_vec(),
            positions: self.positions[..n].to_vec(),
            pending: self.pending.clone(),
            rng: self.rng.clone(),
            inflight: None,
            saved_generator: None,
            embeds: self.embeds.clone(),
            pending_bias: self.pending_bias.clone(),
            custom_attention: self.custom_attention,
            causal: self.causal[..n.min(self.causal.len())].to_vec(),
            last_row: self.last_row.clone().filter(|(i, _)| *i < n),
            abandoned: AbandonSlot::default(),
        };
        // What `settle` will make of this context, the fork takes now: a failed pass undone
        // (its pending tokens and bias rows back), no vectors past what is left.
        match self.inflight.as_ref() {
            Some(r) if r.len == n && n < self.tokens.len() => fork.undo(r.clone()),
            _ => fork.embeds.retain(|&i, _| i < n + fork.pending.len()),
        }
        // A step abandoned with its generator: the fork starts where the step did (a failed
        // truncation drops the fork, which frees its sequence).
        let abandoned = self.abandoned_step().clone();
        if let Some((mark, input)) = abandoned {
            fork.rewind_to(mark)?;
            fork.pending.extend(input);
        }
        Ok(fork)
    }

    /// Keeps the first `n` tokens already run and drops the rest (and the pending buffer).
    /// Rewinding is cheap: pages past the new end go back to the pool. On a model with
    /// sliding-window layers (Gemma 3), a rewind further back than the window from the end
    /// needs keys the cache has already released: it fails (`RewindPastWindow`, see
    /// [`Error::is_rewind_past_window`]) and leaves the context as it was; refill a new
    /// context from [`Context::tokens`] then.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        self.rewind(n, false)
    }

    /// [`Context::truncate`]; `rerun`: token `n` runs again next (a generator's last token,
    /// the token after accepted drafts), so its window's keys must be there, rather than those
    /// of token `n - 1`.
    pub(crate) fn rewind(&mut self, n: usize, rerun: bool) -> Result<()> {
        self.settle();
        if n > self.tokens.len() {
            return Err(Error::TruncateTooLong {
                n,
                len: self.tokens.len(),
            });
        }
        if n < self.tokens.len() {
            let (reply, done) = std::sync::mpsc::sync_channel(1);
            let seq = self.seq;
            self.engine.inner.shared.command(Command::Truncate {
                seq,
                n,
                rerun,
                reply,
            });
            done.recv().unwrap_or(Err(Error::EngineStopped))?;
        }
        self.tokens.truncate(n);
        self.positions.truncate(n);
        self.drop_rows_from(n);
        self.pending.clear();
        self.pending_bias.clear();
        self.embeds.retain(|&i, _| i < n);
        Ok(())
    }

    /// Gives the context's KV pages back to the pool but keeps its tokens: they become pending
    /// again, and the next pass recomputes them (preemption by recomputation, as vLLM does
    /// when the pool runs out). Only for contexts whose tokens sit at consecutive positions
    /// from 0 and ran with causal attention (anything filled and generated normally, input
    /// vectors included); others get [`Error::Config`].
    pub fn evict(&mut self) -> Result<()> {
        self.settle();
        if self
            .positions
            .iter()
            .enumerate()
            .any(|(i, &p)| p as usize != i)
        {
            return Err(Error::Config(
                "evict: the context has custom positions and cannot be recomputed".into(),
            ));
        }
        if self.custom_attention {
            return Err(Error::Config(
                "evict: the context ran with custom attention masks and cannot be recomputed"
                    .into(),
            ));
        }
        let mut tokens = std::mem::take(&mut self.tokens);
        let pending = std::mem::take(&mut self.pending);
        // Indices do not move (run tokens become pending in place): the vectors stay valid.
        let (embeds, bias) = (self.embeds.clone(), std::mem::take(&mut self.pending_bias));
        self.tokens = tokens.clone();
        if let Err(e) = self.truncate(0) {
            self.pending = pending;
            self.embeds = embeds;
            self.pending_bias = bias;
            return Err(e);
        }
        tokens.extend(pending);
        self.pending = tokens;
        self.embeds = embeds;
        self.pending_bias = bias;
        Ok(())
    }

    /// Buffers input vectors for the next pass: `rows` holds one vector of the model's width
    /// (`n_embd`) per id, which the model's first block reads instead of that id's embedding
    /// (image or audio features projected to the model's width, soft prompts). The `ids` are
    /// what the context records in their place (placeholders such as an image token); the
    /// model never sees them. A vector must be what the model feeds its first block: its own
    /// embedding of an id is [`Engine::input_embeddings`] (already scaled, for Gemma).
    ///
    /// `attn_bias`, if given, is an additive attention bias for the new tokens: one row of
    /// `len + n` values per token, row-major, where `len` counts the context's tokens before
    /// them (run and pending) and `n = ids.len()`. Entry `j` of row `i` is added to that
    /// token's score for the `j`-th token of the sequence; `-inf` hides it. Entries past the
    /// token itself (`j > len + i`) must be `-inf`: a token cannot see later ones. Without a
    /// bias, attention is causal.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("Describe the picture: ")?;
    /// let ids = engine.tokenize(" a cat");
    /// let vectors = engine.input_embeddings(&ids)?; // stand-ins for projected image features
    /// ctx.fill_embeds(&ids, &vectors, None)?;
    /// let text = weft::block_on(
    ///     ctx.generate(weft::Sampler::Argmax).max_tokens(16).collect_text(),
    /// )?;
    /// # Ok(()) }
    /// ```
    pub fn fill_embeds(
        &mut self,
        ids: &[u32],
        rows: &[f32],
        attn_bias: Option<&[f32]>,
    ) -> Result<()> {
        self.engine.check_ids(ids.iter().copied())?;
        self.settle();
        let vectors = crate::forward::split_vectors(rows, ids.len(), self.engine.info().n_embd)?;
        let base = self.tokens.len() + self.pending.len();
        let bias = match attn_bias {
            Some(b) => crate::forward::bias_rows(b, base, ids.len())?,
            None => Vec::new(),
        };
        self.pending.extend_from_slice(ids);
        for (k, v) in vectors.into_iter().enumerate() {
            self.embeds.insert(base + k, v);
        }
        for (k, b) in bias.into_iter().enumerate() {
            self.pending_bias.insert(base + k, b);
        }
        Ok(())
    }

    /// Fills input vectors ([`Context::fill_embeds`]), runs them with anything pending and
    /// returns the logits after the last one (seed 002's `prefill_from_embeds`). Generating
    /// afterwards continues from them.
    pub async fn prefill_from_embeds(
        &mut self,
        ids: &[u32],
        embeds: &[f32],
        attn_bias: Option<&[f32]>,
    ) -> Result<Vec<f32>> {
        self.fill_embeds(ids, embeds, attn_bias)?;
        self.flush_logits().await
    }

    /// A forward pass over this context (see [`Forward`]).
    pub fn forward(&mut self) -> Forward<'_> {
        Forward::new(self)
    }

    /// A generation loop over this context (see [`Generator`]) with `sampler`, or with the
    /// engine's default sampler for `None` ([`EngineConfig::generation`]); it starts from the
    /// engine's default stop rules.
    ///
    /// With nothing pending, the first step runs the last token again for its logits, under
    /// the attention mask or bias it ran with; a last token that ran at a position of its own
    /// ([`Forward::input_at`]) cannot be run again so, and that step is [`Error::Config`].
    ///
    /// [`EngineConfig::generation`]: crate::EngineConfig::generation
    pub fn generate(&mut self, sampler: impl Into<Option<Sampler>>) -> Generator<'_> {
        let sampler = sampler
            .into()
            .unwrap_or_else(|| self.engine.config().generation.sampler.clone());
        Generator::new(self, sampler)
    }

    /// Runs the pending tokens and returns the logits after the last one (the seeds'
    /// `prefill_get_last_logits`).
    pub async fn flush_logits(&mut self) -> Result<Vec<f32>> {
        let mut fwd = self.forward();
        let last = fwd.len().checked_sub(1).ok_or(Error::EmptyPass)?;
        let h = fwd.probe(last, Logits);
        let out = fwd.execute().await?;
        Ok(out.logits(h).map(<[f32]>::to_vec).unwrap_or_default())
    }

    /// Fills `tokens`, runs them (with anything pending) and returns the logits after the
    /// last one.
    pub async fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.fill_tokens(tokens)?;
        self.flush_logits().await
    }

    /// Runs one given token and returns the logits after it (the seeds' `decode_get_logits`).
    pub async fn decode(&mut self, token: u32) -> Result<Vec<f32>> {
        self.prefill(&[token]).await
    }
}
