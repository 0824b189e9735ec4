//! Sharing numbered chunks of work out over the pool's threads: [`ThreadPool::run_chunks`] and
//! [`ThreadPool::run_shares`], on per-thread [`Share`]s of chunks a finished thread takes halves
//! of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

use super::{read_line, Slot, ThreadPool};

/// One thread's share of a [`ThreadPool::run_shares`] call: its owner takes chunks from the
/// front without touching a line another thread is using (see [`Share::pack`]).
pub(super) struct Share(pub(super) AtomicU64);

/// What [`ThreadPool::run_shares`] hands each worker: each call claims the worker's next chunk.
pub type Claim<'a> = dyn FnMut() -> Option<usize> + 'a;

/// Bits of a chunk index in a [`Share`]: `run_shares` takes fewer than 2^24 chunks.
const CHUNK_BITS: u32 = 24;

impl Share {
    /// `tag << 48 | front << 24 | back`: the chunks `front..back` of run `tag` (the low 16
    /// bits of the pool's count of `run_shares` calls).
    fn pack(tag: u64, front: usize, back: usize) -> u64 {
        (tag & 0xffff) << (2 * CHUNK_BITS) | (front as u64) << CHUNK_BITS | back as u64
    }

    fn unpack(v: u64) -> (u64, usize, usize) {
        let mask = (1u64 << CHUNK_BITS) - 1;
        let chunk = |shift: u32| ((v >> shift) & mask) as usize;
        (v >> (2 * CHUNK_BITS), chunk(CHUNK_BITS), chunk(0))
    }

