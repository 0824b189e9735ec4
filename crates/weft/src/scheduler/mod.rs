//! The scheduler: one thread that packs the pending passes of every live context into one
//! batched model call per step (continuous batching).
//!
//! Policy, per step:
//! 0. Apply the context operations queued since the last step ([`Command`]: create, fork,
//!    truncate, free). Contexts never lock the model runner themselves, so making, forking or
//!    dropping one never waits for a step to finish — what an async server's handlers need.
//! 1. Wait for work. If contexts that took part in the last step said they will submit again
//!    (their `horizon` was above zero), wait for them — at most [`EngineConfig::batch_wait`] —
//!    so that concurrent generations share model calls instead of drifting apart.
//! 2. Fill a token budget ([`EngineConfig::step_tokens`]): first every pass of one to a few
//!    tokens (decode steps, speculative checks), then prompt chunks in arrival order. A long
//!    prompt is cut into chunks over several steps (chunked prefill), so it never stalls the
//!    decodes of other contexts for more than one step. One pass per context per step, in the
//!    order the context submitted them.
//! 3. Run the step; if the batched call fails, run each pass alone to find whose it was (the
//!    model runner rolls every sequence back on error, so a retry starts clean).
//! 4. Answer the passes that finished: samplers and probes run here, on the rows of logits the
//!    passes asked for, so only those rows are ever copied.
//!
//! [`EngineConfig::batch_wait`]: crate::EngineConfig::batch_wait
//! [`EngineConfig::step_tokens`]: crate::EngineConfig::step_tokens

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use weft_core::kv::SeqId;
use weft_core::lora::AdapterSet;
use weft_core::models::SlotMask;
use weft_core::runner::{BatchEntry, BatchInputs, ModelRunner};
use weft_core::sampling::{Penalties, Rng, Sampler};

use crate::constraint::TokenMask;
use crate::error::{Error, Result};
use crate::probe::{ProbeKind, ProbeValue};

mod commands;
mod prefix;
mod sample;

pub(crate) use commands::Command;
use sample::advance;

/// Passes of at most this many tokens go first in a step (decodes, speculative checks).
const SHORT_PASS: usize = 16;

/// Samplers at some positions of a pass.
#[derive(Debug, Clone)]
pub(crate) struct SampleSpec {
    pub indices: Vec<usize>,
    pub sampler: Sampler,
    /// Allowed ids per index (speculative verification under constraints), or empty.
    pub masks: Vec<Option<TokenMask>>,
}

/// Everything a pass asks of the engine.
#[derive(Debug)]
pub(crate) struct PassRequest {
    pub seq: SeqId,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// One attention mask per token, when the pass has custom masks.
    pub masks: Option<Vec<SlotMask>>,
    /// When a mask looks ahead (bidirectional blocks), per token `t` the last token of the
    /// pass that tokens up to `t` attend to; a chunk may end after `t` only when
    /// `reach[t] <= t`. Empty when no mask looks ahead.
    pub reach: Vec<u32>,
    pub samplers: Vec<SampleSpec>,
    pub probes: Vec<(usize, ProbeKind)>,
    /// Allowed token ids for every sampler (`None`: all).
    pub logit_mask: Option<TokenMask>,
    pub penalties: Option<(Penalties, Vec<u32>)>,
    pub bias: Vec<(u32, f32)>,
    pub rng: Rng,
    /// How many more passes this context expects to submit after this one.
    pub horizon: usize,
    /// The LoRA adapters the pass runs with (`None`: the base model).
    pub adapters: Option<AdapterSet>,
    /// Per token of the pass, its input vector (`n_embd` values) when it has one instead of
    /// its id's embedding. Empty when no token has.
    pub embeds: Vec<Option<Arc<[f32]>>>,
}

impl PassRequest {
    /// Where a chunk of the pass from token `start` that would end at `want` may end: there,
    /// or at the last point before it where no token's mask looks past the chunk (a token
    /// runs with every later token it attends to, as the layer writes their keys first); when
    /// there is none, at the first such point after `want`.
    fn chunk_end(&self, start: usize, want: usize) -> usize {
        let n = self.tokens.len();
        let fits =
            |end: usize| end >= n || self.reach.get(end - 1).is_none_or(|&r| (r as usize) < end);
        (start + 1..=want)
            .rev()
            .find(|&e| fits(e))
            .or_else(|| (want + 1..=n).find(|&e| fits(e)))
            .unwrap_or(n)
    }
}

