//! A small persistent thread pool for the compute kernels.
//!
//! [`ThreadPool::run`] hands one closure to every thread and returns when all have finished; it
//! is called for every matrix multiplication (thousands of times a second), so it allocates
//! nothing and wakes workers without a system call while they are still spinning.
//! [`ThreadPool::run_chunks`] shares numbered chunks of work out over the threads on top of it.
//!
//! Key design decision: waiting degrades in three steps — spin briefly on an atomic generation
//! counter, then `yield_now`, then park — and a thread index whose worker has not woken up by
//! the time the caller has finished its own share is *run by the caller* instead. So when the
//! machine is oversubscribed (another busy process on one of the cores), a descheduled worker
//! never holds the caller up for a whole scheduler time slice: throughput degrades gracefully
//! instead of collapsing as it does with pure spinning.
//!
//! Protocol (per run, generation `g`): the caller stores the job, then publishes `g`. Each
//! index `i >= 1` is *claimed* exactly once by moving `slots[i].claimed` from `g - 1` to `g` —
//! by its worker when it wakes up, or by the caller after its own index 0. A worker stores `g`
//! in `slots[i].done` when it has finished; the caller returns once every index it did not run
//! itself is done, so the job (which borrows the caller's stack) is never used after `run`
//! returns. Each run moves few cache lines between the threads (the generation's, each slot's,
//! and whatever the job reads): on a VM whose two vCPUs sit on different core complexes each
//! costs ~200 ns, and a decode step makes ~150 runs.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

mod shares;

pub use shares::Claim;
use shares::Share;

/// Most threads a pool runs: far past the cores a small model can use, and short of what
/// would only exhaust the system's threads.
pub const MAX_THREADS: usize = 256;

/// How long a waiting thread spins on the atomic before it starts yielding.
const SPIN_TIME: Duration = Duration::from_micros(50);
/// How long (after spinning) a waiting thread calls `yield_now` before it parks.
const YIELD_TIME: Duration = Duration::from_micros(500);
/// Spin iterations between two clock reads.
const SPINS_PER_CHECK: u32 = 32;

