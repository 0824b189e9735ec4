//! Waiting for KV pages other contexts of an engine hold: what a batch (embeddings, rollouts)
//! does when its passes find the cache full and none of them could run.

use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::error::Error;

/// How long a batch waits, without any of its passes running, for KV pages that other
/// contexts of the engine hold before it reports the cache full.
const KV_WAIT: Duration = Duration::from_secs(30);
/// The first pause between two tries; each next pause doubles, up to [`KV_POLL_MAX`].
const KV_POLL: Duration = Duration::from_millis(10);
const KV_POLL_MAX: Duration = Duration::from_millis(160);

/// What a batch does after some of its passes found the KV cache full.
pub(crate) enum KvWait {
    /// Run them again now (some ran, or the pool is empty now).
    Retry,
    /// Wait this long for other contexts to give pages back, then run them again.
    Sleep(Duration),
    /// They cannot run: one needs more pages than the whole cache has, or nothing came back
    /// for [`KV_WAIT`].
    GiveUp,
}

/// Decides [`KvWait`] for a batch, round after round.
#[derive(Debug, Default)]
pub(crate) struct KvWaiter {
    /// When the batch last made progress (`None`: it has not waited since).
    since: Option<Instant>,
    /// The next pause.
    pause: Duration,
}

impl KvWaiter {
    /// What to do after some of the batch's passes found the cache full (`full`, the error
    /// of one; `progressed`: some others ran). The batch's failed passes hold no pages, so
    /// the pages they found taken are other contexts': another batch on another thread, a
    /// generation. Those give them back, often before this looks (the pool is empty then).
    /// Reads only counters that never wait for the scheduler.
    pub(crate) fn next(&mut self, engine: &Engine, progressed: bool, full: &Error) -> KvWait {
        if progressed {
            *self = KvWaiter::default();
            return KvWait::Retry;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        let capacity = engine.config().kv_tokens;
        let needed = match full {
            Error::Core(weft_core::Error::KvCacheFull { needed_pages, .. }) => {
                needed_pages.saturating_mul(weft_core::kv::PAGE_SIZE)
            }
            _ => 0,
        };
        if needed > capacity || since.elapsed() > KV_WAIT {
            return KvWait::GiveUp;
        }
        if engine.kv_free_tokens() >= capacity {
            return KvWait::Retry;
        }
        self.pause = (self.pause * 2).clamp(KV_POLL, KV_POLL_MAX);
        KvWait::Sleep(self.pause)
    }
}
