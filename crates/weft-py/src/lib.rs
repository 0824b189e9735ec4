//! The `weft` Python package's native module (`weft._weft`): the public `weft` API wrapped
//! class for class, with no logic of its own. Every call that runs the model releases the GIL,
//! so Python threads and asyncio tasks on one engine share its scheduler's model calls.

mod adapter;
mod beam;
mod callbacks;
mod context;
mod driver;
mod engine;
mod errors;
mod forward;
mod generation;
mod probes;
mod rollout;
mod sampling;
mod step;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

/// Awaitables handed to asyncio whose Rust side has not finished, and whether there ever were
/// any. Their runtime threads take the GIL to deliver results; one still doing so when the
/// interpreter finalizes aborts the process (PyO3/pyo3-async-runtimes#40).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static USED: AtomicUsize = AtomicUsize::new(0);

/// Counts one awaitable in flight for as long as it lives.
struct InFlight;

impl InFlight {
    fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        USED.store(1, Ordering::SeqCst);
        InFlight
    }
}

/// Runs `fut` to its end on this thread with the GIL released: every blocking call of the
/// package waits on weft here. Refused inside a Python constraint's or speculator's method,
/// where the wait could not nest in the one running the step (see [`callbacks`]).
pub(crate) fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    callbacks::not_inside_a_callback()?;
    Ok(py.detach(|| weft::block_on(fut)))
}

/// [`wait`] for calls that may run for minutes (a batch of rollouts, a beam search): every
/// 50 ms it looks for a Ctrl-C, and on one it drops `fut`, whose contexts give their pages
/// back, and raises `KeyboardInterrupt` at once rather than when the whole call is done.
pub(crate) fn wait_interruptible<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    callbacks::not_inside_a_callback()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        let slice = Duration::from_millis(50);
        match py.detach(|| weft::block_on_for(fut.as_mut(), slice)) {
            Some(out) => return Ok(out),
            None => py.check_signals()?,
        }
    }
}

/// Whether the async runtime (pyo3-async-runtimes' tokio runtime, one per process, made at
/// the first awaitable) was made in another process, which this one is a `fork()` of: its
/// worker threads are not here, and an awaitable would never finish.
fn forked_from_async_runtime() -> bool {
    static RUNTIME_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *RUNTIME_PID.get_or_init(std::process::id) != std::process::id()
}

/// Whether an asyncio event loop runs on this thread.
pub(crate) fn loop_running(py: Python<'_>) -> PyResult<bool> {
    Ok(!py
        .import("asyncio")?
        .call_method0("_get_running_loop")?
        .is_none())
}

/// `fut` as a Python awaitable, counted in flight (see [`_quiesce`]) until it ends or is
/// cancelled. Every awaitable of the package is made here.
///
/// It is always a coroutine, so that `asyncio.create_task`, `TaskGroup` and `asyncio.run`
/// take it. Called inside a running event loop, its work starts at once (so awaiting two in
/// turn overlaps them, as `gather` does); called before any loop runs, as in
/// `asyncio.run(g.atext())`, it starts the work when first awaited (an asyncio future needs a
/// loop to belong to).
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    if forked_from_async_runtime() {
        return Err(errors::EngineStopped::new_err(
            "weft's asyncio support started in the process this one was forked from, and its \
             threads did not come along: use the blocking calls here, or start processes with \
             multiprocessing's 'spawn' or 'forkserver'",
        ));
    }
    let in_flight = InFlight::new();
    let fut = async move {
        let _in_flight = in_flight;
        Ok(match fut.await {
            Ok(value) => Outcome::Value(value),
            Err(e) => Outcome::Failed(Failed(std::sync::Mutex::new(Some(e)))),
        })
    };
    let aio = py.import("weft._aio")?;
    if loop_running(py)? {
        let started = pyo3_async_runtimes::tokio::future_into_py(py, fut)?;
        return aio.getattr("started")?.call1((started,));
    }
    // Dropped unawaited, the closure drops the future and its count with it.
    let pending = std::sync::Mutex::new(Some(fut));
    let start = pyo3::types::PyCFunction::new_closure(py, None, None, move |args, _| {
        let fut = pending
            .lock()
            .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("awaitable poisoned"))?
            .take()
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("this awaitable was already awaited")
            })?;
        pyo3_async_runtimes::tokio::future_into_py(args.py(), fut).map(Bound::unbind)
    })?;
    aio.getattr("start_when_awaited")?.call1((start,))
}

/// What an awaitable's future hands to asyncio: its value, or its error in a [`Failed`] box
/// that `weft._aio` opens and raises.
enum Outcome<T> {
    Value(T),
    Failed(Failed),
}

impl<'py, T: IntoPyObject<'py>> IntoPyObject<'py> for Outcome<T> {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Outcome::Value(v) => v.into_bound_py_any(py),
            Outcome::Failed(f) => Ok(Bound::new(py, f)?.into_any()),
        }
    }
}

/// An awaitable's error on its way to the awaiting coroutine, which takes it out (`raise_`)
/// as soon as it has it.
///
/// Handed over as the asyncio future's exception, it stayed reachable from that future,
/// which pyo3-async-runtimes' runtime thread holds until a moment after the awaiting task
/// resumed, in a reference Python's collector cannot see. When the error was a Python
/// callback's exception, kept by its generation and with the awaiting frame (which holds the
/// generation) in its traceback, a `gc.collect()` in that moment found the cycle still
/// referenced and left it, and the context's KV pages, to a later collection.
#[pyclass(frozen, module = "weft._weft", name = "_Failed")]
struct Failed(std::sync::Mutex<Option<PyErr>>);

#[pymethods]
impl Failed {
    /// Raises the error (once; after that, RuntimeError).
    fn raise_(&self) -> PyResult<()> {
        Err(driver::lock(&self.0).take().unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("this error was already raised")
        }))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Run by `atexit` (see `weft/__init__.py`): with the GIL released, lets the runtime threads
/// finish delivering results (at most 2 s), so none is inside Python when it finalizes.
#[pyfunction]
fn _quiesce(py: Python<'_>) {
    if USED.load(Ordering::SeqCst) == 0 {
        return;
    }
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        while IN_FLIGHT.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        // A result's delivery ends a little after its future: let it leave Python.
        std::thread::sleep(Duration::from_millis(50));
    });
}

#[pymodule]
fn _weft(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // NumPy's C API is looked up when the first array is made. Made here, at import: a
    // Ctrl-C still pending when a long pass returns made that lookup fail, and rust-numpy
    // panics then (`PanicException` in place of `KeyboardInterrupt`).
    m.py().import("numpy")?;
    let _ = numpy::PyArray1::<f32>::zeros(m.py(), 0, false);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<adapter::Adapter>()?;
    m.add_class::<engine::Embedder>()?;
    m.add_class::<engine::Metrics>()?;
    m.add_class::<context::Context>()?;
    m.add_class::<generation::Generation>()?;
    m.add_class::<rollout::Rollout>()?;
    m.add_function(wrap_pyfunction!(rollout::generate_batch, m)?)?;
    m.add_class::<beam::BeamHypothesis>()?;
    m.add_function(wrap_pyfunction!(beam::beam_search, m)?)?;
    m.add_function(wrap_pyfunction!(_quiesce, m)?)?;
    m.add_class::<Failed>()?;
    // Private: `from weft import *` does not bring them.
    let all = m.index()?;
    all.call_method1("remove", ("_quiesce",))?;
    all.call_method1("remove", ("_Failed",))?;
    forward::register(m)?;
    step::register(m)?;
    sampling::register(m)?;
    errors::register(m)?;
    Ok(())
}