/// The job of the current run: the caller's closure with its lifetime erased.
type Job = *const (dyn Fn(usize, usize) + Sync + 'static);

/// State shared by the caller and the workers. What a worker reads at every run (the
/// generation, the job, the thread count, the slots, the caller's sleep flag, the shutdown
/// flag) comes first, on one cache line the caller writes once a run: a worker waking up
/// fetches one line, not two.
#[repr(C, align(128))]
struct Shared {
    /// Generation of the last published job; workers wait for it to change.
    generation: AtomicU64,
    /// The job of the current run. Written only by `run` while no index of any run is claimed
    /// and unfinished; read only by a thread that has just claimed an index of the current run.
    job: UnsafeCell<Option<Job>>,
    n_threads: usize,
    /// Per thread index: its claim, share and end.
    slots: Box<[Slot]>,
    /// The caller is parked (or about to park) waiting for a worker to be done.
    caller_sleeping: AtomicBool,
    /// Set (before a final generation bump) when the pool is dropped.
    shutdown: AtomicBool,
    /// Per thread index: whether that worker is parked (or about to park).
    sleeping: Box<[AtomicBool]>,
    /// The thread a worker unparks when it is done while `caller_sleeping`.
    caller: Mutex<Option<Thread>>,
    /// The first panic payload caught on a worker during the current run.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Thread index `i`'s claim, share of chunks and end, alone on their cache lines. Its worker
/// owns the line; the others read it once at the end of their own work (to take over chunks
/// left, then to wait for it to be done), so it moves between the cores twice a run — where
/// the two threads sit on different core complexes each move costs ~200 ns.
#[repr(align(128))]
struct Slot {
    /// The generation whose job this index last claimed (index 0: unused).
    claimed: AtomicU64,
    /// The generation whose job this index's worker last finished (index 0: unused).
    done: AtomicU64,
    /// The chunks of the current [`ThreadPool::run_shares`] it has not started.
    share: Share,
}

// SAFETY: every field but `job` is Sync. `job` is only written by `run` (serialized by
// `run_lock`) while no thread may read it (all indices of the previous run are finished and the
// new generation is not yet published), and read only by threads that claimed an index of the
// current run, which `run` waits for before it returns or writes again. The raw job pointer
// points to a `Sync` closure, so sharing it between threads is sound.
unsafe impl Sync for Shared {}
// SAFETY: as above; the job pointer is only dereferenced under the claim protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run one closure on every thread at a time.
///
/// `ThreadPool` is `Send + Sync`; concurrent [`run`](ThreadPool::run) and
/// [`run_chunks`](ThreadPool::run_chunks) calls from several threads are serialized. Calling
/// either from inside a job on the same pool deadlocks.
pub struct ThreadPool {
    shared: Arc<Shared>,
    /// Worker `i` (thread index `i + 1`).
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls.
    run_lock: Mutex<()>,
    /// `run_shares` calls so far: tags each run's shares. Its own count, not the generation
    /// (which plain runs advance too): two consecutive calls' tags then always differ, also in
    /// the 16 bits a share keeps, so a share the last call left is never taken for this one's.
    share_runs: AtomicU64,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, counting the calling thread:
    /// `ThreadPool::new(2)` starts 1 worker. `n_threads == 0` is treated as 1.
    ///
    /// # Panics
    /// If `n_threads` is past [`MAX_THREADS`] or the operating system refuses to start a
    /// thread ([`ThreadPool::try_new`] returns those as errors).
    pub fn new(n_threads: usize) -> ThreadPool {
        match ThreadPool::try_new(n_threads) {
            Ok(pool) => pool,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`ThreadPool::new`], with a count past [`MAX_THREADS`] or a thread the operating
    /// system would not start as [`Error::Threads`](crate::Error::Threads).
    pub fn try_new(n_threads: usize) -> crate::Result<ThreadPool> {
        if n_threads > MAX_THREADS {
            return Err(crate::Error::Threads {
                n_threads,
                reason: format!("the thread count must be between 1 and {MAX_THREADS}"),
            });
        }
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            generation: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            slots: (0..n_threads)
                .map(|_| Slot {
                    claimed: AtomicU64::new(0),
                    done: AtomicU64::new(0),
                    share: Share(AtomicU64::new(0)),
                })
                .collect(),
            sleeping: (0..n_threads).map(|_| AtomicBool::new(false)).collect(),
            job: UnsafeCell::new(None),
            caller_sleeping: AtomicBool::new(false),
            caller: Mutex::new(None),
            panic: Mutex::new(None),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
            run_lock: Mutex::new(()),
            share_runs: AtomicU64::new(0),
        };
        for index in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            let worker = thread::Builder::new()
                .name(format!("weft-worker-{index}"))
                .spawn(move || worker_loop(&shared, index))
                // Dropping the pool stops and joins the workers already started.
                .map_err(|e| crate::Error::Threads {
                    n_threads,
                    reason: format!("the operating system would not start thread {index}: {e}"),
                })?;
            pool.workers.push(worker);
        }
        Ok(pool)
    }

    /// The number of threads, the calling thread included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(thread_index, n_threads)` once for every `thread_index` in `0..n_threads` and
    /// returns when all calls have finished.
    ///
    /// The caller runs index 0. Each other index normally runs on its own worker; an index
    /// whose worker has not woken up by the time the caller has finished index 0 is run by the
    /// caller itself (so never assume which OS thread runs an index, only that each index runs
    /// exactly once and indices may run concurrently). Allocates nothing.
    ///
    /// # Panics
    /// If any call of `f` panics, the first panic is re-raised here after every index has
    /// finished; the pool stays usable.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.shared.n_threads == 1 {
            f(0, 1);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.run_locked(f);
    }

    /// [`ThreadPool::run`] on more than one thread, with `run_lock` held by the caller.
    fn run_locked(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.n_threads;
        let sh = &*self.shared;
        let gen = sh.generation.load(Ordering::Relaxed) + 1;
        // SAFETY: the closure outlives every use of this pointer: `run` does not return before
        // every index of this generation has finished (run here or marked done), and no
        // thread reads the slot for another generation (see `Shared::job`). Only the lifetime
        // is erased; the pointer's type is otherwise unchanged.
        let job: Job =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), Job>(f) };
        // SAFETY: no thread reads the slot now (every index of the previous run has finished
        // and this generation is not published yet), and `run_lock` excludes other writers.
        unsafe { *sh.job.get() = Some(job) };
        // Publish. Release, not SeqCst: a full fence here would hold the caller until the
        // line had moved to this core. The price: a worker about to park may miss it (its
        // `sleeping` store and our load below pass each other) and sleep through this run —
        // which the caller then runs in its stead, as for any index not claimed in time —
        // until a later run sees it asleep and wakes it.
        sh.generation.store(gen, Ordering::Release);
        for (i, worker) in self.workers.iter().enumerate() {
            if sh.sleeping[i + 1].load(Ordering::Relaxed) {
                worker.thread().unpark();
            }
        }

        let mut panic = panic::catch_unwind(AssertUnwindSafe(|| f(0, n))).err();
        // Run the indices whose worker has not claimed them yet (a load first: a claimed
        // index's line then stays shared instead of moving here and back for a failed CAS),
        // then wait for the others' workers.
        for i in 1..n {
            if sh.slots[i].claimed.load(Ordering::Relaxed) != gen && claim(sh, i, gen) {
                if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| f(i, n))) {
                    panic.get_or_insert(p);
                }
            } else {
                wait_for_worker(sh, i, gen);
            }
        }
        // The workers read our share at the end of their work; take its line back now,
        // while the caller goes on alone, rather than at the next run's first claim.
        own_line(&sh.slots[0]);

        let worker_panic = sh
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(p) = panic.or(worker_panic) {
            panic::resume_unwind(p);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        for worker in &self.workers {
            worker.thread().unpark();
        }
        for worker in self.workers.drain(..) {
            // A worker only ends by returning from its loop; jobs' panics are caught.
            let _ = worker.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.shared.n_threads)
            .finish()
    }
}

