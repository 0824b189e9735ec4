//! Beam search with Hugging Face's semantics (`generate(num_beams=…)`), written on the public
//! API like any user code: every beam is a [`Context`] forked from its parent (sharing all KV
//! pages, so the prompt is never recomputed), and all beams of a step submit their passes at
//! once, so the scheduler runs them in one model call.
//!
//! ```no_run
//! use weft::beam::{beam_search, BeamSearchConfig};
//! # fn main() -> weft::Result<()> {
//! let engine = weft::Engine::load("smollm2-135m")?;
//! // Token ids, with the BOS the model wants.
//! let prompt = engine.tokenizer().encode("The best way to learn a language is", true, true);
//! let config = BeamSearchConfig::new(4).max_new_tokens(16).num_return_sequences(2);
//! for h in weft::block_on(beam_search(&engine, &prompt, &config))? {
//!     println!("{:.3} {}", h.score, engine.detokenize(h.generated())?);
//! }
//! # Ok(()) }
//! ```
//!
//! The bookkeeping (which candidates continue, which finish, when to stop) is [`BeamScorer`],
//! a state machine without a model.

use std::fmt;
use std::sync::Arc;

use futures_util::future::join_all;

use crate::context::Context;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::probe::{Distribution, Logprobs};

mod scorer;

pub use scorer::BeamScorer;

/// When beam search stops, as Hugging Face's `early_stopping`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EarlyStopping {
    /// `True`: stop as soon as `num_beams` hypotheses have finished.
    True,
    /// `False` (the default): stop when the best running beam, scored at its current length,
    /// can no longer beat the worst of `num_beams` finished hypotheses (a heuristic).
    #[default]
    False,
    /// `"never"`: as `False`, but with a positive length penalty the best running beam is
    /// scored at the longest it may grow (`max_new_tokens`), so the search stops only when no
    /// better hypothesis can be found (the canonical beam search).
    Never,
}

/// Which tokens a beam may continue with, given its sequence (prompt first).
type AllowedFn = Arc<dyn Fn(&[u32]) -> Vec<u32> + Send + Sync>;

/// How a beam search runs. Built with [`BeamSearchConfig::new`] and the builder methods;
/// every default is Hugging Face's.
#[derive(Clone)]
pub struct BeamSearchConfig {
    pub(crate) num_beams: usize,
    pub(crate) max_new_tokens: usize,
    pub(crate) length_penalty: f32,
    pub(crate) early_stopping: EarlyStopping,
    pub(crate) num_return_sequences: usize,
    pub(crate) eos: Option<Vec<u32>>,
    pub(crate) allowed: Option<AllowedFn>,
}

impl fmt::Debug for BeamSearchConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BeamSearchConfig")
            .field("num_beams", &self.num_beams)
            .field("max_new_tokens", &self.max_new_tokens)
            .field("length_penalty", &self.length_penalty)
            .field("early_stopping", &self.early_stopping)
            .field("num_return_sequences", &self.num_return_sequences)
            .field("eos_token_ids", &self.eos)
            .field("allowed_tokens", &self.allowed.as_ref().map(|_| "fn"))
            .finish()
    }
}

impl BeamSearchConfig {
    /// `num_beams` beams (the width, at least 1), with `max_new_tokens` 20, `length_penalty`
    /// 1.0, [`EarlyStopping::False`], one returned sequence, the engine's end-of-turn set as
    /// EOS ids and no restriction of the vocabulary.
    pub fn new(num_beams: usize) -> BeamSearchConfig {
        BeamSearchConfig {
            num_beams,
            max_new_tokens: 20,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::False,
            num_return_sequences: 1,
            eos: None,
            allowed: None,
        }
    }

