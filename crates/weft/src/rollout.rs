//! Batch rollouts: generate for many prompts at once, each with its own sampling options and
//! stop sequences (the RLHF-rollout use of seed 003), written on [`Context`] and [`Generator`]
//! like any user code — the scheduler batches the contexts' passes into shared model calls.
//!
//! Prompts come as text or ids, or as seed 003's left-padded batch
//! ([`RolloutRequest::from_padded`]); results come ragged ([`Rollout`]) or as seed 003's
//! padded `[batch, total_len]` matrix ([`padded`], [`padded_left_prompts`]).

use futures_util::future::join_all;

use crate::adapter::{Adapter, PassAdapters};
use crate::context::Context;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::generator::{Generator, StopReason};
use crate::kv_wait::{KvWait, KvWaiter};
use weft_core::kv::PAGE_SIZE;
use weft_core::sampling::{validate_logit_bias, Penalties, Sampler};

/// A prompt: text (tokenized with a BOS when the model wants one) or token ids, used as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Prompt {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Prompt {
        Prompt::Text(s)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Prompt {
        Prompt::Tokens(ids)
    }
}

impl From<&[u32]> for Prompt {
    fn from(ids: &[u32]) -> Prompt {
        Prompt::Tokens(ids.to_vec())
    }
}

/// One prompt of a batch and how to continue it.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutRequest {
    /// The prompt: text or ids.
    pub prompt: Prompt,
    pub sampler: Sampler,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Most tokens in prompt + generation (ColossalAI's and Hugging Face's `max_length`);
    /// the tighter of this and `max_tokens` applies.
    pub max_length: Option<usize>,
    /// Stop when the output ends with one of these id sequences (multi-token stops).
    pub stop_sequences: Vec<Vec<u32>>,
    /// Stop on these ids too, besides the model's end-of-turn set (left out of the tokens,
    /// as an end of turn is).
    pub stop_ids: Vec<u32>,
    /// Stop when the output text contains one of these strings (the rollout's tokens keep
    /// the one that completed it; its `text` is cut before it).
    pub stop_strings: Vec<String>,
    /// Generate past the model's end-of-turn set (until `max_tokens` or another stop).
    pub ignore_eos: bool,
    /// Generate at least this many tokens before a stop token may be sampled.
    pub min_tokens: usize,
    /// Repetition / presence / frequency penalties of this request.
    pub penalties: Option<Penalties>,
    /// Logit bias of this request (`-inf` bans an id).
    pub logit_bias: Vec<(u32, f32)>,
    /// Adapters this request runs with, scaled (a policy's LoRA; none: the engine's stack).
    /// Requests with different adapters still share model calls.
    pub adapters: Vec<(Adapter, f32)>,
    /// Sampling seed of this request. A request's rollout depends on its prompt, options and
    /// seed alone: the same prompt with the same seed gives the same rollout however often it
    /// is asked, so sampling several rollouts of one prompt takes one seed each.
    pub seed: u64,
    /// The width of the padded batch the prompt came from ([`RolloutRequest::from_padded`]
    /// sets it): `max_length` then counts it rather than the prompt's own tokens, as
    /// ColossalAI's loop does (every row gets at most `max_length − width` new tokens).
    pub padded_width: Option<usize>,
}

