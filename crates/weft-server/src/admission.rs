//! Admission under KV pressure.
//!
//! Policy (vLLM's, in short):
//! - A request starts when fewer than `parallel` requests run and the KV pool has room for
//!   its prompt (plus a page per choice); otherwise it waits in a FIFO queue of at most
//!   `max_queue` requests, and one more gets 429.
//! - A running request is never failed for lack of pages. When one of its passes finds the
//!   pool full, it is *preempted*: its pages go back to the pool ([`weft::Context::evict`]),
//!   it waits until the pool has room for everything it holds, and it recomputes them —
//!   output unchanged. Which request that is follows from the scheduler: when a batched call
//!   does not fit, its passes run one by one in arrival order, so the youngest run out first.
//! - From its preemption until its recomputing pass has run, no new request is admitted, so
//!   it cannot starve; it resumes once the pool has room for its tokens plus a page per
//!   running request.
//! - A client that goes away ends its request wherever it waits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use weft::Engine;

use crate::error::ApiError;

/// How often a waiting request looks at the pool again: pages come back when the scheduler
/// applies a finished context's release, which sends no notification.
const POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Default)]
struct Queue {
    running: usize,
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

/// The admission gate shared by all requests.
#[derive(Debug)]
pub struct Admission {
    queue: Mutex<Queue>,
    notify: Notify,
    /// Preempted requests waiting for pages.
    preempted: AtomicUsize,
    parallel: usize,
    max_queue: usize,
}

/// A running request's slot; dropping it lets the next one in.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.lock().running -= 1;
        self.admission.notify.notify_waiters();
    }
}

/// Held by a preempted request until its recomputation has run (see
/// [`Admission::wait_for_pages`]).
#[derive(Debug)]
pub struct Preempted {
    admission: Arc<Admission>,
}

impl Drop for Preempted {
    fn drop(&mut self) {
        self.admission.preempted.fetch_sub(1, Ordering::Relaxed);
        self.admission.notify.notify_waiters();
    }
}

/// Removes a waiting ticket if its request goes away while it waits.
struct Ticket<'a> {
    admission: &'a Admission,
    id: u64,
    admitted: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.admitted {
            self.admission.lock().waiting.retain(|&t| t != self.id);
            self.admission.notify.notify_waiters();
        }
    }
}

impl Admission {
    pub fn new(parallel: usize, max_queue: usize) -> Admission {
        Admission {
            queue: Mutex::new(Queue::default()),
            notify: Notify::new(),
            preempted: AtomicUsize::new(0),
            parallel: parallel.max(1),
            max_queue,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests running and waiting.
    pub fn counts(&self) -> (usize, usize) {
        let q = self.lock();
        (
            q.running,
            q.waiting.len() + self.preempted.load(Ordering::Relaxed),
        )
    }

    /// Whether the KV pool of `engine` (none: a request that uses no KV cache, such as an
    /// encoder's embeddings) has room for `need` tokens, with no preempted request waiting.
    fn room(&self, engine: Option<&Engine>, need: usize) -> bool {
        engine.is_none_or(|engine| {
            self.preempted.load(Ordering::Relaxed) == 0
                && engine.kv_free_tokens() >= need.min(engine.n_ctx())
        })
    }

    /// Waits for a slot for a request that needs `need` KV tokens of `engine` to start (no
    /// engine: no KV tokens, only a slot); 429 when the queue is full.
    pub async fn admit(
        self: &Arc<Self>,
        engine: Option<&Engine>,
        need: usize,
    ) -> Result<Permit, ApiError> {
        let id = {
            let mut q = self.lock();
            if q.waiting.is_empty() && q.running < self.parallel && self.room(engine, need) {
                q.running += 1;
                return Ok(Permit {
                    admission: self.clone(),
                });
            }
            if q.waiting.len() >= self.max_queue {
                return Err(ApiError::queue_full(self.max_queue));
            }
            q.next_ticket += 1;
            let id = q.next_ticket;
            q.waiting.push_back(id);
            id
        };
        let mut ticket = Ticket {
            admission: self,
            id,
            admitted: false,
        };
        loop {
            let notified = self.notify.notified();
            {
                let mut q = self.lock();
                if q.waiting.front() == Some(&id)
                    && q.running < self.parallel
                    && self.room(engine, need)
                {
                    q.waiting.pop_front();
                    q.running += 1;
                    ticket.admitted = true;
                    drop(q);
                    self.notify.notify_waiters();
                    return Ok(Permit {
                        admission: self.clone(),
                    });
                }
            }
            let _ = tokio::time::timeout(POLL, notified).await;
        }
    }

    /// A running request was preempted: waits until the pool can hold its `need` tokens
    /// (and a page of headroom per running request). The request counts as preempted — no new
    /// request is admitted — until it drops the returned guard, which it does once its
    /// recomputing pass has run.
    pub async fn wait_for_pages(self: &Arc<Self>, engine: &Engine, need: usize) -> Preempted {
        self.preempted.fetch_add(1, Ordering::Relaxed);
        let guard = Preempted {
            admission: self.clone(),
        };
        loop {
            let running = self.lock().running;
            let want = need + running * weft::kv::PAGE_SIZE;
            if engine.kv_free_tokens() >= want.min(engine.n_ctx()) {
                return guard;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