/// What a pass returns.
#[derive(Debug)]
pub(crate) struct PassResult {
    /// Per sampler, one token per index.
    pub tokens: Vec<Vec<u32>>,
    pub probes: Vec<ProbeValue>,
    pub rng: Rng,
}

type Reply = oneshot::Sender<Result<PassResult>>;

/// A pass being run, possibly over several steps.
struct Active {
    req: PassRequest,
    reply: Reply,
    /// Tokens already run.
    done: usize,
    /// Indices whose logits are needed, sorted.
    wanted: Vec<usize>,
    /// Logits rows of wanted indices run in earlier steps.
    saved: Vec<(usize, Vec<f32>)>,
    /// Indices whose final-norm hidden state is needed (hidden probes), sorted, and the rows
    /// of those run in earlier steps.
    wanted_hidden: Vec<usize>,
    saved_hidden: Vec<(usize, Vec<f32>)>,
    /// The answer, once the pass has finished or failed.
    outcome: Option<Result<PassResult>>,
    /// The prefix cache was consulted for this pass.
    prefix_checked: bool,
}

/// Counters the scheduler keeps (see [`crate::Metrics`]).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub steps: AtomicU64,
    pub passes: AtomicU64,
    pub step_passes: AtomicU64,
    pub step_tokens: AtomicU64,
    pub max_step_passes: AtomicU64,
    pub prefilled: AtomicU64,
    pub decoded: AtomicU64,
    /// KV pages in use and free over all layer groups, published after every step and
    /// every batch of commands.
    pub kv_used: AtomicUsize,
    pub kv_free: AtomicUsize,
    /// Free pages of the layer group with the fewest.
    pub kv_free_min: AtomicUsize,
    pub prefix_queried: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub prefix_evictions: AtomicU64,
    /// Waits for announced passes that ran out of time (the pass never came in time).
    pub batch_wait_timeouts: AtomicU64,
}

#[derive(Default)]
struct Queue {
    incoming: VecDeque<(PassRequest, Reply)>,
    commands: Vec<Command>,
    /// Contexts expected to submit again soon.
    expected: HashSet<SeqId>,
    shutdown: bool,
}

/// State shared by the scheduler thread and the engine handles.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Passes submitted and not yet answered, per context (see [`Shared::wait_idle`]).
    busy: Mutex<HashMap<SeqId, usize>>,
    idle: Condvar,
    runner: Mutex<ModelRunner>,
    /// The next sequence id to hand out (contexts get theirs without waiting for the runner).
    /// 64 bits: 32 wrapped after 2^32 contexts (weeks of a busy server), and a new context
    /// then took the id of a live one, whose sequence the two would have shared.
    next_seq: AtomicU64,
    /// Commands queued so far, and applied so far (see [`Shared::wait_applied`]).
    issued: AtomicU64,
    applied: Mutex<u64>,
    applied_cv: Condvar,
    pub counters: Counters,
    step_tokens: usize,
    batch_wait: Duration,
    /// The process whose scheduler thread this is (see [`Shared::orphaned`]).
    pid: u32,
}

impl Shared {
    /// Whether this is a copy made by `fork()`: the child has the engine's memory but not its
    /// scheduler thread, so a pass or command would wait forever. Checked before any lock (a
    /// lock the thread held at the fork stays held in the child); the engine then answers
    /// `EngineStopped`, as after a shutdown.
    pub fn orphaned(&self) -> bool {
        self.pid != std::process::id()
    }

