//! Runs in phases: [`ThreadPool::run_phases`] runs several lots of chunks one after another in
//! one run, each thread going on to the next lot as soon as every chunk of the current one is
//! done, instead of one run per lot.
//!
//! Why: a run hands over twice (the caller publishes the job and the worker reads what the
//! caller wrote; the worker finishes and the caller reads what it wrote), ~0.7 µs with the two
//! threads on one core complex and ~2.3 µs across two (measured inside a decode, see the
//! README). A barrier where both threads arrive with their work done costs one line each way,
//! at the same time, and no thread sits idle while the other prepares the next lot alone.
//!
//! Protocol (run of generation `g`, phases `0..P`): each thread starts phase `p` by setting
//! its own share of the phase's chunks (tag: the run's first share tag + `p`) and takes chunks
//! as [`ThreadPool::run_shares`] does, halves of the others' shares when its own is empty. At
//! the end of a phase it publishes how many chunks of the run it has finished (`progress`,
//! tagged with `g`) and waits until the published counts add up to every chunk of phases
//! `0..=p`. The caller waiting there first *adopts* every index whose worker has not claimed
//! it yet (it claims the index, marks it done for [`ThreadPool::run`]'s sake and from then on
//! sets that index's shares itself and takes their chunks), so a worker that is asleep or
//! descheduled never holds a barrier up; one that claimed its index is waited for, as a run
//! waits for it. No barrier after the last phase: the run's end waits for the workers.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::PoisonError;
use std::thread;
use std::time::Instant;

use super::shares::{next_chunk, share_range, start_share, Share, CHUNK_BITS};
use super::{claim, Shared, ThreadPool, SPINS_PER_CHECK, SPIN_TIME};

/// Bits of the finished-chunk count in a slot's `progress`; the generation fills the rest
/// (44 bits: it never wraps).
const DONE_BITS: u32 = 20;

impl ThreadPool {
    /// Runs `chunks.len()` phases of chunks on all the pool's threads: for each phase `p` in
    /// order, `work(thread, p, c)` once for every chunk `c` in `0..chunks[p]`, a phase's
    /// first call on any thread only once every chunk of the phase before it has finished (on
    /// whatever thread). Each thread calls `prepare(thread, p)` before its first chunk of
    /// phase `p` (not at all for a phase it takes no chunk of): the place for work every
    /// thread repeats for itself on what the previous phase wrote.
    ///
    /// `thread` is in `0..n_threads` and names one thread for the whole run, so it can index
    /// per-thread scratch: no two calls with the same `thread` run at once. Chunks are shared
    /// out as by [`ThreadPool::run_chunks`]. Allocates nothing unless a worker is late.
    ///
    /// # Panics
    /// If a phase has 2^24 chunks or more, or the phases 2^20 in all; as [`ThreadPool::run`]
    /// does when a call panics (the other threads then skip the rest of the run).
    pub fn run_phases(
        &self,
        chunks: &[usize],
        prepare: &(dyn Fn(usize, usize) + Sync),
        work: &(dyn Fn(usize, usize, usize) + Sync),
    ) {
        let n = self.shared.n_threads;
        if n == 1 {
            for (p, &n_chunks) in chunks.iter().enumerate() {
                if n_chunks > 0 {
                    prepare(0, p);
                }
                (0..n_chunks).for_each(|c| work(0, p, c));
            }
            return;
        }
        assert!(
            chunks.iter().all(|&c| c < 1 << CHUNK_BITS)
                && chunks.iter().sum::<usize>() < 1 << DONE_BITS,
            "run_phases: too many chunks"
        );
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Only changed under `run_lock`: phase p's shares take tag `tag0 + p`.
        let tag0 = self
            .share_runs
            .fetch_add(chunks.len() as u64, Ordering::Relaxed)
            + 1;
        let aborted = AtomicBool::new(false);
        let sh = &*self.shared;
        self.run_locked(&|i, n| {
            let mut thread = PhaseThread {
                sh,
                i,
                n,
                // No other run is published before this one has finished.
                gen: sh.generation.load(Ordering::Acquire),
                tag0,
                done: 0,
                adopted: Vec::new(),
                all_claimed: i != 0,
                aborted: &aborted,
            };
            let r = panic::catch_unwind(AssertUnwindSafe(|| thread.run(chunks, prepare, work)));
            if let Err(p) = r {
                // The others stop waiting for chunks this thread will never finish.
                aborted.store(true, Ordering::Relaxed);
                panic::resume_unwind(p);
            }
        });
    }
}