    /// The most tokens a hypothesis generates (default 20; at least 1). A beam that reaches it
    /// finishes there.
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.max_new_tokens = n;
        self
    }

    /// The exponent `α` of the length normalisation: a finished hypothesis scores
    /// `sum of log-probabilities / generated_len^α`, where `generated_len` counts the tokens
    /// after the prompt, its EOS included (default 1.0). `α > 0` favours longer sequences,
    /// `α < 0` shorter ones, 0 ranks by the plain sum.
    pub fn length_penalty(mut self, alpha: f32) -> Self {
        self.length_penalty = alpha;
        self
    }

    /// When to stop (default [`EarlyStopping::False`]).
    pub fn early_stopping(mut self, e: EarlyStopping) -> Self {
        self.early_stopping = e;
        self
    }

    /// How many hypotheses to return, best first (default 1; at most `num_beams`).
    pub fn num_return_sequences(mut self, n: usize) -> Self {
        self.num_return_sequences = n;
        self
    }

    /// The ids that end a hypothesis (default: the engine's end-of-turn set,
    /// [`Engine::stop_tokens`]; [`BeamScorer`] alone has none). An empty list generates
    /// `max_new_tokens` tokens in every hypothesis.
    pub fn eos_token_ids(mut self, ids: Vec<u32>) -> Self {
        self.eos = Some(ids);
        self
    }

    /// One EOS id (see [`BeamSearchConfig::eos_token_ids`]).
    pub fn eos_token_id(self, id: u32) -> Self {
        self.eos_token_ids(vec![id])
    }

    /// Restricts every step to `ids` (see [`BeamSearchConfig::prefix_allowed_tokens`]).
    pub fn allowed_tokens(self, ids: Vec<u32>) -> Self {
        self.prefix_allowed_tokens(move |_: &[u32]| ids.clone())
    }

    /// Restricts each beam's next token to what `f` returns for its sequence (prompt first),
    /// as Hugging Face's `prefix_allowed_tokens_fn`. As there, the mask applies to the
    /// log-softmax over the whole vocabulary: the allowed tokens keep their log-probabilities,
    /// which are not renormalised. An empty list is [`Error::NothingAllowed`].
    pub fn prefix_allowed_tokens(
        mut self,
        f: impl Fn(&[u32]) -> Vec<u32> + Send + Sync + 'static,
    ) -> Self {
        self.allowed = Some(Arc::new(f));
        self
    }

    /// Checks the options: `num_beams`, `max_new_tokens` and `num_return_sequences` at least 1,
    /// `num_return_sequences` at most `num_beams`, a finite length penalty.
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::BeamSearch { reason });
        if self.num_beams == 0 {
            return bad("num_beams must be at least 1".into());
        }
        // Each step ranks `max(2, 1 + eos ids) × num_beams` candidates (Hugging Face's
        // `beams_to_keep`): a count that does not fit in memory is refused, not overflowed.
        let keep = 2.max(1 + self.eos.as_ref().map_or(0, Vec::len));
        if self
            .num_beams
            .checked_mul(keep)
            .is_none_or(|n| n > u32::MAX as usize)
        {
            return bad(format!("num_beams {} is too large", self.num_beams));
        }
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens must be at least 1".into());
        }
        if self.num_return_sequences == 0 || self.num_return_sequences > self.num_beams {
            return bad(format!(
                "num_return_sequences ({}) must be between 1 and num_beams ({})",
                self.num_return_sequences, self.num_beams
            ));
        }
        if !self.length_penalty.is_finite() {
            return bad(format!(
                "length_penalty {} is not finite",
                self.length_penalty
            ));
        }
        Ok(())
    }
}

/// A finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamHypothesis {
    /// The prompt's tokens, then the generated ones (ending with the EOS id when it ended on
    /// one, as Hugging Face's sequences).
    pub tokens: Vec<u32>,
    /// How many of `tokens` are the prompt.
    pub prompt_len: usize,
    /// The normalised score: `sum_logprobs / generated_len^length_penalty`.
    pub score: f32,
    /// The sum of the generated tokens' log-probabilities (natural log).
    pub sum_logprobs: f32,
}

impl BeamHypothesis {
    /// The generated tokens (after the prompt).
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len.min(self.tokens.len())..]
    }
}

/// Beam search from `prompt` (token ids, not empty): the best `num_return_sequences`
/// hypotheses by normalised score, best first, each with the prompt's tokens first. Seed
/// 004's `beam_generate`; [`beam_generate`] is its blocking form.
///
/// Follows Hugging Face's `generate(num_beams=…)` (see [`BeamScorer`]): each step keeps the
/// `max(2, 1 + n_eos) · num_beams` best continuations over all beams by summed log-probability
/// (log-softmax of the raw logits); those among the first `num_beams` that end with an EOS id
/// or at `max_new_tokens` become hypotheses, scored with the length penalty; the best
/// `num_beams` others continue; [`EarlyStopping`] says when to stop. One beam is greedy
/// decoding, as in Hugging Face (its hypothesis ends at the first EOS id).
///
/// Each beam's log-probabilities come from one pass with a top-`K` [`Distribution`] probe
/// (`ln p`, within about 1e-7 of the log-softmax; a token whose probability underflows f32, a
/// log-probability below about −87, is left out) or, with
/// [`BeamSearchConfig::prefix_allowed_tokens`], a [`Logprobs`] probe of the allowed ids.
///
/// Errors before anything runs: [`Error::BeamSearch`] for options out of range,
/// [`Error::EmptyPass`] for an empty prompt, [`Error::ContextTooLong`] when the prompt and
/// `max_new_tokens` do not fit the context; during the search, any pass's error. Every beam's
/// pages are freed on return, whatever the outcome.
///
/// ```no_run
/// use weft::beam::{beam_search, BeamSearchConfig, EarlyStopping};
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let prompt = engine.tokenize("<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n");
/// let config = BeamSearchConfig::new(3)
///     .max_new_tokens(24)
///     .early_stopping(EarlyStopping::True)
///     .num_return_sequences(3);
/// let best = weft::block_on(beam_search(&engine, &prompt, &config))?;
/// assert!(best.windows(2).all(|w| w[0].score >= w[1].score));
/// # Ok(()) }
/// ```
#[doc(alias = "beam_generate")]
pub async fn beam_search(
    engine: &Engine,
    prompt: &[u32],
    config: &BeamSearchConfig,
) -> Result<Vec<BeamHypothesis>> {
    config.validate()?;
    if prompt.is_empty() {
        return Err(Error::EmptyPass);
    }
    let mut root = engine.context();
    root.fill_tokens(prompt)?;
    search(root, config).await
}