/// Claims thread index `i` for generation `gen`: true for exactly one claimer per generation.
fn claim(sh: &Shared, i: usize, gen: u64) -> bool {
    sh.slots[i]
        .claimed
        .compare_exchange(gen - 1, gen, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// The body of worker `index`: wait for a new generation, claim the index, run the job.
fn worker_loop(sh: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let gen = wait_for_generation(sh, index, seen);
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = gen;
        if !claim(sh, index, gen) {
            continue; // the caller ran this index already
        }
        // SAFETY: the claim succeeded, so run `gen` is still waiting for this index and the
        // slot holds its job (written before `gen` was published, which we acquired); the
        // closure lives until that run returns, which is after we store `done`.
        let job = unsafe { &*(*sh.job.get()).expect("a published run has a job") };
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| job(index, sh.n_threads))) {
            let mut slot = sh.panic.lock().unwrap_or_else(PoisonError::into_inner);
            slot.get_or_insert(p);
        }
        // SeqCst store then load, against the caller's `caller_sleeping` store then `done`
        // load: either it sees this run done or we see it asleep.
        sh.slots[index].done.store(gen, Ordering::SeqCst);
        if sh.caller_sleeping.load(Ordering::SeqCst) {
            let caller = sh.caller.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(t) = caller.as_ref() {
                t.unpark();
            }
        }
    }
}

/// Asks for `line`'s cache line on this core (a hint, nothing outside x86): writable
/// (`prefetchw`), so a line another core has just read then costs nothing to write later.
#[inline]
fn own_line<T>(line: &T) {
    hint_line(line, true)
}

/// Asks for `line`'s cache line on this core, to read (a hint, as [`own_line`]).
#[inline]
fn read_line<T>(line: &T) {
    hint_line(line, false)
}

