//! Running one request on the engine: each prompt is prefilled once and forked into its `n`
//! choices (so they share the prompt's KV pages), every choice runs its own generator, and
//! their outputs go to the response as [`Event`]s over a channel. A closed channel (the
//! client went away) ends the generation at the next step, and dropping the contexts gives
//! their pages back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use weft::{Context, Distribution, Engine, Logits, Logprob, ProbeHandle, StopReason};

use crate::error::ApiError;
use crate::params::GenParams;
use crate::state::State;
use crate::text::{clamp_logprob, logprob_entry, prompt_logprobs, Delta, PromptScore, TextTracker};

/// What one request runs.
#[derive(Debug, Clone)]
pub struct Job {
    /// One token list per prompt; each gets `params.n` choices.
    pub prompts: Vec<Vec<u32>>,
    pub params: GenParams,
    /// The seed of each prompt's choice 0; its choice `j` uses `seed + j`.
    pub seed: u64,
    /// When the request arrived (for time-to-first-token).
    pub arrived: Instant,
    /// Score each prompt (`echo` with `logprobs`): its tokens' log-probabilities with this
    /// many alternatives each, sent to every choice as the prompt's text before its output.
    pub score_prompt: Option<usize>,
    /// Per prompt: its first token is a BOS weft added to a text prompt (an echo leaves it
    /// out of the text). Empty for chat.
    pub added_bos: Vec<bool>,
}

/// Why a choice ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the generation tells the response.
#[derive(Debug)]
pub enum Event {
    /// New visible output of a choice.
    Delta { choice: usize, delta: Delta },
    /// A choice ended after `tokens` generated tokens.
    Finish {
        choice: usize,
        finish: Finish,
        tokens: usize,
    },
    /// The engine failed; nothing more follows.
    Failed(ApiError),
}

/// How a request went, for the log and the counters.
#[derive(Debug, Default)]
pub struct Summary {
    pub prompt_tokens: usize,
    pub tokens: usize,
    pub first_token: Option<Instant>,
    /// One per finished choice.
    pub finishes: Vec<Finish>,
    pub cancelled: bool,
    pub error: Option<String>,
}

/// Per-request counts the choices update.
#[derive(Debug, Default)]
struct Stats {
    tokens: AtomicUsize,
    first_token: Mutex<Option<Instant>>,
    finishes: Mutex<Vec<Finish>>,
}

/// How long a client may leave its stream unread before it counts as gone (its request then
/// ends and gives its KV pages back instead of holding them while blocked).
pub const STALL: Duration = Duration::from_secs(60);

/// Sends an event; `Err` when the client is gone or has stopped reading.
async fn send(tx: &mpsc::Sender<Event>, e: Event) -> Result<(), ()> {
    tx.send_timeout(e, STALL).await.map_err(|_| ())
}

/// Runs `f`, which may block for a scheduler step, letting a multi-threaded runtime move
/// its other tasks off this worker meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Runs `job` to the end (or until `tx` closes), sending its events.
pub async fn run(state: Arc<State>, engine: Engine, job: Job, tx: mpsc::Sender<Event>) -> Summary {
    let n = job.params.n;
    let stats = Stats::default();
    let runs = job
        .prompts
        .iter()
        .enumerate()
        .map(|(p, prompt)| run_prompt(&state, &engine, &job, prompt, p * n, &tx, &stats));
    let error = futures_util::future::try_join_all(runs).await.err();
    let cancelled = tx.is_closed();
    if let Some(e) = &error {
        let _ = tx.send(Event::Failed(e.clone())).await;
    }
    let first_token = *stats.first_token.lock().unwrap_or_else(|e| e.into_inner());
    let finishes = std::mem::take(&mut *stats.finishes.lock().unwrap_or_else(|e| e.into_inner()));
    // A choice that ended without its finish, its client still there, was left unread (the
    // stream tells the client so once it reads again: `respond::sse`).
    let error = error.or_else(|| {
        (!cancelled && finishes.len() < job.prompts.len() * n)
            .then(|| ApiError::stalled(STALL.as_secs()))
    });
    Summary {
        prompt_tokens: job.prompts.iter().map(Vec::len).sum::<usize>(),
        tokens: stats.tokens.load(Ordering::Relaxed),
        first_token,
        finishes,
        cancelled: cancelled && error.is_none(),
        error: error.map(|e| e.message),
    }
}

/// Most prompt tokens a scoring pass runs (its logits: 64 rows, 64 MB for Gemma 3).
const SCORED_PART: usize = 64;

