//! Context operations (create, fork, truncate, free, export, import) as commands the scheduler thread
//! applies between steps, so that no context ever waits for a running model call to touch the
//! KV cache; and the KV page counts published for [`crate::Engine::metrics`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use weft_core::kv::{SeqId, SeqState};
use weft_core::runner::ModelRunner;

use super::{Counters, Shared};
use crate::error::{Error, Result};

/// A context operation, applied by the scheduler thread before its next step. A context's
/// commands and passes reach the runner in the order the context issued them.
pub(crate) enum Command {
    /// Start an empty sequence under this id.
    Create(SeqId),
    /// Start `to` as a copy of `from` sharing all its pages.
    Fork { from: SeqId, to: SeqId },
    /// Keep the first `n` tokens of a sequence.
    Truncate {
        seq: SeqId,
        n: usize,
        /// The dropped slot `n` is to run again (see `KvCache::truncate_to_rerun`).
        rerun: bool,
        /// A plain channel: the context waits on it from blocking code or inside a future.
        reply: std::sync::mpsc::SyncSender<Result<()>>,
    },
    /// Drop a sequence and free its pages.
    Free(SeqId),
    /// Copy out a sequence's KV pages (for a snapshot).
    Export {
        seq: SeqId,
        reply: std::sync::mpsc::SyncSender<Result<SeqState>>,
    },
    /// Fill an empty sequence with saved KV pages (resuming a snapshot).
    Import {
        seq: SeqId,
        state: Box<SeqState>,
        reply: std::sync::mpsc::SyncSender<Result<()>>,
    },
}

impl Command {
    /// Answers a command the scheduler will never apply (the engine stopped).
    pub(super) fn refuse(self) {
        match self {
            Command::Truncate { reply, .. } | Command::Import { reply, .. } => {
                let _ = reply.send(Err(Error::EngineStopped));
            }
            Command::Export { reply, .. } => {
                let _ = reply.send(Err(Error::EngineStopped));
            }
            Command::Create(_) | Command::Fork { .. } | Command::Free(_) => {}
        }
    }
}

impl Shared {
    /// Hands out a new sequence id and queues its creation.
    pub fn create_sequence(&self) -> SeqId {
        let seq = SeqId(self.next_seq.fetch_add(1, Ordering::Relaxed));
        self.command(Command::Create(seq));
        seq
    }

    /// Hands out a new sequence id and queues it as a fork of `from`.
    pub fn fork_sequence(&self, from: SeqId) -> SeqId {
        let to = SeqId(self.next_seq.fetch_add(1, Ordering::Relaxed));
        self.command(Command::Fork { from, to });
        to
    }

    /// Queues a context operation for the scheduler thread (which wakes up for it).
    pub fn command(&self, c: Command) {
        if self.orphaned() {
            c.refuse();
            return;
        }
        let mut q = self.queue();
        if q.shutdown {
            c.refuse();
            return;
        }
        q.commands.push(c);
        self.issued.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Blocks until every command queued before the call has been applied (at most until the
    /// current step ends), so counters read afterwards reflect them.
    pub fn wait_applied(&self) {
        if self.orphaned() {
            return;
        }
        let target = self.issued.load(Ordering::Relaxed);
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        while *applied < target && !self.queue().shutdown {
            applied = self
                .applied_cv
                .wait_timeout(applied, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Applies queued context operations to the runner, in order.
    pub(super) fn apply(&self, commands: Vec<Command>) {
        if commands.is_empty() {
            return;
        }
        let count = commands.len() as u64;
        let mut runner = self.runner();
        for c in commands {
            match c {
                // A fresh id cannot be taken, and a context forks only a sequence it holds:
                // should either fail, the context's first pass reports the unknown sequence.
                Command::Create(seq) => {
                    let _ = runner.insert_sequence(seq);
                }
                Command::Fork { from, to } => {
                    let _ = runner.fork_as(from, to);
                }
                Command::Truncate {
                    seq,
                    n,
                    rerun,
                    reply,
                } => {
                    let done = match rerun {
                        true => runner.truncate_to_rerun(seq, n),
                        false => runner.truncate(seq, n),
                    };
                    let _ = reply.send(done.map_err(Error::from));
                }
                Command::Free(seq) => runner.free_sequence(seq),
                Command::Export { seq, reply } => {
                    let _ = reply.send(runner.export_sequence(seq).map_err(Error::from));
                }
                Command::Import { seq, state, reply } => {
                    let _ = reply.send(runner.import_sequence(seq, &state).map_err(Error::from));
                }
            }
        }
        self.publish_usage(&runner);
        drop(runner);
        *self.applied.lock().unwrap_or_else(|e| e.into_inner()) += count;
        self.applied_cv.notify_all();
    }

    /// Publishes the KV pool's page counts for [`crate::Engine::metrics`].
    pub(super) fn publish_usage(&self, runner: &ModelRunner) {
        Shared::publish(&self.counters, runner);
    }

    /// Publishes `runner`'s KV page counts and prefix-cache counters into `c`.
    pub(super) fn publish(c: &Counters, runner: &ModelRunner) {
        let usage = runner.kv_usage();
        let free: usize = usage.iter().map(|u| u.free).sum();
        let total: usize = usage.iter().map(|u| u.total).sum();
        c.kv_free.store(free, Ordering::Relaxed);
        c.kv_used.store(total - free, Ordering::Relaxed);
        let min = usage.iter().map(|u| u.free).min().unwrap_or(0);
        c.kv_free_min.store(min, Ordering::Relaxed);
        let p = runner.kv().prefix_stats();
        c.prefix_queried.store(p.queried_tokens, Ordering::Relaxed);
        c.prefix_hits.store(p.hit_tokens, Ordering::Relaxed);
        c.prefix_evictions.store(p.evictions, Ordering::Relaxed);
    }
}
