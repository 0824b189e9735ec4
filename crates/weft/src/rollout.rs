//! Batch rollouts: generate for many prompts at once, each with its own sampling options and
//! stop sequences (the RLHF-rollout use of seed 003), written on [`Context`] and [`Generator`]
//! like any user code — the scheduler batches the contexts' passes into shared model calls.

use futures_util::future::join_all;

use crate::context::Context;
use crate::engine::Engine;
use crate::error::Result;
use crate::generator::{Generator, StopReason};
use weft_core::sampling::Sampler;

/// One prompt of a batch and how to continue it.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutRequest {
    /// The prompt text (a BOS is added when the model wants one).
    pub prompt: String,
    pub sampler: Sampler,
    pub max_tokens: usize,
    /// Stop when the output ends with one of these id sequences (multi-token stops).
    pub stop_sequences: Vec<Vec<u32>>,
    /// Sampling seed of this request.
    pub seed: u64,
}

impl RolloutRequest {
    /// A request with `max_tokens` 128, seed 0 and no extra stop sequences.
    pub fn new(prompt: impl Into<String>, sampler: Sampler) -> RolloutRequest {
        RolloutRequest {
            prompt: prompt.into(),
            sampler,
            max_tokens: 128,
            stop_sequences: Vec::new(),
            seed: 0,
        }
    }
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// The prompt's tokens.
    pub prompt_tokens: Vec<u32>,
    /// The generated tokens (a stop token excluded, a stop sequence included).
    pub tokens: Vec<u32>,
    /// The generated text.
    pub text: String,
    /// Why it stopped (`None` in a partial result).
    pub stop: Option<StopReason>,
}

/// Generates for every request at once and returns every sequence, in request order.
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
    for r in requests {
        let mut ctx: Context = engine.context();
        ctx.set_seed(r.seed);
        ctx.fill(&r.prompt)?;
        prompts.push(ctx.pending().to_vec());
        contexts.push(ctx);
    }
    let mut gens: Vec<Generator<'_>> = contexts
        .iter_mut()
        .zip(requests)
        .map(|(ctx, r)| {
            let g = ctx.generate(r.sampler.clone()).max_tokens(r.max_tokens);
            r.stop_sequences.iter().fold(g, |g, s| g.stop_sequence(s))
        })
        .collect();
    let snapshot = |gens: &[Generator<'_>], done: bool| -> Result<Vec<Rollout>> {
        gens.iter()
            .zip(&prompts)
            .map(|(g, p)| {
                Ok(Rollout {
                    prompt_tokens: p.clone(),
                    tokens: g.tokens().to_vec(),
                    text: engine.detokenize(g.tokens())?,
                    stop: if done { g.stop_reason().cloned() } else { None },
                })
            })
            .collect()
    };
    let mut round = 0;
    // Lockstep: one step of every unfinished generator per round, polled together.
    while gens.iter().any(|g| !g.is_done()) {
        let steps = gens
            .iter_mut()
            .filter(|g| !g.is_done())
            .map(|g| async move {
                match g.next()? {
                    Some(step) => step.execute().await.map(|_| ()),
                    None => Ok(()),
                }
            });
        for r in join_all(steps).await {
            r?;
        }
        round += 1;
        if every > 0 && round % every == 0 && gens.iter().any(|g| !g.is_done()) {
            on_partial(&snapshot(&gens, false)?);
        }
    }
    snapshot(&gens, true)
}