/// The hint behind [`own_line`] (`write`) and [`read_line`].
#[inline]
fn hint_line<T>(line: &T, write: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, and `line` is a valid reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        let p = (line as *const T).cast();
        match write {
            true => _mm_prefetch::<_MM_HINT_ET0>(p),
            false => _mm_prefetch::<_MM_HINT_T0>(p),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (line, write);
}

/// Spins of a worker's wait after which it takes its slot's line back: by then (~0.4 µs; a
/// spin pauses ~24 ns on the Zen 5 host) the caller has read it to see the last run done,
/// and the next run's claim then finds the line on this core.
const OWN_SLOT_AFTER_SPINS: u32 = 16;

/// Waits (spin, then yield, then park) until the generation differs from `seen`; returns it.
fn wait_for_generation(sh: &Shared, index: usize, seen: u64) -> u64 {
    let mut backoff = Backoff::new();
    loop {
        let gen = sh.generation.load(Ordering::Acquire);
        if gen != seen {
            return gen;
        }
        let snoozed = backoff.snooze();
        if backoff.spins == OWN_SLOT_AFTER_SPINS {
            own_line(&sh.slots[index]);
        }
        if snoozed {
            continue;
        }
        // Park, unless the generation moved meanwhile. The caller publishes it with a release
        // store and reads `sleeping` relaxed, so the two may pass each other and this worker
        // sleep through a run: the caller then runs its index (see `run_locked`), and the next
        // run finds it asleep and wakes it.
        sh.sleeping[index].store(true, Ordering::SeqCst);
        if sh.generation.load(Ordering::SeqCst) == seen {
            thread::park();
        }
        sh.sleeping[index].store(false, Ordering::SeqCst);
    }
}

/// Waits (spin, then yield, then park) until the worker of index `i`, which claimed run
/// `gen`, has finished it.
fn wait_for_worker(sh: &Shared, i: usize, gen: u64) {
    let done = &sh.slots[i].done;
    let mut backoff = Backoff::new();
    while done.load(Ordering::Acquire) != gen {
        if backoff.snooze() {
            continue;
        }
        *sh.caller.lock().unwrap_or_else(PoisonError::into_inner) = Some(thread::current());
        // SeqCst store then load, against the worker's SeqCst `done` store then load.
        sh.caller_sleeping.store(true, Ordering::SeqCst);
        if done.load(Ordering::SeqCst) != gen {
            thread::park();
        }
        sh.caller_sleeping.store(false, Ordering::SeqCst);
    }
}

/// Spin-then-yield pacing of a wait loop.
struct Backoff {
    start: Option<Instant>,
    spins: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            start: None,
            spins: 0,
        }
    }

    /// Waits a little; false once the spin and yield budgets are spent (time to park).
    fn snooze(&mut self) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CHECK) {
            std::hint::spin_loop();
            return true;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        let waited = start.elapsed();
        if waited < SPIN_TIME {
            std::hint::spin_loop();
            true
        } else if waited < SPIN_TIME + YIELD_TIME {
            thread::yield_now();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_index_runs_once_per_run() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..2000 {
                pool.run(&|i, nt| {
                    assert_eq!(nt, n);
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            for c in &counts {
                assert_eq!(c.load(Ordering::Relaxed), 2000);
            }
        }
    }

    #[test]
    fn run_waits_for_slow_workers() {
        let pool = ThreadPool::new(3);
        let done = AtomicU32::new(0);
        pool.run(&|i, _| {
            if i != 0 {
                thread::sleep(Duration::from_millis(20));
            }
            done.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2);
        let hits = AtomicU32::new(0);
        for _ in 0..3 {
            // Long enough for the worker to give up spinning and yielding and park.
            thread::sleep(Duration::from_millis(5));
            pool.run(&|_, _| {
                hits.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(hits.load(Ordering::SeqCst), 6);
    }

    #[test]
    fn panics_are_reraised_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        for bad in [0, 1] {
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|i, _| {
                    if i == bad {
                        panic!("boom {i}");
                    }
                })
            }));
            let msg = r.unwrap_err();
            assert_eq!(
                msg.downcast_ref::<String>().unwrap(),
                &format!("boom {bad}")
            );
        }
        let hits = AtomicU32::new(0);
        pool.run(&|_, _| {
            hits.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn concurrent_callers_are_serialized() {
        let pool = ThreadPool::new(2);
        let total = AtomicU32::new(0);
        thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..300 {
                        pool.run(&|_, _| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 300 * 2);
    }
}