impl RolloutRequest {
    /// A request with `max_tokens` 128, no `max_length`, seed 0, no extra stops, penalties,
    /// bias or adapters.
    pub fn new(prompt: impl Into<Prompt>, sampler: Sampler) -> RolloutRequest {
        RolloutRequest {
            prompt: prompt.into(),
            sampler,
            max_tokens: 128,
            max_length: None,
            stop_sequences: Vec::new(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            penalties: None,
            logit_bias: Vec::new(),
            adapters: Vec::new(),
            seed: 0,
            padded_width: None,
        }
    }

    /// One request per row of a padded batch of prompt ids (seed 003's left-padded
    /// `input_ids` with its `attention_mask`): the padding (mask 0) is dropped, so each row
    /// runs as its own unpadded prompt. Padding may sit on the left or the right of a row,
    /// not in its middle; rows and masks must have the same shape. Row `r` is seeded with `r`
    /// (rows sample independently, as ColossalAI's do, even where prompts repeat), and
    /// `padded_width` records the batch's width for `max_length`.
    ///
    /// ```
    /// use weft::rollout::{Prompt, RolloutRequest};
    /// let pad = 0;
    /// let ids = [vec![pad, pad, 5, 6], vec![7, 8, 9, 10]];
    /// let mask = [vec![0, 0, 1, 1], vec![1, 1, 1, 1]];
    /// let reqs = RolloutRequest::from_padded(&ids, &mask, weft::Sampler::Argmax)?;
    /// assert_eq!(reqs[0].prompt, Prompt::Tokens(vec![5, 6]));
    /// assert_eq!(reqs[1].prompt, Prompt::Tokens(vec![7, 8, 9, 10]));
    /// assert_eq!((reqs[1].seed, reqs[1].padded_width), (1, Some(4)));
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn from_padded(
        input_ids: &[Vec<u32>],
        attention_mask: &[Vec<u8>],
        sampler: Sampler,
    ) -> Result<Vec<RolloutRequest>> {
        let bad = |reason: String| Error::PaddedBatch { reason };
        if input_ids.len() != attention_mask.len() {
            return Err(bad(format!(
                "{} rows of ids but {} rows of attention mask",
                input_ids.len(),
                attention_mask.len()
            )));
        }
        let mut requests = Vec::with_capacity(input_ids.len());
        for (r, (ids, mask)) in input_ids.iter().zip(attention_mask).enumerate() {
            if ids.len() != mask.len() {
                return Err(bad(format!(
                    "row {r} has {} ids but {} mask entries",
                    ids.len(),
                    mask.len()
                )));
            }
            if let Some(v) = mask.iter().find(|&&m| m > 1) {
                return Err(bad(format!("row {r}: mask entry {v} is not 0 or 1")));
            }
            let first = mask.iter().position(|&m| m == 1);
            let last = mask.iter().rposition(|&m| m == 1);
            let (Some(a), Some(b)) = (first, last) else {
                return Err(bad(format!("row {r} is all padding")));
            };
            if mask[a..=b].contains(&0) {
                return Err(bad(format!(
                    "row {r} has padding between its tokens (only left or right padding is accepted)"
                )));
            }
            requests.push(RolloutRequest {
                seed: r as u64,
                padded_width: Some(ids.len()),
                ..RolloutRequest::new(ids[a..=b].to_vec(), sampler.clone())
            });
        }
        Ok(requests)
    }
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// The prompt's tokens.
    pub prompt_tokens: Vec<u32>,
    /// The generated tokens (a stop token excluded, a stop sequence included).
    pub tokens: Vec<u32>,
    /// The generated text (cut before a stop string).
    pub text: String,
    /// Why it stopped (`None` in a partial result).
    pub stop: Option<StopReason>,
}

impl Rollout {
    /// Prompt, generated tokens and the stop token that ended it, if one did: the row
    /// ColossalAI's and Hugging Face's `generate` return (they keep the EOS).
    pub fn sequence(&self) -> Vec<u32> {
        let mut s = self.prompt_tokens.clone();
        s.extend_from_slice(&self.tokens);
        if let Some(StopReason::StopToken(t)) = self.stop {
            s.push(t);
        }
        s
    }
}

/// A batch of sequences as one `[batch, total_len]` matrix of ids (seed 003's output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaddedBatch {
    /// Rows.
    pub batch: usize,
    /// Columns: the longest row.
    pub total_len: usize,
    /// `batch × total_len` ids, row-major.
    pub ids: Vec<u32>,
    /// `batch × total_len`: 1 where `ids` holds a real token, 0 on padding.
    pub attention_mask: Vec<u8>,
}