/// Prefills `prompt` once and runs its choices `first..first + n`.
async fn run_prompt(
    state: &State,
    engine: &Engine,
    job: &Job,
    prompt: &[u32],
    first: usize,
    tx: &mpsc::Sender<Event>,
    stats: &Stats,
) -> Result<(), ApiError> {
    let n = job.params.n;
    let mut base = engine.context();
    let mut contexts = Vec::with_capacity(n);
    let mut scores = Vec::new();
    if (n > 1 || job.score_prompt.is_some()) && prompt.len() > 1 {
        // Everything but the last prompt token runs once (scored where asked: each position
        // predicts the next prompt token); the choices fork from it and each runs the last
        // token itself (its logits start the choice).
        let (shared, last) = prompt.split_at(prompt.len() - 1);
        // A scored prompt runs in parts, so that its passes' logits stay small (a row of
        // Gemma 3's is 1 MB).
        let part_len = match job.score_prompt {
            Some(_) => SCORED_PART,
            None => shared.len(),
        };
        let mut preempted = None;
        for (p, part) in shared.chunks(part_len).enumerate() {
            base.fill_tokens(part)?;
            loop {
                let mut pass = base.forward();
                // Position i of the part predicts the prompt's next token.
                let next = &prompt[p * part_len + 1..][..part.len()];
                let probes = job
                    .score_prompt
                    .map_or_else(Vec::new, |k| scoring_probes(&mut pass, next, k));
                let ran = tokio::select! {
                    r = pass.execute() => r,
                    _ = tx.closed() => return Ok(()),
                };
                match ran {
                    Ok(out) => {
                        scores.extend(prompt_scores(&out, &probes));
                        break;
                    }
                    Err(e) if e.is_kv_full() => {
                        let wait = state.preempted(engine, prompt.len());
                        preempted = tokio::select! {
                            g = wait => Some(g),
                            _ = tx.closed() => return Ok(()),
                        };
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        drop(preempted);
        for _ in 0..n {
            let mut c = base.fork()?;
            c.fill_tokens(last)?;
            contexts.push(c);
        }
        drop(base);
    } else {
        base.fill_tokens(prompt)?;
        for _ in 1..n {
            contexts.push(base.fork()?);
        }
        contexts.insert(0, base);
    }
    if job.score_prompt.is_some() {
        let added_bos = job
            .added_bos
            .get(first / n.max(1))
            .copied()
            .unwrap_or(false);
        let delta = prompt_logprobs(engine.tokenizer(), prompt, &scores, added_bos);
        for choice in first..first + n {
            let delta = delta.clone();
            if send(tx, Event::Delta { choice, delta }).await.is_err() {
                return Ok(());
            }
        }
    }
    // Each choice owns its context: a finished choice gives its pages back at once, for the
    // choices still running (with more choices than the pool holds at once, they would
    // otherwise wait for pages the finished ones keep, for good).
    let choices = contexts
        .into_iter()
        .enumerate()
        .map(|(i, ctx)| run_choice(state, engine, job, prompt.len(), ctx, first + i, tx, stats));
    // The first failing choice ends the others (and gives their pages back) at once.
    futures_util::future::try_join_all(choices).await?;
    Ok(())
}

/// A scoring pass's probes: at each position, the log-probability of the token `next` holds
/// for it and, for `k` > 0, the `k` most likely tokens there.
type ScoringProbes = Vec<(u32, ProbeHandle<Logprob>, Option<ProbeHandle<Distribution>>)>;

fn scoring_probes(pass: &mut weft::Forward<'_>, next: &[u32], k: usize) -> ScoringProbes {
    let top = Distribution {
        temperature: 1.0,
        k,
    };
    next.iter()
        .enumerate()
        .map(|(i, &t)| {
            (
                t,
                pass.probe(i, Logprob(t)),
                (k > 0).then(|| pass.probe(i, top)),
            )
        })
        .collect()
}

/// What the probes found: each position's log-probability of the next prompt token and its
/// alternatives' (the log of their probabilities at temperature 1).
fn prompt_scores(out: &weft::ForwardOutput, probes: &ScoringProbes) -> Vec<PromptScore> {
    probes
        .iter()
        .map(|&(id, own, top)| {
            let logprob = clamp_logprob(
                out.logprobs(own)
                    .and_then(|v| v.first().copied())
                    .unwrap_or(f32::NEG_INFINITY),
            );
            // The token among its alternatives with the same number as on its own (the log of
            // a probability differs from a log-softmax in the last bits).
            let top = top
                .and_then(|h| out.distribution(h))
                .map(|(ids, ps)| {
                    let lp = |(&t, p): (&u32, &f32)| match t == id {
                        true => logprob,
                        false => clamp_logprob(p.ln()),
                    };
                    ids.iter()
                        .copied()
                        .zip(ids.iter().zip(ps).map(lp))
                        .collect()
                })
                .unwrap_or_default();
            PromptScore { logprob, top }
        })
        .collect()
}

/// Runs one choice on `ctx` (its prompt already filled).
#[allow(clippy::too_many_arguments)]
async fn run_choice(
    state: &State,
    engine: &Engine,
    job: &Job,
    prompt_len: usize,
    mut ctx: Context,
    choice: usize,
    tx: &mpsc::Sender<Event>,
    stats: &Stats,
) -> Result<(), ApiError> {
    let p = &job.params;
    // Choice `j` of every prompt uses `seed + j`: a prompt's choices do not depend on its
    // place in the request (as in llama-server and vLLM, which seed each prompt alike).
    let within = choice % p.n.max(1);
    ctx.set_seed(job.seed.wrapping_add(within as u64));
    let max_tokens = p
        .max_tokens
        .unwrap_or(usize::MAX)
        .min(engine.n_ctx().saturating_sub(prompt_len));
    let mut gen = ctx
        .generate(p.sampler.clone())
        .stop_rules(p.stop_rules(max_tokens))
        .logit_bias(&p.bias);
    if let Some(a) = &p.adapter {
        gen = gen.adapter(a, 1.0);
    }
    if let Some(pen) = p.penalties.clone() {
        gen = gen.penalties(pen);
    }
    if let Some(schema) = &p.schema {
        gen = gen.constrain_with(schema.clone());
    }
    let logits = p.logprobs.map(|_| gen.probe_each_step(0, Logits));
    let tok = engine.tokenizer();
    let mut text = TextTracker::new(p.stop.clone());
    let mut seen = 0;
    let mut last_token: Option<Instant> = None;
    let mut preempted = None;
    while let Some(step) = gen.next()? {
        // A client that goes away ends the choice even in the middle of a long pass.
        let ran = tokio::select! {
            r = step.execute() => r,
            _ = tx.closed() => return Ok(()),
        };
        let out = match ran {
            Ok(out) => out,
            Err(e) if e.is_kv_full() => {
                // Preempted: give the pages back, wait for room, recompute. Evicting waits for
                // the scheduler's current step, so let this worker block.
                blocking(|| gen.evict())?;
                let need = gen.context().pending().len() + 1;
                let wait = state.preempted(engine, need);
                preempted = tokio::select! {
                    g = wait => Some(g),
                    _ = tx.closed() => return Ok(()),
                };
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // The recomputation has run: new requests may be admitted again.
        drop(preempted.take());
        let now = Instant::now();
        match last_token {
            None => {
                let mut first = stats.first_token.lock().unwrap_or_else(|e| e.into_inner());
                if first.is_none() {
                    *first = Some(now);
                    state.metrics.ttft.observe(now - job.arrived);
                }
            }
            Some(t) => state.metrics.itl.observe(now - t),
        }
        last_token = Some(now);
        let row = logits.and_then(|h| out.logits(h));
        let new = &gen.tokens()[seen..];
        let new = new.to_vec();
        for (k, &id) in new.iter().enumerate() {
            let lp = match (row, p.logprobs) {
                (Some(row), Some(top)) if k == 0 => Some(logprob_entry(tok, row, id, top)),
                _ => None,
            };
            text.push(tok, id, lp);
        }
        seen = gen.tokens().len();
        stats.tokens.fetch_add(new.len(), Ordering::Relaxed);
        state
            .metrics
            .generation_tokens
            .fetch_add(new.len() as u64, Ordering::Relaxed);
        let delta = text.delta();
        if !(delta.text.is_empty() && delta.logprobs.is_empty())
            && send(tx, Event::Delta { choice, delta }).await.is_err()
        {
            return Ok(());
        }
    }
    let finish = match gen.stop_reason() {
        Some(StopReason::MaxTokens | StopReason::ContextFull) => Finish::Length,
        _ => Finish::Stop,
    };
    let tokens = gen.tokens_generated();
    stats
        .finishes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(finish);
    let delta = text.finish();
    if !(delta.text.is_empty() && delta.logprobs.is_empty()) {
        let _ = send(tx, Event::Delta { choice, delta }).await;
    }
    let _ = send(
        tx,
        Event::Finish {
            choice,
            finish,
            tokens,
        },
    )
    .await;
    Ok(())
}
