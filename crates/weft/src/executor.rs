//! [`block_on`]: the blocking way to call the async API.
//!
//! The engine's passes are computed on its scheduler thread, which only wakes the waiting
//! task, so a blocking call needs no runtime: poll, park the thread until woken, poll again.
//! Unlike `futures::executor::block_on`, calls may nest — a [`crate::Speculator`] whose draft
//! runs passes of its own context, or [`crate::Engine::embed`] inside a future — since nothing
//! here is tied to the thread beyond the one `park`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Wakes one `block_on` call: its own flag (a nested call parking on the same thread may
/// take the thread's unpark token, never this flag), then the thread.
struct Wakeup {
    woken: AtomicBool,
    thread: Thread,
}

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Runs a future to completion on the current thread: the blocking way to call the async
/// API (`weft::block_on(fwd.execute())`). Calls may nest (a blocking call inside a future
/// that is itself run by `block_on`). Inside an async runtime, `.await` instead: this blocks
/// the runtime's thread until the future is done.
///
/// ```no_run
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("The capital of France is")?;
/// let text = weft::block_on(ctx.generate(weft::Sampler::Argmax).max_tokens(8).collect_text())?;
/// # Ok::<(), weft::Error>(())
/// ```
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    loop {
        if let Some(out) = block_on_for(f.as_mut(), Duration::MAX) {
            return out;
        }
    }
}

/// [`block_on`] for at most `limit`: the output if the future finished by then, else `None`
/// and the future as it is, to be polled again (or dropped, which cancels it). A caller that
/// must look at something else now and then while it waits (a Ctrl-C) waits in slices.
///
/// ```no_run
/// use std::time::Duration;
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("Once upon a time")?;
/// let mut text = std::pin::pin!(ctx.generate(weft::Sampler::Argmax).max_tokens(64).collect_text());
/// let text = loop {
///     match weft::block_on_for(text.as_mut(), Duration::from_millis(50)) {
///         Some(done) => break done?,
///         None => eprint!("."), // still running
///     }
/// };
/// # Ok::<(), weft::Error>(())
/// ```
pub fn block_on_for<F: Future + ?Sized>(
    mut f: std::pin::Pin<&mut F>,
    limit: Duration,
) -> Option<F::Output> {
    let until = Instant::now().checked_add(limit);
    let wakeup = Arc::new(Wakeup {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(wakeup.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return Some(out);
        }
        // A wake-up that came while polling is in the flag: poll again without parking.
        while !wakeup.woken.swap(false, Ordering::Acquire) {
            match until {
                None => std::thread::park(),
                Some(until) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    std::thread::park_timeout(left);
                }
            }
        }
    }
}

/// A future ready once `d` has passed, on any executor: a short-lived thread sleeps and wakes
/// it. For library code's rare waits (a batch waiting for KV pages other contexts hold).
pub(crate) fn sleep(d: Duration) -> impl Future<Output = ()> {
    struct Sleep {
        done: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
        d: Option<Duration>,
    }
    impl Future for Sleep {
        type Output = ();
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.done.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            *self
                .waker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
            if let Some(d) = self.d.take() {
                let (done, waker) = (self.done.clone(), self.waker.clone());
                let timer =
                    std::thread::Builder::new()
                        .name("weft-sleep".into())
                        .spawn(move || {
                            std::thread::sleep(d);
                            done.store(true, Ordering::Release);
                            let w = waker
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .take();
                            if let Some(w) = w {
                                w.wake();
                            }
                        });
                if timer.is_err() {
                    // No thread to wait with: the wait is over (the caller polls again).
                    return Poll::Ready(());
                }
            }
            // Woken between the store above and here: ready now.
            if self.done.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            Poll::Pending
        }
    }
    Sleep {
        done: Arc::new(AtomicBool::new(false)),
        waker: Arc::new(std::sync::Mutex::new(None)),
        d: Some(d),
    }
}

#[cfg(test)]
mod tests {
    use super::{block_on, block_on_for, sleep};
    use std::future::Future;
    use std::task::Poll;
    use std::time::{Duration, Instant};

    /// A sleep wakes its task once its time has passed, not before, and two run side by side.
    #[test]
    fn sleeps_end_after_their_time() {
        let start = Instant::now();
        block_on(futures_util::future::join(
            sleep(Duration::from_millis(30)),
            sleep(Duration::from_millis(20)),
        ));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    /// A slice that ends first gives the future back unfinished, and a later call finishes it.
    #[test]
    fn waits_in_slices() {
        let (tx, rx) = futures_channel::oneshot::channel();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            wait.recv().ok();
            tx.send(7).ok();
        });
        let mut rx = std::pin::pin!(rx);
        assert_eq!(block_on_for(rx.as_mut(), Duration::from_millis(10)), None);
        go.send(()).ok();
        assert_eq!(
            block_on_for(rx.as_mut(), Duration::from_secs(60)),
            Some(Ok(7))
        );
        t.join().ok();
    }

    #[test]
    fn runs_futures_woken_from_other_threads_and_nests() {
        let (tx, rx) = futures_channel::oneshot::channel();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send(7).ok();
        });
        assert_eq!(block_on(rx), Ok(7));
        t.join().ok();
        // The inner call consumes the thread's unpark token while the outer future waits on
        // its own channel: the outer wake-up is not lost.
        let (tx1, rx1) = futures_channel::oneshot::channel::<u32>();
        let (tx2, rx2) = futures_channel::oneshot::channel::<u32>();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            tx1.send(1).ok();
            std::thread::sleep(std::time::Duration::from_millis(30));
            tx2.send(2).ok();
        });
        // First poll: register on rx1, block on rx2 (rx1's wake-up arrives meanwhile and the
        // inner park takes the thread's token), then wait without polling rx1 again: only
        // the wake-up rx1 sent can bring the second poll.
        let (mut rx1, mut rx2) = (rx1, Some(rx2));
        let outer = std::future::poll_fn(move |cx| {
            let one = std::pin::Pin::new(&mut rx1).poll(cx);
            match rx2.take() {
                Some(rx2) => {
                    assert!(one.is_pending());
                    let two = block_on(rx2);
                    assert_eq!(two, Ok(2));
                    Poll::Pending
                }
                None => one,
            }
        });
        assert_eq!(block_on(outer), Ok(1));
        t.join().ok();
    }
}