impl PaddedBatch {
    /// Row `i` (padding included). Panics when `i >= batch`, as indexing a slice does.
    pub fn row(&self, i: usize) -> &[u32] {
        &self.ids[i * self.total_len..(i + 1) * self.total_len]
    }

    /// Widens every row to `width` columns with `pad_token_id` on the right (ColossalAI's
    /// `early_stopping=False` output is `max_length` wide); a narrower `width` changes nothing.
    pub fn pad_to(&mut self, width: usize, pad_token_id: u32) {
        if width <= self.total_len {
            return;
        }
        let old = self.total_len;
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for i in 0..self.batch {
            ids.extend_from_slice(&self.ids[i * old..(i + 1) * old]);
            ids.extend(std::iter::repeat_n(pad_token_id, width - old));
            mask.extend_from_slice(&self.attention_mask[i * old..(i + 1) * old]);
            mask.extend(std::iter::repeat_n(0, width - old));
        }
        (self.ids, self.attention_mask, self.total_len) = (ids, mask, width);
    }
}

/// Every rollout's [`Rollout::sequence`] (prompt, generated ids, EOS kept), right-padded with
/// `pad_token_id` to the longest.
///
/// ```
/// use weft::rollout::{padded, Rollout};
/// use weft::StopReason;
/// let r = |p: &[u32], t: &[u32], stop| Rollout {
///     prompt_tokens: p.to_vec(), tokens: t.to_vec(), text: String::new(), stop: Some(stop),
/// };
/// let eos = 2;
/// let out = padded(&[r(&[1, 5], &[6], StopReason::StopToken(eos)), r(&[1], &[7, 8, 9], StopReason::MaxTokens)], 0);
/// assert_eq!((out.batch, out.total_len), (2, 4));
/// assert_eq!(out.row(0), &[1, 5, 6, eos]);
/// assert_eq!(out.row(1), &[1, 7, 8, 9]);
/// let mut wide = out.clone();
/// wide.pad_to(6, 0);
/// assert_eq!(wide.row(0), &[1, 5, 6, eos, 0, 0]);
/// assert_eq!(&wide.attention_mask[..6], &[1, 1, 1, 1, 0, 0]);
/// ```
pub fn padded(rollouts: &[Rollout], pad_token_id: u32) -> PaddedBatch {
    let rows: Vec<(usize, Vec<u32>)> = rollouts.iter().map(|r| (0, r.sequence())).collect();
    pad_rows(&rows, pad_token_id)
}

/// ColossalAI's exact layout: prompts left-padded to `width` (the padded input's width; at
/// least the longest prompt, which `None` means), so every generation starts in the same
/// column, then the generated ids (EOS kept), right-padded with `pad_token_id`.
pub fn padded_left_prompts(
    rollouts: &[Rollout],
    width: Option<usize>,
    pad_token_id: u32,
) -> PaddedBatch {
    let longest = rollouts
        .iter()
        .map(|r| r.prompt_tokens.len())
        .max()
        .unwrap_or(0);
    let width = width.unwrap_or(0).max(longest);
    let rows: Vec<(usize, Vec<u32>)> = rollouts
        .iter()
        .map(|r| (width - r.prompt_tokens.len(), r.sequence()))
        .collect();
    pad_rows(&rows, pad_token_id)
}

