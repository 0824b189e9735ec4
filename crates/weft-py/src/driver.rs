//! The task that owns a running `Generator`: Python's generation and its steps send it
//! requests, one at a time, and it answers each.
//!
//! The generator borrows its context, so both live in one pinned stream (the context in a
//! [`Lease`]): each poll reads the request waiting in the [`Inbox`], carries it out on the
//! generator and yields a [`Reply`]. Dropping the stream drops the generator, then puts the
//! context back.
//!
//! A request whose caller was cancelled (a timed-out `await`) while it ran leaves the stream
//! in the middle of it; the next caller's poll finishes it first. Its effect on the generator
//! stays (a step ran, its token was taken), its reply is dropped — except text, which any
//! request for text takes, so that no delta is lost.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use pyo3::prelude::*;

use crate::context::Lease;
use crate::errors::to_py;
use crate::generation::GenOptions;
use crate::probes::{attach, ProbeKind, RustProbe, Value};

/// What a caller asks of the generator.
pub enum Cmd {
    /// The next text delta (`next_text`).
    Text,
    /// Whether a step can run (`next`): [`Item::Ready`] or the end.
    Check,
    /// One step: the automatic sampler on or off, this step's own probes, and how often the
    /// generation had moved on when `next_step()` made it.
    Step {
        auto: bool,
        probes: Vec<(usize, ProbeKind)>,
        made_at: u64,
    },
    /// Tokens chosen outside the loop.
    Accept(Vec<u32>),
    /// A probe on every step from now on.
    EachStep(usize, ProbeKind),
    /// Give the context's KV pages back.
    Evict,
    /// The context's snapshot with the generator in it.
    Snapshot,
}

/// The answer to a [`Cmd`].
pub enum Item {
    Delta(String),
    /// A step can run; how often the generation has moved on so far.
    Ready(u64),
    Stepped(Stepped),
    /// Done; for [`Cmd::EachStep`], the probe's index among the every-step probes.
    Done(usize),
    Bytes(Vec<u8>),
    /// The generation has stopped (for [`Cmd::Text`] and [`Cmd::Check`]).
    End,
}

/// What a step returned, owned.
pub struct Stepped {
    pub token: Option<u32>,
    pub accepted: Vec<u32>,
    /// The every-step probes' values, then the step's own.
    pub values: Vec<Value>,
    /// How many of `values` are every-step probes.
    pub each_step: usize,
    /// The constraints' allowed set at the sampled position.
    pub allowed: Option<weft::TokenMask>,
}

pub struct Reply {
    serial: u64,
    result: weft::Result<Item>,
    /// The stream ends after this reply: the caller drops it, which frees the context.
    last: bool,
}

pub type Replies = Pin<Box<dyn Stream<Item = Reply> + Send>>;

/// The stream, `None` once it ended (the context is back in its slot then).
pub type Shared = Arc<tokio::sync::Mutex<Option<Replies>>>;

/// The request waiting for the stream's next poll, with its serial number.
pub type Inbox = Arc<Mutex<Option<(u64, Cmd)>>>;

/// The error that ended the generation: an exception a Python constraint or speculator raised
/// inside a step (raised in place of weft's stand-in, so it keeps its type and traceback), or
/// the error of its last step. Every later request raises it again: a caller whose `await`
/// was cancelled cannot take it away from the next one. Kept as the exception object, which
/// the generation shows to Python's garbage collector: its traceback holds the frames it was
/// raised through, and so, often, the generation itself.
pub type Raised = Arc<Mutex<Option<Py<pyo3::exceptions::PyBaseException>>>>;

/// The error that ended the generation, if one did.
fn ended_with(raised: &Raised) -> Option<PyErr> {
    let kept = lock(raised);
    let e = kept.as_ref()?;
    Some(Python::attach(|py| {
        PyErr::from_value(e.bind(py).clone().into_any())
    }))
}