    pub fn new(runner: ModelRunner, step_tokens: usize, batch_wait: Duration) -> Shared {
        let counters = Counters::default();
        Shared::publish(&counters, &runner);
        Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            busy: Mutex::new(HashMap::new()),
            idle: Condvar::new(),
            runner: Mutex::new(runner),
            next_seq: AtomicU64::new(0),
            issued: AtomicU64::new(0),
            applied: Mutex::new(0),
            applied_cv: Condvar::new(),
            counters,
            step_tokens: step_tokens.max(1),
            batch_wait,
            pid: std::process::id(),
        }
    }

    /// The model runner, for context operations (fork, truncate, free) between steps.
    pub fn runner(&self) -> MutexGuard<'_, ModelRunner> {
        // A panic while holding the lock cannot leave the runner half-updated in a way later
        // calls could observe (its methods validate first and roll back on error).
        self.runner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a pass; the receiver gets its result.
    pub fn submit(&self, req: PassRequest) -> oneshot::Receiver<Result<PassResult>> {
        let (tx, rx) = oneshot::channel();
        if self.orphaned() {
            let _ = tx.send(Err(Error::EngineStopped));
            return rx;
        }
        let mut q = self.queue();
        if q.shutdown {
            let _ = tx.send(Err(Error::EngineStopped));
        } else {
            *self.busy().entry(req.seq).or_default() += 1;
            q.expected.remove(&req.seq);
            q.incoming.push_back((req, tx));
            self.wake.notify_one();
        }
        rx
    }

    fn busy(&self) -> MutexGuard<'_, HashMap<SeqId, usize>> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a pass's answer and marks it done.
    fn answer(&self, seq: SeqId, reply: Reply, outcome: Result<PassResult>) {
        let _ = reply.send(outcome);
        let mut busy = self.busy();
        if let Some(n) = busy.get_mut(&seq) {
            *n -= 1;
            if *n == 0 {
                busy.remove(&seq);
            }
        }
        self.idle.notify_all();
    }

    /// Blocks until every pass submitted for `seq` has been answered (a context whose
    /// `execute` future was dropped waits here before touching its sequence again).
    pub fn wait_idle(&self, seq: SeqId) {
        if self.orphaned() {
            return;
        }
        let mut busy = self.busy();
        while busy.contains_key(&seq) {
            busy = self.idle.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A context is gone, or will not submit the passes it announced: do not wait for it
    /// (a step already waiting re-checks at once).
    pub fn forget(&self, seq: SeqId) {
        if self.queue().expected.remove(&seq) {
            self.wake.notify_all();
        }
    }

    /// Asks the scheduler thread to finish.
    pub fn shutdown(&self) {
        self.queue().shutdown = true;
        self.wake.notify_all();
    }

    /// The scheduler thread's loop.
    pub fn run(&self) {
        // If the loop panics, fail every waiting and future pass instead of leaving them
        // hanging.
        struct OnPanic<'a>(&'a Shared);
        impl Drop for OnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut q = self.0.queue();
                    q.shutdown = true;
                    q.commands.drain(..).for_each(Command::refuse);
                    for (req, reply) in q.incoming.drain(..) {
                        self.0.answer(req.seq, reply, Err(Error::EngineStopped));
                    }
                    self.0.busy().clear();
                    self.0.idle.notify_all();
                }
            }
        }
        let _guard = OnPanic(self);
        let mut active: Vec<Active> = Vec::new();
        loop {
            let commands = {
                let mut q = self.queue();
                while active.is_empty()
                    && q.incoming.is_empty()
                    && q.commands.is_empty()
                    && !q.shutdown
                {
                    q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                if q.shutdown {
                    q.commands.drain(..).for_each(Command::refuse);
                    for (req, reply) in q.incoming.drain(..) {
                        self.answer(req.seq, reply, Err(Error::EngineStopped));
                    }
                    for a in active.drain(..) {
                        self.answer(a.req.seq, a.reply, Err(Error::EngineStopped));
                    }
                    return;
                }
                // Give contexts that announced more work a moment to submit it. Their context
                // operations are applied as they come (a speculative rollback truncates before
                // the next pass, and waits for it).
                let deadline = Instant::now() + self.batch_wait;
                while !q.expected.is_empty() && !q.shutdown {
                    if !q.commands.is_empty() {
                        let commands = std::mem::take(&mut q.commands);
                        drop(q);
                        self.apply(commands);
                        q = self.queue();
                        continue;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        q.expected.clear();
                        self.counters
                            .batch_wait_timeouts
                            .fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    q = self
                        .wake
                        .wait_timeout(q, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                for (req, reply) in q.incoming.drain(..) {
                    active.push(Active::new(req, reply));
                }
                std::mem::take(&mut q.commands)
            };
            // Commands were queued before the passes just taken (a context waits for its own
            // passes before it forks or truncates), so they go first. A context dropped while
            // its pass waits frees its sequence here, and the pass then fails in `step`.
            self.apply(commands);
            if !active.is_empty() {
                self.step(&mut active);
            }
        }
    }

    /// Runs one step over `active`; answers and removes the passes that finish.
    fn step(&self, active: &mut Vec<Active>) {
        // Only the oldest pass of each context may run (a context's passes run in order).
        let mut seen = HashSet::new();
        let mut eligible: Vec<bool> = active.iter().map(|a| seen.insert(a.req.seq)).collect();
        self.attach_prefixes(active, &mut eligible);
        // Choose (pass, token range) triples: short passes first, then chunks in order.
        let mut chosen: Vec<(usize, usize, usize)> = Vec::new();
        let mut budget = self.step_tokens;
        for short in [true, false] {
            for (i, a) in active.iter().enumerate() {
                let left = a.req.tokens.len() - a.done;
                if !eligible[i] || (left <= SHORT_PASS) != short || budget == 0 {
                    continue;
                }
                if short && left > budget && !chosen.is_empty() {
                    continue; // a whole short pass or nothing; it goes first next step
                }
                let end = a.req.chunk_end(a.done, a.done + left.min(budget));
                budget = budget.saturating_sub(end - a.done);
                chosen.push((i, a.done, end));
            }
        }
        chosen.sort_unstable_by_key(|c| c.0);
        let mut ran = Vec::with_capacity(chosen.len());
        {
            let mut runner = self.runner();
            // A context dropped while its pass waited: fail that pass alone.
            chosen.retain(|&(i, _, _)| match runner.kv().len(active[i].req.seq) {
                Ok(_) => true,
                Err(e) => {
                    active[i].outcome = Some(Err(e.into()));
                    false
                }
            });
            let together = run_chunks(&mut runner, active, &chosen);
            if together.is_ok() {
                ran.extend_from_slice(&chosen);
                advance(&runner, active, &chosen);
                unrun_failed(&mut runner, active, &chosen);
            } else if chosen.len() == 1 {
                if let Err(e) = together {
                    fail(&mut runner, &mut active[chosen[0].0], e);
                }
            } else {
                // Find whose pass failed: run each alone, oldest context first (ids are
                // handed out in creation order), so that when the KV pool is full it is the
                // youngest contexts whose passes fail.
                let mut by_age = chosen.clone();
                by_age.sort_by_key(|&(i, _, _)| active[i].req.seq);
                for c in by_age {
                    match run_chunks(&mut runner, active, &[c]) {
                        Ok(()) => {
                            ran.push(c);
                            advance(&runner, active, &[c]);
                            unrun_failed(&mut runner, active, &[c]);
                        }
                        Err(e) => fail(&mut runner, &mut active[c.0], e),
                    }
                }
            }
            self.publish_usage(&runner);
        }
        let c = &self.counters;
        let n_tokens: usize = ran.iter().map(|&(_, a, b)| b - a).sum();
        if n_tokens > 0 {
            c.steps.fetch_add(1, Ordering::Relaxed);
            c.step_passes.fetch_add(ran.len() as u64, Ordering::Relaxed);
            c.step_tokens.fetch_add(n_tokens as u64, Ordering::Relaxed);
            c.max_step_passes
                .fetch_max(ran.len() as u64, Ordering::Relaxed);
            for &(i, a, b) in &ran {
                let single = active[i].req.tokens.len() == 1;
                let counter = if single { &c.decoded } else { &c.prefilled };
                counter.fetch_add((b - a) as u64, Ordering::Relaxed);
            }
        }
        // Remove finished passes; note who will submit again *before* answering, so a
        // fast client's next pass cannot arrive before it is expected.
        let mut answers = Vec::new();
        let mut expected = Vec::new();
        let mut i = 0;
        while i < active.len() {
            if active[i].outcome.is_none() {
                i += 1;
                continue;
            }
            let a = active.remove(i);
            if let Some(outcome) = a.outcome {
                if outcome.is_ok() && a.req.horizon > 0 {
                    expected.push(a.req.seq);
                }
                answers.push((a.req.seq, a.reply, outcome));
            }
        }
        self.queue().expected.extend(expected);
        for (seq, reply, outcome) in answers {
            c.passes.fetch_add(1, Ordering::Relaxed);
            self.answer(seq, reply, outcome);
        }
    }
}

/// Fails a pass; tokens it ran in earlier steps (chunked prefill) leave the cache too, so the
/// sequence is back where the pass found it.
fn fail(runner: &mut ModelRunner, a: &mut Active, e: Error) {
    unrun(runner, a);
    a.outcome = Some(Err(e));
}

/// Takes the tokens a pass ran out of its sequence's cache.
fn unrun(runner: &mut ModelRunner, a: &Active) {
    if a.done > 0 {
        if let Ok(len) = runner.kv().len(a.req.seq) {
            let _ = runner.truncate(a.req.seq, len.saturating_sub(a.done));
        }
    }
}

/// Passes of `chosen` whose outcome failed after the model ran them (a logit mask that
/// allows no token) leave the cache as a failed forward does: the context rolls back, and
/// the cache must not keep what the context forgot.
fn unrun_failed(runner: &mut ModelRunner, active: &[Active], chosen: &[(usize, usize, usize)]) {
    for &(i, _, _) in chosen {
        if matches!(active[i].outcome, Some(Err(_))) {
            unrun(runner, &active[i]);
        }
    }
}

impl Active {
    fn new(req: PassRequest, reply: Reply) -> Active {
        let hidden = |p: &ProbeKind| matches!(p, ProbeKind::Hidden);
        let mut wanted: Vec<usize> = req
            .samplers
            .iter()
            .flat_map(|s| s.indices.iter().copied())
            .chain(req.probes.iter().filter(|p| !hidden(&p.1)).map(|p| p.0))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut wanted_hidden: Vec<usize> = req
            .probes
            .iter()
            .filter(|p| hidden(&p.1))
            .map(|p| p.0)
            .collect();
        wanted_hidden.sort_unstable();
        wanted_hidden.dedup();
        Active {
            req,
            reply,
            done: 0,
            wanted,
            saved: Vec::new(),
            wanted_hidden,
            saved_hidden: Vec::new(),
            outcome: None,
            prefix_checked: false,
        }
    }
}

/// Runs the token ranges `chosen` of the passes in `active` as one batch.
fn run_chunks(
    runner: &mut ModelRunner,
    active: &[Active],
    chosen: &[(usize, usize, usize)],
) -> Result<()> {
    let mut entries = Vec::new();
    let mut masks = Vec::new();
    let mut adapters = Vec::new();
    let mut embeds = Vec::new();
    let d = runner.info().n_embd;
    for &(i, a, b) in chosen {
        let r = &active[i].req;
        if let Some(set) = &r.adapters {
            adapters.push((r.seq, set.clone()));
        }
        for t in a..b {
            let mask = r.masks.as_ref().map(|m| {
                masks.push(m[t].clone());
                (masks.len() - 1) as u32
            });
            let embed = r.embeds.get(t).and_then(Option::as_ref).map(|v| {
                embeds.extend_from_slice(v);
                (embeds.len() / d - 1) as u32
            });
            entries.push(BatchEntry {
                token: r.tokens[t],
                pos: r.positions[t],
                seq: r.seq,
                logits: active[i].wanted.binary_search(&t).is_ok(),
                hidden: active[i].wanted_hidden.binary_search(&t).is_ok(),
                mask,
                embed,
            });
        }
    }
    runner.forward_inputs(
        &entries,
        BatchInputs {
            masks: &masks,
            adapters: &adapters,
            embeds: &embeds,
        },
    )?;
    Ok(())
}

/// Starts the scheduler thread.
pub(crate) fn spawn(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weft-scheduler".into())
        .spawn(move || shared.run())
}