/// [`beam_search`] continuing `ctx`: its tokens (run and pending) are the prompt, and its KV
/// pages are shared, not recomputed (when nothing is pending, its last token runs again to
/// give the first step's distribution). `ctx` itself is left as it is.
///
/// ```no_run
/// use weft::beam::{beam_search_from, BeamSearchConfig};
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("A haiku about looms:\n")?;
/// weft::block_on(ctx.flush_logits())?; // the prompt is in the KV cache
/// let best = weft::block_on(beam_search_from(&ctx, &BeamSearchConfig::new(4)))?;
/// println!("{}", engine.detokenize(best[0].generated())?);
/// # Ok(()) }
/// ```
pub async fn beam_search_from(
    ctx: &Context,
    config: &BeamSearchConfig,
) -> Result<Vec<BeamHypothesis>> {
    config.validate()?;
    if ctx.is_empty() {
        return Err(Error::EmptyPass);
    }
    let mut root = ctx.fork()?;
    if root.pending().is_empty() {
        // Nothing pending: recompute the last token's logits (with its input vector, if any).
        root.unrun_last()?;
    }
    search(root, config).await
}

/// Seed 004's `beam_generate(prompt_tokens, &config, eos_token_id)`: [`beam_search`] with
/// `eos_token_id` as the only EOS id, blocking (see [`crate::block_on`]).
///
/// ```no_run
/// use weft::beam::{beam_generate, BeamSearchConfig};
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// // Token ids, with the BOS the model wants.
/// let prompt = engine.tokenizer().encode("The capital of France is", true, true);
/// let Some(eos) = engine.tokenizer().vocab().special().eos else {
///     return Ok(()); // a model without an EOS: `beam_search` takes its stop set instead
/// };
/// let best = beam_generate(&engine, &prompt, &BeamSearchConfig::new(4), eos)?;
/// println!("{}", engine.detokenize(best[0].generated())?);
/// # Ok(()) }
/// ```
pub fn beam_generate(
    engine: &Engine,
    prompt_tokens: &[u32],
    config: &BeamSearchConfig,
    eos_token_id: u32,
) -> Result<Vec<BeamHypothesis>> {
    let config = config.clone().eos_token_id(eos_token_id);
    crate::block_on(beam_search(engine, prompt_tokens, &config))
}

/// A running beam's context, and whether it was the parent's own context (rather than a
/// fork made this step).
struct Beam {
    ctx: Context,
    reused: bool,
}

/// Runs the search from `root`, whose pending tokens end with the last prompt token.
async fn search(root: Context, config: &BeamSearchConfig) -> Result<Vec<BeamHypothesis>> {
    let engine = root.engine().clone();
    // An EOS id past the vocabulary could never end a beam: refused.
    engine.check_ids(config.eos.iter().flatten().copied())?;
    let mut config = config.clone();
    if config.eos.is_none() {
        config.eos = Some(engine.stop_tokens().to_vec());
    }
    let prompt: Vec<u32> = root
        .tokens()
        .iter()
        .chain(root.pending())
        .copied()
        .collect();
    // Checks the options first (`max_new_tokens` ≥ 1 below).
    let mut scorer = BeamScorer::new(&prompt, &config)?;
    // Every beam writes its next token into a page of its own (the prompt's last page copied
    // on write): a width whose pages do not fit the cache at all fails now, not after the
    // first steps have run.
    let page = weft_core::kv::PAGE_SIZE;
    let capacity = engine.config().kv_tokens / page;
    let least = prompt.len() / page + config.num_beams;
    if least > capacity {
        return Err(Error::BeamSearch {
            reason: format!(
                "{} beams need at least {least} KV pages of {page} tokens (one each, and the \
                 prompt's), and the cache has {capacity}: use fewer beams or a larger KV cache \
                 (kv_tokens)",
                config.num_beams
            ),
        });
    }
    // The last pass runs every token but the final generated one.
    let needed = prompt.len().saturating_add(config.max_new_tokens - 1);
    if needed > engine.n_ctx() {
        return Err(Error::ContextTooLong {
            len: needed,
            n_ctx: engine.n_ctx(),
        });
    }
    let mut beams = vec![Beam {
        ctx: root,
        reused: true,
    }];
    while !scorer.is_done() {
        let horizon = config
            .max_new_tokens
            .saturating_sub(scorer.generated_len() + 1);
        let candidates = score_step(&mut beams, &scorer, &config, horizon).await?;
        let parents = scorer.step(&candidates)?;
        beams = if scorer.is_done() {
            Vec::new()
        } else {
            branch(beams, &parents, &scorer)?
        };
    }
    Ok(scorer.finish())
}