/// What the generation produced so far, readable without the stream.
#[derive(Default, Clone)]
pub struct Progress {
    pub tokens: Vec<u32>,
    /// The text streamed so far; the whole output text once the stream ended.
    pub text: String,
    /// Text the generator had not streamed when the stream ended: the next request for text
    /// takes it.
    pub tail: Option<String>,
    pub stop_reason: Option<&'static str>,
    pub done: bool,
}

pub type Record = Arc<Mutex<Progress>>;

/// Locks `m`, whatever a panicking holder left.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Python name of a stop reason.
pub fn reason_name(r: &weft::StopReason) -> &'static str {
    match r {
        weft::StopReason::MaxTokens => "max_tokens",
        weft::StopReason::StopToken(_) => "stop_token",
        weft::StopReason::StopSequence(_) => "stop_sequence",
        weft::StopReason::StopString(_) => "stop_string",
        weft::StopReason::Constraint => "constraint",
        weft::StopReason::Ended => "closed",
        weft::StopReason::ContextFull => "context_full",
        _ => "error",
    }
}

/// Ends its generator when dropped ([`weft::Generator::end`]).
struct EndOnDrop<'g, 'c>(&'g mut weft::Generator<'c>);

impl Drop for EndOnDrop<'_, '_> {
    fn drop(&mut self) {
        // An error here (the pass of a dropped step failed) leaves the context as it is.
        let _ = self.0.end();
    }
}

/// The stream that runs the generator `opts` make on the leased context, answering what
/// `inbox` holds. It ends — dropping the generator and giving the context back — as soon as
/// the generator stops, fails at its end, or a Python callback raises (`raised`).
pub fn spawn(
    lease: Lease,
    opts: GenOptions,
    inbox: Inbox,
    raised: Raised,
    record: Record,
) -> Shared {
    let replies = async_stream::stream! {
        let mut lease = lease;
        let mut gen = match opts.apply(lease.ctx()) {
            Ok(gen) => gen,
            Err(e) => {
                let serial = lock(&inbox).take().map_or(0, |(s, _)| s);
                lock(&record).stop_reason = Some("error");
                yield Reply { serial, result: Err(e), last: true };
                return;
            }
        };
        // Dropped with the stream (a loop left early, `close()`): ends the generator so the
        // context keeps the last token streamed.
        let ending = EndOnDrop(&mut gen);
        let gen = &mut *ending.0;
        let mut each: Vec<RustProbe> = Vec::new();
        // How often the generation moved on (a step ran, tokens were taken, by hand or while
        // iterating text): a step made before the last move is stale.
        let mut moves = 0u64;
        loop {
            let (serial, cmd) = lock(&inbox).take().unwrap_or((0, Cmd::Text));
            let before = position(gen);
            let (result, mut last) = match cmd {
                Cmd::Text => match gen.next_text().await {
                    Ok(Some(d)) => (Ok(Item::Delta(d)), false),
                    Ok(None) => (Ok(Item::End), true),
                    Err(e) => (Err(e), true),
                },
                Cmd::Check => match gen.next() {
                    Ok(Some(_)) => (Ok(Item::Ready(moves)), false),
                    Ok(None) => (Ok(Item::End), true),
                    Err(e) => (Err(e), true),
                },
                Cmd::Step { made_at, .. } if made_at != moves => (Err(stale()), false),
                Cmd::Step { auto, probes, .. } => (step(gen, &each, auto, probes).await, false),
                Cmd::Accept(tokens) => (gen.accept(&tokens).map(|()| Item::Done(0)), false),
                Cmd::EachStep(index, kind) => {
                    each.push(attach!(kind, |p| gen.probe_each_step(index, p)));
                    (Ok(Item::Done(each.len() - 1)), false)
                }
                Cmd::Evict => (gen.evict().map(|()| Item::Done(0)), false),
                Cmd::Snapshot => (gen.snapshot().map(Item::Bytes), false),
            };
            if position(gen) != before {
                moves += 1;
            }
            // A Python callback that raised ends the generation, whatever the request: its
            // exception is what the caller gets (see `request_in`).
            let failed = lock(&raised).is_some() || (result.is_err() && last);
            last |= failed;
            // Stopped: text not streamed yet (held back for a stop string, or made by steps
            // run by hand) is kept for the next request for text.
            let mut tail = None;
            if gen.is_done() {
                tail = gen.next_text().await.ok().flatten();
                last = true;
            }
            {
                let mut p = lock(&record);
                let done = p.tokens.len().min(gen.tokens().len());
                p.tokens.extend_from_slice(&gen.tokens()[done..]);
                if let Ok(Item::Delta(d)) = &result {
                    p.text.push_str(d);
                }
                p.stop_reason = gen.stop_reason().map(reason_name);
                if failed {
                    p.stop_reason.get_or_insert("error");
                }
                p.done = gen.is_done() || last;
                if last {
                    p.text = gen.text().to_string();
                    p.tail = tail;
                }
            }
            yield Reply { serial, result, last };
            if last {
                break;
            }
        }
    };
    Arc::new(tokio::sync::Mutex::new(Some(Box::pin(replies))))
}