/// One thread index's walk through the phases of a [`ThreadPool::run_phases`] run.
struct PhaseThread<'a> {
    sh: &'a Shared,
    i: usize,
    n: usize,
    gen: u64,
    tag0: u64,
    /// Chunks of this run this thread has finished.
    done: usize,
    /// Indices whose work this thread (the caller's) took over.
    adopted: Vec<usize>,
    /// Whether every index is known to be claimed (by its worker or adopted): checked at the
    /// caller's first barrier (an index claimed stays claimed for the run); workers never
    /// adopt.
    all_claimed: bool,
    aborted: &'a AtomicBool,
}

/// How a wait at a barrier ended.
enum Barrier {
    Passed,
    /// The caller adopted this index: its share of the phase is to be done.
    Adopted(usize),
    Aborted,
}

impl PhaseThread<'_> {
    fn run(
        &mut self,
        chunks: &[usize],
        prepare: &(dyn Fn(usize, usize) + Sync),
        work: &(dyn Fn(usize, usize, usize) + Sync),
    ) {
        let slots = &self.sh.slots;
        let mut through = 0; // chunks of phases 0..=p
        for (p, &n_chunks) in chunks.iter().enumerate() {
            if self.aborted.load(Ordering::Relaxed) {
                return;
            }
            let tag = self.tag0 + p as u64;
            through += n_chunks;
            let mut first = start_share(slots, self.i, self.n, n_chunks, tag);
            for &k in &self.adopted {
                self.set_share(k, n_chunks, tag);
            }
            let mut prepared = false;
            loop {
                while let Some(c) = next_chunk(slots, self.i, tag, &mut first) {
                    if !prepared {
                        prepare(self.i, p);
                        prepared = true;
                    }
                    work(self.i, p, c);
                    self.done += 1;
                }
                if p + 1 == chunks.len() {
                    return;
                }
                match self.barrier(through) {
                    Barrier::Passed => break,
                    Barrier::Adopted(k) => self.set_share(k, n_chunks, tag),
                    Barrier::Aborted => return,
                }
            }
        }
    }

    /// Sets index `k`'s share of a phase of `n_chunks` (all of it: its owner is this thread).
    fn set_share(&self, k: usize, n_chunks: usize, tag: u64) {
        let (front, back) = share_range(n_chunks, k, self.n);
        let share = &self.sh.slots[k].share;
        share
            .0
            .store(Share::pack(tag, front, back), Ordering::Relaxed);
    }

    /// Publishes this thread's progress and waits until the run's finished chunks reach
    /// `through`, adopting (on the caller) any index no worker has claimed.
    fn barrier(&mut self, through: usize) -> Barrier {
        let (sh, gen) = (self.sh, self.gen);
        let progress = |k: usize| &sh.slots[k].progress.0;
        // Release: the chunks' outputs are visible to whoever sees the count.
        progress(self.i).store(gen << DONE_BITS | self.done as u64, Ordering::Release);
        let (mut spins, mut start) = (0u32, None);
        loop {
            let finished: usize = (0..self.n)
                .map(|k| {
                    let v = progress(k).load(Ordering::Acquire);
                    let mask = (1u64 << DONE_BITS) - 1;
                    // A count another run left counts as nothing.
                    let this_run = v >> DONE_BITS == gen & (u64::MAX >> DONE_BITS);
                    if this_run {
                        (v & mask) as usize
                    } else {
                        0
                    }
                })
                .sum();
            if finished >= through {
                return Barrier::Passed;
            }
            if self.aborted.load(Ordering::Relaxed) {
                return Barrier::Aborted;
            }
            if !self.all_claimed {
                let slots = &sh.slots;
                let late = (1..self.n).find(|&k| {
                    slots[k].claimed.load(Ordering::Relaxed) != gen && claim(sh, k, gen)
                });
                if let Some(k) = late {
                    // Its worker will find it claimed and skip this run; `run` waits for
                    // nothing from it.
                    slots[k].done.store(gen, Ordering::Release);
                    self.adopted.push(k);
                    return Barrier::Adopted(k);
                }
                self.all_claimed = true;
            }
            // Spin, then yield (never park: no one would wake this thread).
            spins = spins.wrapping_add(1);
            let checking = spins.is_multiple_of(SPINS_PER_CHECK);
            if checking && start.get_or_insert_with(Instant::now).elapsed() >= SPIN_TIME {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, AtomicUsize};
    use std::sync::Mutex;
    use std::time::Duration;

    /// What the calls of one run did: per phase and chunk, how often it ran; per thread and
    /// phase, how often it prepared; a thread's calls overlapping; the order broken.
    struct Log {
        counts: Vec<Vec<AtomicU32>>,
        finished: Vec<AtomicUsize>,
        prepared: Vec<Vec<AtomicU32>>,
        busy: Vec<AtomicBool>,
        threads_seen: Mutex<Vec<usize>>,
    }

    impl Log {
        fn new(chunks: &[usize], n: usize) -> Log {
            let counters = |k: usize| (0..k).map(|_| AtomicU32::new(0)).collect::<Vec<_>>();
            Log {
                counts: chunks.iter().map(|&c| counters(c)).collect(),
                finished: chunks.iter().map(|_| AtomicUsize::new(0)).collect(),
                prepared: (0..n).map(|_| counters(chunks.len())).collect(),
                busy: (0..n).map(|_| AtomicBool::new(false)).collect(),
                threads_seen: Mutex::new(Vec::new()),
            }
        }

        /// Marks `thread` busy for the call `f`; a thread's calls never overlap.
        fn on(&self, thread: usize, f: impl FnOnce()) {
            assert!(
                !self.busy[thread].swap(true, Ordering::SeqCst),
                "thread {thread} twice"
            );
            f();
            self.busy[thread].store(false, Ordering::SeqCst);
        }

        fn run(&self, pool: &ThreadPool, chunks: &[usize], slow: Option<(usize, usize)>) {
            pool.run_phases(
                chunks,
                &|t, p| {
                    self.on(t, || {
                        if p > 0 {
                            assert_eq!(self.finished[p - 1].load(Ordering::SeqCst), chunks[p - 1]);
                        }
                        self.prepared[t][p].fetch_add(1, Ordering::SeqCst);
                    })
                },
                &|t, p, c| {
                    self.on(t, || {
                        assert_eq!(self.prepared[t][p].load(Ordering::SeqCst), 1);
                        if p > 0 {
                            // Every chunk of the phase before has finished.
                            assert_eq!(self.finished[p - 1].load(Ordering::SeqCst), chunks[p - 1]);
                        }
                        if slow == Some((p, c)) {
                            thread::sleep(Duration::from_millis(2));
                        }
                        self.counts[p][c].fetch_add(1, Ordering::SeqCst);
                        self.finished[p].fetch_add(1, Ordering::SeqCst);
                        self.threads_seen.lock().unwrap().push(t);
                    })
                },
            );
            for (p, counts) in self.counts.iter().enumerate() {
                assert!(
                    counts.iter().all(|c| c.load(Ordering::SeqCst) == 1),
                    "phase {p} of {chunks:?}, slow {slow:?}"
                );
            }
        }
    }

    /// Every chunk of every phase runs once, a phase only after the one before has finished,
    /// each thread prepares once before its first chunk of a phase, and a thread's calls never
    /// overlap: with any number of threads and chunks, a slow chunk anywhere.
    #[test]
    fn phases_run_in_order_and_every_chunk_once() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n);
            for chunks in [&[4, 4][..], &[1, 0, 7], &[0], &[16, 3, 9, 1], &[2, 100]] {
                for slow in [None, Some((0, 0)), Some((chunks.len() - 1, 0))] {
                    Log::new(chunks, n).run(&pool, chunks, slow);
                }
            }
        }
    }

    /// A worker that is parked when a run starts cannot wake before the caller's first
    /// barrier: the caller then does its work (all calls on thread 0), and a worker that
    /// wakes during the run leaves it alone.
    #[test]
    fn the_caller_adopts_a_late_worker() {
        let pool = ThreadPool::new(2);
        let mut adopted = 0;
        for _ in 0..5 {
            // Long enough for the worker to give up spinning and yielding and park.
            thread::sleep(Duration::from_millis(5));
            let chunks = [2, 8, 8];
            let log = Log::new(&chunks, 2);
            log.run(&pool, &chunks, None);
            adopted += usize::from(log.threads_seen.lock().unwrap().iter().all(|&t| t == 0));
        }
        assert!(adopted > 0, "the caller never ran a parked worker's share");
        // The pool still works with its worker awake.
        Log::new(&[8, 8], 2).run(&pool, &[8, 8], None);
    }

    /// A panic in any phase on any thread is re-raised, the other thread stops waiting for
    /// it, and the pool runs the next run in full.
    #[test]
    fn a_panic_ends_the_run_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        for phase in 0..3 {
            for chunk in [0, 5] {
                let r = panic::catch_unwind(AssertUnwindSafe(|| {
                    pool.run_phases(&[6, 6, 6], &|_, _| {}, &|_, p, c| {
                        if (p, c) == (phase, chunk) {
                            panic!("boom");
                        }
                    })
                }));
                assert_eq!(*r.unwrap_err().downcast_ref::<&str>().unwrap(), "boom");
                Log::new(&[5, 3], 2).run(&pool, &[5, 3], None);
            }
        }
    }
}