    /// Replaces the chunks left of run `tag`, `(front, back)`, by `cut(front, back)` when any
    /// are left; returns what was there. A share another run left behind (its owner has not
    /// set this run's yet) counts as empty.
    fn update(
        &self,
        tag: u64,
        cut: impl Fn(usize, usize) -> (usize, usize),
    ) -> Option<(usize, usize)> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (t, front, back) = Share::unpack(cur);
            if t != tag & 0xffff || front >= back {
                return None;
            }
            let (f, b) = cut(front, back);
            match self.0.compare_exchange_weak(
                cur,
                Share::pack(tag, f, b),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some((front, back)),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Takes the first chunk left (the owner's next chunk); with it, whether it was the last.
    fn take_first(&self, tag: u64) -> Option<(usize, bool)> {
        self.update(tag, |front, back| (front + 1, back))
            .map(|(front, back)| (front, front + 1 == back))
    }

    /// Takes the back half of the chunks left (at least one), for a thread done with its own
    /// share: it walks them front to back too, so a thread that ends up doing another's work
    /// (beside a busy process) still streams long ranges rather than one chunk at a time
    /// from the back (which cost 10% of SmolLM2's decode there).
    fn steal_half(&self, tag: u64) -> Option<(usize, usize)> {
        let mid = |front: usize, back: usize| front + (back - front) / 2;
        self.update(tag, |front, back| (front, mid(front, back)))
            .map(|(front, back)| (mid(front, back), back))
    }
}

/// Sets thread `i`'s share for run `tag` (its contiguous part of `n_chunks`) with the first
/// chunk taken out, which it returns. Each index sets its own share, so its line need not
/// move to the caller and back before the work starts (until it does, the others find another
/// run's share there, another tag, and leave it alone), and takes its first chunk with a plain
/// store: a locked instruction here would wait for this thread's earlier stores, the caller's
/// of the generation among them, to reach the other core.
fn start_share(slots: &[Slot], i: usize, n_chunks: usize, tag: u64) -> Option<usize> {
    let n = slots.len();
    let (front, back) = (n_chunks * i / n, n_chunks * (i + 1) / n);
    let first = (front < back).then_some(front);
    let rest = front + usize::from(first.is_some());
    slots[i]
        .share
        .0
        .store(Share::pack(tag, rest, back), Ordering::Relaxed);
    first
}

/// Thread `i`'s next chunk of run `tag`: `first` (set aside by [`start_share`]), then the
/// front of its own share, then the back halves it takes over from the others' shares; `None`
/// when none is left to take.
fn next_chunk(slots: &[Slot], i: usize, tag: u64, first: &mut Option<usize>) -> Option<usize> {
    let n = slots.len();
    loop {
        if let Some(c) = first.take() {
            return Some(c);
        }
        if let Some((c, last)) = slots[i].share.take_first(tag) {
            if last && i != 0 {
                // A worker on the last chunk of its share hints in the shares it will look at
                // next: the caller started first and is most often done with its own by now,
                // so the line stays valid until it is read, and the worker's end of the run
                // (most often the run's last) is one round trip between the cores shorter.
                // (Not the caller: its hint would cost a still busy worker that round trip
                // at its next claim.) Runs of 8 short chunks took 110-170 ns less, near and
                // far apart; Gemma 3's matmuls at depth 4,096 a median 1.5-2.5% less.
                for k in 1..n {
                    read_line(&slots[(i + k) % n].share);
                }
            }
            return Some(c);
        }
        // Done with its share: take over the back half of another's.
        let (front, back) = (1..n).find_map(|k| slots[(i + k) % n].share.steal_half(tag))?;
        // Only this thread writes its share while the share is empty (the others change a
        // share only while chunks are left in it).
        slots[i]
            .share
            .0
            .store(Share::pack(tag, front, back), Ordering::Relaxed);
    }
}

impl ThreadPool {
    /// Calls `work(c)` once for every chunk `c` in `0..n_chunks`, on all the pool's threads,
    /// and returns when all calls have finished.
    ///
    /// Thread `i` owns the `i`-th contiguous share of the chunks and walks it front to back;
    /// a thread done with its own share then takes over the back half of another's (as its
    /// new share), and so on until no chunk is left. So in the common case each thread streams
    /// one contiguous range (which the hardware prefetchers follow) and claims its chunks on
    /// a cache line no other thread touches, while a thread slowed down (by another process
    /// on its core) still hands its work to the rest. A single shared counter cost ~50 ns a
    /// chunk on a 2-core VM: the line moved between the cores at every claim.
    ///
    /// # Panics
    /// If `n_chunks` does not fit in 32 bits, or as [`ThreadPool::run`] does.
    pub fn run_chunks(&self, n_chunks: usize, work: &(dyn Fn(usize) + Sync)) {
        self.run_shares(n_chunks, &|next| {
            while let Some(c) = next() {
                work(c);
            }
        });
    }

    /// [`ThreadPool::run_chunks`] for a worker that claims its chunks itself: `f` runs once on
    /// each thread, and each call of the `next` it is given claims that thread's next chunk
    /// (front to back through its own share, then through halves taken over from the others';
    /// `None` when it finds none left to take, the worker's cue to return: the rest are being
    /// run by the threads that took them). A worker may claim a chunk before it is done with
    /// the one in hand, to prefetch what the next one reads. Every chunk is claimed exactly
    /// once.
    ///
    /// # Panics
    /// If `n_chunks` does not fit in 32 bits, or as [`ThreadPool::run`] does.
    pub fn run_shares(&self, n_chunks: usize, f: &(dyn Fn(&mut Claim<'_>) + Sync)) {
        let n = self.shared.n_threads;
        if n == 1 {
            let mut chunks = 0..n_chunks;
            f(&mut || chunks.next());
            return;
        }
        assert!(n_chunks < 1 << CHUNK_BITS, "run_shares: too many chunks");
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Only changed under `run_lock`.
        let tag = self.share_runs.fetch_add(1, Ordering::Relaxed) + 1;
        let slots = &self.shared.slots;
        self.run_locked(&|i, _| {
            let mut first = start_share(slots, i, n_chunks, tag);
            f(&mut || next_chunk(slots, i, tag, &mut first))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{self, AssertUnwindSafe};
    use std::sync::atomic::AtomicU32;
    use std::thread;
    use std::time::Duration;

    /// Every chunk runs exactly once, whatever the thread and chunk counts, also when the
    /// first chunk of a share is slow (so other threads take the rest of that share).
    #[test]
    fn run_chunks_runs_every_chunk_once() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n);
            for n_chunks in [0, 1, 2, 5, 16, 100] {
                for slow in [None, Some(0), Some(n_chunks / 2)] {
                    let counts: Vec<AtomicU32> = (0..n_chunks).map(|_| AtomicU32::new(0)).collect();
                    pool.run_chunks(n_chunks, &|c| {
                        if slow == Some(c) {
                            thread::sleep(Duration::from_millis(2));
                        }
                        counts[c].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(
                        counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                        "{n} threads, {n_chunks} chunks, slow chunk {slow:?}"
                    );
                }
            }
        }
    }

    /// A worker claiming its own chunks (one ahead of the one in hand) gets each chunk once,
    /// and a lone thread gets them in order.
    #[test]
    fn run_shares_claims_every_chunk_once() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n);
            for n_chunks in [0, 1, 5, 16, 100] {
                let counts: Vec<AtomicU32> = (0..n_chunks).map(|_| AtomicU32::new(0)).collect();
                pool.run_shares(n_chunks, &|next| {
                    let mut ahead = next();
                    let mut last = None;
                    while let Some(c) = ahead {
                        ahead = next();
                        if n == 1 {
                            assert_eq!(c, last.map_or(0, |l| l + 1));
                        }
                        counts[c].fetch_add(1, Ordering::Relaxed);
                        last = Some(c);
                    }
                });
                assert!(
                    counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                    "{n} threads, {n_chunks} chunks"
                );
            }
        }
    }

    /// A share hands its owner the chunks front to back, and another thread the back half of
    /// what is left (at least one chunk), until none is left.
    #[test]
    fn a_share_is_taken_from_the_front_and_halved_from_the_back() {
        let share = Share(AtomicU64::new(Share::pack(7, 2, 9)));
        assert_eq!(
            share.take_first(6),
            None,
            "another run's share counts as empty"
        );
        assert_eq!(share.steal_half(8), None);
        assert_eq!(share.take_first(7), Some((2, false)));
        assert_eq!(share.steal_half(7), Some((6, 9)));
        assert_eq!(share.take_first(7), Some((3, false)));
        assert_eq!(share.steal_half(7), Some((5, 6)));
        assert_eq!(share.steal_half(7), Some((4, 5)));
        assert_eq!(share.take_first(7), None);
        assert_eq!(share.steal_half(7), None);
        // The owner learns which chunk is its share's last.
        let share = Share(AtomicU64::new(Share::pack(7, 0, 2)));
        assert_eq!(share.take_first(7), Some((0, false)));
        assert_eq!(share.take_first(7), Some((1, true)));
        assert_eq!(share.take_first(7), None);
    }

    /// A run whose worker panics leaves chunks in the shares; the next run must neither take
    /// them (they would be out of its range) nor lose any of its own.
    #[test]
    fn shares_left_by_a_panicking_run_are_not_taken() {
        let pool = ThreadPool::new(2);
        for round in 0..50 {
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run_shares(64, &|next| {
                    if let Some(c) = next() {
                        assert!(c < 64);
                        panic!("boom");
                    }
                })
            }));
            assert!(r.is_err());
            let n_chunks = 3 + round % 5;
            let counts: Vec<AtomicU32> = (0..n_chunks).map(|_| AtomicU32::new(0)).collect();
            pool.run_chunks(n_chunks, &|c| {
                counts[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        }
    }
}