/// Where the generation is: tokens taken, and tokens in the context (run or pending; an
/// eviction moves them from one to the other).
fn position(gen: &weft::Generator<'_>) -> (usize, usize) {
    let ctx = gen.context();
    (gen.tokens_generated(), ctx.len() + ctx.pending().len())
}

/// A step run after a newer step or accept, as Rust's borrow of the generator rules out.
fn stale() -> weft::Error {
    weft::Error::Config(
        "this step is stale: the generation has moved on since next_step() made it (call \
         next_step() again)"
            .into(),
    )
}

/// One step of `gen` with the every-step probes `each` and the step's own `probes`.
async fn step(
    gen: &mut weft::Generator<'_>,
    each: &[RustProbe],
    auto: bool,
    probes: Vec<(usize, ProbeKind)>,
) -> weft::Result<Item> {
    let Some(mut step) = gen.next()? else {
        return Err(weft::Error::Config(
            "the generation has stopped: there is no next step".into(),
        ));
    };
    if !auto {
        step.clear_sampler();
    }
    let own: Vec<RustProbe> = probes
        .into_iter()
        .map(|(index, kind)| attach!(kind, |p| step.probe(index, p)))
        .collect();
    let out = step.execute().await?;
    let values = each.iter().chain(&own).map(|p| p.read(&out)).collect();
    Ok(Item::Stepped(Stepped {
        token: out.token,
        accepted: out.accepted,
        values,
        each_step: each.len(),
        allowed: out.allowed,
    }))
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// Carries out `cmd` on the generator behind the stream in `slot` (its lock held) and returns
/// its answer; `None` once the stream has ended (the generation stopped and gave the context
/// back, or was closed), or the error that ended it.
pub async fn request_in(
    slot: &mut Option<Replies>,
    inbox: &Inbox,
    raised: &Raised,
    cmd: Cmd,
) -> PyResult<Option<Item>> {
    let wants_text = matches!(cmd, Cmd::Text);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    *lock(inbox) = Some((serial, cmd));
    loop {
        let Some(replies) = slot.as_mut() else {
            return ended_with(raised).map_or(Ok(None), Err);
        };
        let Some(reply) = replies.next().await else {
            *slot = None;
            return ended_with(raised).map_or(Ok(None), Err);
        };
        if reply.last {
            *slot = None;
        }
        if let Some(e) = ended_with(raised) {
            return Err(e);
        }
        let ours =
            reply.serial == serial || (wants_text && matches!(reply.result, Ok(Item::Delta(_))));
        match reply.result {
            Err(e) => {
                let e = to_py(e);
                if reply.last {
                    *lock(raised) = Some(Python::attach(|py| e.clone_ref(py).into_value(py)));
                }
                return Err(e);
            }
            Ok(Item::End) if ours => return Ok(None),
            Ok(item) if ours => return Ok(Some(item)),
            // The reply to a request cancelled while it ran (see the module's notes).
            Ok(_) => {}
        }
    }
}