/// Runs one pass per beam, all submitted together so that they share one model call, and
/// returns each beam's candidates. Fresh forks submit first and the beams that ran last
/// step (which the scheduler waits for, having been told of more passes) last, so that the
/// step starts only once every pass is in.
async fn score_step(
    beams: &mut [Beam],
    scorer: &BeamScorer,
    config: &BeamSearchConfig,
    horizon: usize,
) -> Result<Vec<Vec<(u32, f32)>>> {
    let k = scorer.candidates_per_beam();
    let mut passes = Vec::with_capacity(beams.len());
    for (i, (beam, seq)) in beams.iter_mut().zip(scorer.running()).enumerate() {
        let allowed = match &config.allowed {
            Some(f) => {
                let mut ids = f(seq);
                ids.sort_unstable();
                ids.dedup();
                if ids.is_empty() {
                    return Err(Error::NothingAllowed);
                }
                Some(ids)
            }
            None => None,
        };
        passes.push((
            beam.reused,
            i,
            score_beam(&mut beam.ctx, allowed, k, horizon),
        ));
    }
    passes.sort_by_key(|p| p.0);
    let order: Vec<usize> = passes.iter().map(|p| p.1).collect();
    let results = join_all(passes.into_iter().map(|p| p.2)).await;
    let mut out = vec![Vec::new(); order.len()];
    for (i, r) in order.into_iter().zip(results) {
        out[i] = r?;
    }
    Ok(out)
}

/// One beam's pass: its pending token, and the log-probabilities of its `k` most likely
/// next tokens (from a top-`k` distribution probe) or of the allowed ones.
async fn score_beam(
    ctx: &mut Context,
    allowed: Option<Vec<u32>>,
    k: usize,
    horizon: usize,
) -> Result<Vec<(u32, f32)>> {
    let mut fwd = ctx.forward();
    fwd.horizon(horizon);
    let last = fwd.len().checked_sub(1).ok_or(Error::EmptyPass)?;
    match allowed {
        Some(ids) => {
            let h = fwd.probe(last, Logprobs(ids.clone()));
            let out = fwd.execute().await?;
            let lps = out.logprobs(h).unwrap_or_default();
            Ok(ids.into_iter().zip(lps.iter().copied()).collect())
        }
        None => {
            let h = fwd.probe(
                last,
                Distribution {
                    temperature: 1.0,
                    k,
                },
            );
            let out = fwd.execute().await?;
            let (ids, probs) = out.distribution(h).unwrap_or_default();
            Ok(ids
                .iter()
                .zip(probs)
                .map(|(&id, &p)| (id, p.ln()))
                .collect())
        }
    }
}

/// The contexts of the new running beams: each extends its parent with its new token. A
/// parent's last child takes the parent's context; the others fork it (sharing its pages).
/// Parents without children are dropped here, freeing their pages.
fn branch(beams: Vec<Beam>, parents: &[usize], scorer: &BeamScorer) -> Result<Vec<Beam>> {
    let mut children = vec![0usize; beams.len()];
    for &p in parents {
        children[p] += 1;
    }
    let mut old: Vec<Option<Context>> = beams.into_iter().map(|b| Some(b.ctx)).collect();
    let mut next = Vec::with_capacity(parents.len());
    for (&p, seq) in parents.iter().zip(scorer.running()) {
        children[p] -= 1;
        let parent = old.get_mut(p).ok_or(Error::BeamSearch {
            reason: format!("no running beam {p}"),
        })?;
        let (mut ctx, reused) = match (children[p], parent.take()) {
            (0, Some(ctx)) => (ctx, true),
            (_, Some(ctx)) => {
                let fork = ctx.fork();
                *parent = Some(ctx);
                (fork?, false)
            }
            (_, None) => {
                return Err(Error::BeamSearch {
                    reason: format!("running beam {p} extended after it was taken"),
                })
            }
        };
        let token = seq.last().copied().unwrap_or_default();
        ctx.fill_tokens(&[token])?;
        next.push(Beam { ctx, reused });
    }
    Ok(next)
}

#[cfg(test)]
mod tests;