/// Rows of `(left padding, ids)`, right-padded to the longest.
fn pad_rows(rows: &[(usize, Vec<u32>)], pad: u32) -> PaddedBatch {
    let total_len = rows.iter().map(|(l, r)| l + r.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(rows.len() * total_len);
    let mut attention_mask = Vec::with_capacity(rows.len() * total_len);
    for (left, row) in rows {
        let right = total_len - left - row.len();
        ids.extend(std::iter::repeat_n(pad, *left));
        ids.extend_from_slice(row);
        ids.extend(std::iter::repeat_n(pad, right));
        attention_mask.extend(std::iter::repeat_n(0, *left));
        attention_mask.extend(std::iter::repeat_n(1, row.len()));
        attention_mask.extend(std::iter::repeat_n(0, right));
    }
    PaddedBatch {
        batch: rows.len(),
        total_len,
        ids,
        attention_mask,
    }
}

/// Generates for every request at once and returns every sequence, in request order.
///
/// A request that cannot run (an empty prompt, one longer than the context, an id past the
/// vocabulary, an invalid sampler, logit bias, penalty or adapter) fails the batch before any
/// pass, with [`Error::InRequest`] naming it.
///
/// A batch larger than the KV cache holds at once still runs: rollouts start in order while
/// their worst case (prompt + `max_tokens`, at most the context length) fits the pages free
/// when the batch began, and each finished rollout gives its pages back for the next. A step
/// that finds the cache full all the same (another context of the engine took pages) waits for
/// a later round, its KV recomputed, as the server preempts. When no rollout of a round could
/// step, the batch waits for the other contexts to give pages back (another batch on other
/// threads, say); the error comes when a rollout needs more pages than the whole cache has,
/// or none were given back for 30 s. The results do not depend on how the batch was split.
///
/// ```no_run
/// use weft::rollout::{generate_batch, RolloutRequest};
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let reqs: Vec<_> = ["Hi", "Once upon a time"]
///     .iter()
///     .map(|p| RolloutRequest::new(*p, weft::Sampler::TopK { k: 40, temperature: 0.8 }))
///     .collect();
/// for r in weft::block_on(generate_batch(&engine, &reqs))? {
///     println!("{:?}", r.text);
/// }
/// # Ok(()) }
/// ```
pub async fn generate_batch(engine: &Engine, requests: &[RolloutRequest]) -> Result<Vec<Rollout>> {
    generate_batch_streaming(engine, requests, 0, |_| {}).await
}

/// A context for `r`, seeded and filled with its prompt, after checking what would make it fail
/// later: ids past the vocabulary (a stop sequence with one could never match), an invalid
/// sampler, logit bias, penalties or adapter, an empty prompt, one longer than the context.
fn start(engine: &Engine, r: &RolloutRequest) -> Result<Context> {
    let vocab = engine.info().vocab_size;
    r.sampler.validate(vocab)?;
    validate_logit_bias(&r.logit_bias, vocab)?;
    if let Some(p) = &r.penalties {
        p.validate()?;
    }
    PassAdapters {
        stack: r.adapters.clone(),
        zo: None,
    }
    .resolve(engine)?;
    engine.check_ids(
        r.stop_sequences
            .iter()
            .flatten()
            .chain(&r.stop_ids)
            .copied(),
    )?;
    let mut ctx: Context = engine.context();
    ctx.set_seed(r.seed);
    match &r.prompt {
        Prompt::Text(t) => ctx.fill(t)?,
        Prompt::Tokens(ids) => ctx.fill_tokens(ids)?,
    }
    let len = ctx.pending().len();
    if len == 0 {
        return Err(Error::EmptyPass);
    }
    if len > engine.n_ctx() {
        return Err(Error::ContextTooLong {
            len,
            n_ctx: engine.n_ctx(),
        });
    }
    Ok(ctx)
}

/// [`generate_batch`] that calls `on_partial` with every sequence so far after each `every`
/// steps — `every` tokens per unfinished sequence (`every = 0`: never).
pub async fn generate_batch_streaming(
    engine: &Engine,
    requests: &[RolloutRequest],
    every: usize,
    mut on_partial: impl FnMut(&[Rollout]),
) -> Result<Vec<Rollout>> {
    let mut contexts = Vec::with_capacity(requests.len());
    let mut prompts = Vec::with_capacity(requests.len());
    for (index, r) in requests.iter().enumerate() {
        let ctx = start(engine, r).map_err(|e| Error::InRequest {
            index,
            source: Box::new(e),
        })?;
        prompts.push(ctx.pending().to_vec());
        contexts.push(ctx);
    }
    let mut gens: Vec<Generator<'_>> = contexts
        .iter_mut()
        .zip(requests)
        .zip(&prompts)
        .map(|((ctx, r), prompt)| {
            let width = r.padded_width.unwrap_or(prompt.len());
            let room = r.max_length.map_or(usize::MAX, |m| m.saturating_sub(width));
            let mut g = ctx
                .generate(r.sampler.clone())
                .max_tokens(r.max_tokens.min(room))
                .min_tokens(r.min_tokens)
                .logit_bias(&r.logit_bias);
            if r.ignore_eos {
                g = g.ignore_eos();
            }
            if let Some(p) = &r.penalties {
                g = g.penalties(p.clone());
            }
            for (a, scale) in &r.adapters {
                g = g.adapter(a, *scale);
            }
            for s in &r.stop_sequences {
                g = g.stop_sequence(s);
            }
            for s in &r.stop_strings {
                g = g.stop_string(s);
            }
            g.stop(&r.stop_ids)
        })
        .collect();
    let snapshot = |gens: &[Generator<'_>], done: bool| -> Result<Vec<Rollout>> {
        gens.iter()
            .zip(&prompts)
            .map(|(g, p)| {
                Ok(Rollout {
                    prompt_tokens: p.clone(),
                    tokens: g.tokens().to_vec(),
                    // As the generator streams it: control tokens not rendered, cut before
                    // a stop string.
                    text: g.text().to_string(),
                    stop: if done { g.stop_reason().cloned() } else { None },
                })
            })
            .collect()
    };
    // Each rollout's worst case in KV slots, and what the cache had free at the start.
    let need: Vec<usize> = gens
        .iter()
        .zip(&prompts)
        .map(|(g, p)| {
            let most = p.len().saturating_add(g.rules().max_tokens);
            most.min(engine.n_ctx()).div_ceil(PAGE_SIZE) * PAGE_SIZE
        })
        .collect();
    let budget = engine.kv_free_tokens();
    let mut started = 0;
    let mut released = vec![false; gens.len()];
    let mut round = 0;
    let mut waiter = KvWaiter::default();
    // Lockstep: one step of every started, unfinished generator per round, polled together.
    while gens.iter().any(|g| !g.is_done()) {
        let mut held: usize = (0..started)
            .filter(|&i| !gens[i].is_done())
            .map(|i| need[i])
            .sum();
        while started < gens.len() && (held == 0 || held + need[started] <= budget) {
            held += need[started];
            started += 1;
        }
        let steps = gens[..started]
            .iter_mut()
            .enumerate()
            .filter(|(_, g)| !g.is_done())
            .map(|(index, g)| async move {
                let stepped = async {
                    match g.next()? {
                        Some(step) => step.execute().await.map(|_| ()),
                        None => Ok(()),
                    }
                }
                .await;
                let result = match stepped {
                    // Its pages go back; it recomputes them in a later round.
                    Err(e) if e.is_kv_full() => g.evict().map(|()| Err(e)),
                    other => other.map(Ok),
                };
                // A step's own failure names its request, as one found before the batch does.
                result.map_err(|e| Error::InRequest {
                    index,
                    source: Box::new(e),
                })
            });
        let mut full = None;
        let mut stepped = false;
        for r in join_all(steps).await {
            match r? {
                Ok(()) => stepped = true,
                Err(e) => full = Some(e),
            }
        }
        if let Some(e) = full {
            // When no rollout could step, none holds pages now: other contexts of the engine
            // (another batch, a generation) do, and the batch waits for them.
            match waiter.next(engine, stepped, &e) {
                KvWait::GiveUp => return Err(e),
                KvWait::Retry => {}
                KvWait::Sleep(pause) => crate::executor::sleep(pause).await,
            }
        }
        // A finished rollout's pages are free for the next (its tokens stay readable).
        for (g, freed) in gens[..started].iter_mut().zip(&mut released) {
            if g.is_done() && !*freed {
                g.evict()?;
                *freed = true;
            }
        }
        round += 1;
        if every > 0 && round % every == 0 && gens.iter().any(|g| !g.is_done()) {
            on_partial(&snapshot(&gens, false)?);
        }
    }
    snapshot(&gens, true)
}
