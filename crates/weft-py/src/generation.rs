//! `weft.Generation`: a running `Generator` as a Python sync and async iterator of text
//! deltas, with collectors.
//!
//! The generator borrows its context, so both live in one pinned stream (the context in a
//! [`Lease`]): dropping the stream drops the generator, then puts the context back.

use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::callbacks::{Callback, PyConstraint, PySpeculator};
use crate::context::Lease;
use crate::driver::{self, lock, Cmd, Inbox, Item, Progress, Raised, Record, Replies, Shared};
use crate::errors::{to_py, ConfigError, JsonError};
use crate::forward::ProbeHandle;
use crate::sampling::Probe;
use crate::step::Step;

/// Everything `Context.generate` takes besides the context.
#[derive(Default)]
pub struct GenOptions {
    /// Take up the generator saved in the snapshot the context was resumed from, rather than
    /// start one (the other options then apply on top of it).
    pub resume: bool,
    pub sampler: Option<weft::Sampler>,
    pub max_tokens: Option<usize>,
    pub min_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub stop_sequences: Vec<Vec<u32>>,
    pub penalties: Option<weft::Penalties>,
    pub adapters: Vec<(weft::Adapter, f32)>,
    pub schema: Option<weft::Schema>,
    pub speculate: bool,
    pub seed: Option<u64>,
    pub ignore_eos: bool,
    pub logit_bias: Vec<(u32, f32)>,
    pub horizon: Option<usize>,
    pub zo_seed: Option<(u64, f32)>,
    pub constraints: Vec<PyConstraint>,
    pub speculator: Option<PySpeculator>,
}

impl GenOptions {
    /// The one constraint given, if any; a JSON schema is a dict (or a JSON string).
    pub fn schema(
        json_schema: Option<&Bound<'_, PyAny>>,
        regex: Option<String>,
        grammar: Option<String>,
        gbnf: Option<String>,
    ) -> PyResult<Option<weft::Schema>> {
        let mut given = Vec::new();
        if let Some(s) = json_schema {
            let text: String = if let Ok(t) = s.extract::<String>() {
                t
            } else if let Ok(b) = s.cast::<pyo3::types::PyBool>() {
                // JSON Schema's boolean schemas: `True` allows any JSON value, `False` none.
                b.is_true().to_string()
            } else if s.is_instance_of::<PyDict>() || s.hasattr("keys")? {
                let json = s.py().import("json")?;
                json.call_method1("dumps", (s,))?.extract()?
            } else {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "json_schema must be a dict, a bool or a JSON string",
                ));
            };
            let value = serde_json::from_str(&text).map_err(|e| {
                to_py(weft::Error::Grammar {
                    kind: "JSON schema",
                    message: e.to_string(),
                })
            })?;
            given.push(weft::Schema::JsonSchema(value));
        }
        given.extend(regex.map(weft::Schema::Regex));
        given.extend(grammar.map(weft::Schema::Lark));
        given.extend(gbnf.map(weft::Schema::Gbnf));
        if given.len() > 1 {
            return Err(ConfigError::new_err(
                "give at most one of json_schema, regex, grammar and gbnf",
            ));
        }
        Ok(given.pop())
    }

    pub fn apply<'c>(self, ctx: &'c mut weft::Context) -> weft::Result<weft::Generator<'c>> {
        if let Some(seed) = self.seed {
            ctx.set_seed(seed);
        }
        let mut g = match self.resume {
            true => ctx.resume_generator()?,
            false => ctx.generate(self.sampler),
        };
        if let Some(n) = self.max_tokens {
            g = g.max_tokens(n);
        }
        if let Some(n) = self.min_tokens {
            g = g.min_tokens(n);
        }
        for s in &self.stop {
            g = g.stop_string(s);
        }
        if !self.stop_token_ids.is_empty() {
            g = g.stop(&self.stop_token_ids);
        }
        for s in &self.stop_sequences {
            g = g.stop_sequence(s);
        }
        if let Some(p) = self.penalties {
            g = g.penalties(p);
        }
        for (a, scale) in &self.adapters {
            g = g.adapter(a, *scale);
        }
        if let Some(schema) = self.schema {
            g = g.constrain_with(schema);
        }
        if self.speculate {
            g = g.system_speculation();
        }
        if self.ignore_eos {
            g = g.ignore_eos();
        }
        if !self.logit_bias.is_empty() {
            g = g.logit_bias(&self.logit_bias);
        }
        if let Some(n) = self.horizon {
            g = g.horizon(n);
        }
        if let Some((seed, sigma)) = self.zo_seed {
            g = g.zo_seed(seed, sigma);
        }
        for c in self.constraints {
            g = g.constrain(c);
        }
        if let Some(s) = self.speculator {
            g = g.speculator(s);
        }
        Ok(g)
    }
}

/// A delta made for an `__anext__` and not taken yet: one cancelled (a timeout) after its
/// delta was made leaves it here for the next call, rather than losing its text.
type Held = Arc<Mutex<Option<PyResult<Option<String>>>>>;

/// The generator's side of a generation, shared with its steps: the stream that runs it and
/// where requests, exceptions from Python callbacks and progress meet.
#[derive(Clone)]
pub struct Handle {
    pub stream: Shared,
    pub inbox: Inbox,
    pub raised: Raised,
    pub progress: Record,
    /// The id of the generation's every-step probe handles.
    pub id: u64,
}

impl Handle {
    /// Carries out `cmd` once the stream is free (see [`driver::request_in`]).
    pub async fn request(&self, cmd: Cmd) -> PyResult<Option<Item>> {
        self.request_in_turn(Turn::Later(self.stream.clone()), cmd)
            .await
    }

    /// [`Handle::request`], blocking with the GIL released.
    pub fn request_blocking(&self, py: Python<'_>, cmd: Cmd) -> PyResult<Option<Item>> {
        crate::wait(py, self.request(cmd))?
    }

    /// The next text delta, `None` at the end; `slot` is the stream's, locked.
    async fn next_text_in(&self, slot: &mut Option<Replies>) -> PyResult<Option<String>> {
        match driver::request_in(slot, &self.inbox, &self.raised, Cmd::Text).await? {
            Some(Item::Delta(d)) => Ok(Some(d)),
            _ => Ok(self.progress().tail.take()),
        }
    }

    /// The next text delta, `None` at the end.
    async fn next_text(&self) -> PyResult<Option<String>> {
        self.next_text_in(&mut *self.stream.lock().await).await
    }

    /// The turn of an awaitable made now (see [`Turn`]).
    pub fn turn(&self, py: Python<'_>) -> PyResult<Turn> {
        let running = crate::loop_running(py)?;
        Ok(match self.stream.clone().try_lock_owned() {
            Ok(guard) if running => Turn::Now(guard),
            _ => Turn::Later(self.stream.clone()),
        })
    }

    /// Carries out `cmd` in `turn`.
    pub async fn request_in_turn(&self, turn: Turn, cmd: Cmd) -> PyResult<Option<Item>> {
        let mut slot = turn.wait().await;
        driver::request_in(&mut slot, &self.inbox, &self.raised, cmd).await
    }

    /// A handle that does not keep the generation alive (a step's).
    pub fn downgrade(&self) -> WeakHandle {
        WeakHandle {
            stream: Arc::downgrade(&self.stream),
            inbox: self.inbox.clone(),
            raised: self.raised.clone(),
            progress: self.progress.clone(),
            id: self.id,
        }
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        lock(&self.progress)
    }
}

/// An awaitable's place among the generation's requests. Made inside a running event loop
/// its work starts at once, but its task may start after a call made later (a blocking
/// `next_step()` right after a cancelled `await step.execute()`): taking the stream's lock
/// when the awaitable is made, if it is free, keeps the calls in the order they were made.
/// Made before a loop runs, it waits for the lock when awaited (holding it unawaited would
/// block every other call).
pub enum Turn {
    Now(tokio::sync::OwnedMutexGuard<Option<Replies>>),
    Later(Shared),
}

impl Turn {
    async fn wait(self) -> tokio::sync::OwnedMutexGuard<Option<Replies>> {
        match self {
            Turn::Now(guard) => guard,
            Turn::Later(stream) => stream.lock_owned().await,
        }
    }
}

/// A [`Handle`] that lets its generation go when the generation is dropped.
pub struct WeakHandle {
    stream: std::sync::Weak<tokio::sync::Mutex<Option<Replies>>>,
    inbox: Inbox,
    raised: Raised,
    progress: Record,
    pub id: u64,
}

impl WeakHandle {
    /// The generation's handle, if the generation is still there.
    pub fn upgrade(&self) -> PyResult<Handle> {
        let stream = self.stream.upgrade().ok_or_else(|| {
            ConfigError::new_err("the generation this step belongs to is gone (it was dropped)")
        })?;
        Ok(Handle {
            stream,
            inbox: self.inbox.clone(),
            raised: self.raised.clone(),
            progress: self.progress.clone(),
            id: self.id,
        })
    }
}

/// A generation in progress: iterate it (`for delta in g`, `async for delta in g`) for text
/// deltas, collect it with `text()`, `tokens()`, `json()` (awaitable: `atext()`,
/// `atokens()`, `ajson()`), or step it yourself with `next_step()` and `accept()`. The
/// context is busy until it ends, is closed or is dropped.
#[pyclass(frozen, module = "weft")]
pub struct Generation {
    handle: Handle,
    held: Held,
    /// The Python constraints and speculator the generator calls: shown to Python's garbage
    /// collector, so a callback that keeps a reference to its generation does not keep both
    /// (and the context's KV pages) alive for good.
    callbacks: Mutex<Vec<Callback>>,
}

impl Generation {
    pub fn start(
        mut lease: Lease,
        opts: GenOptions,
        raised: Raised,
        callbacks: Vec<Callback>,
    ) -> PyResult<Generation> {
        // An invalid constraint raises here, where `generate` is called, not at the first
        // delta (the check compiles it once more; the server does the same).
        if let Some(schema) = &opts.schema {
            weft::constraint::compile(lease.ctx().engine(), schema).map_err(to_py)?;
        }
        // So are ids past the vocabulary (they failed at the first token, or never).
        let ids = opts.logit_bias.iter().map(|b| b.0);
        let ids = ids.chain(opts.stop_token_ids.iter().copied());
        let ids = ids.chain(opts.stop_sequences.iter().flatten().copied());
        lease.ctx().engine().check_ids(ids).map_err(to_py)?;
        let progress = Arc::new(Mutex::new(Progress::default()));
        let inbox: Inbox = Arc::new(Mutex::new(None));
        let stream = driver::spawn(lease, opts, inbox.clone(), raised.clone(), progress.clone());
        Ok(Generation {
            handle: Handle {
                stream,
                inbox,
                raised,
                progress,
                id: crate::forward::new_id(),
            },
            held: Arc::new(Mutex::new(None)),
            callbacks: Mutex::new(callbacks),
        })
    }

    /// Takes the delta `hold_next` made, if any.
    fn take_held(&self) -> Option<PyResult<Option<String>>> {
        lock(&self.held).take()
    }

    /// Runs to the end (after a held delta, whose text is already in the progress; a held
    /// error is raised), delta by delta with the GIL released, so that Ctrl-C
    /// (`KeyboardInterrupt`) stops it between two deltas rather than after the last.
    fn drain_blocking(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(Err(e)) = self.take_held() {
            return Err(e);
        }
        let handle = &self.handle;
        while crate::wait(py, handle.next_text())??.is_some() {
            py.check_signals()?;
        }
        Ok(())
    }

    /// After the stream was dropped by `close`: no held delta, and "closed" unless it had
    /// stopped.
    fn mark_closed(&self) {
        self.take_held();
        let mut p = self.handle.progress();
        p.stop_reason.get_or_insert("closed");
        p.done = true;
    }

    /// An awaitable that runs the generation to its end, then reads `read` of its progress.
    fn drain_then<'py, T>(
        &self,
        py: Python<'py>,
        read: impl FnOnce(&Progress) -> PyResult<T> + Send + 'static,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        if let Some(Err(e)) = self.take_held() {
            return Err(e);
        }
        let handle = self.handle.clone();
        let turn = handle.turn(py)?;
        crate::awaitable(py, async move {
            // The stream's lock is taken again for each delta (as `drain_blocking` does), so
            // that a `close()` or `aclose()` meanwhile stops the run after the delta in hand.
            let mut slot = turn.wait().await;
            while handle.next_text_in(&mut slot).await?.is_some() {
                drop(slot);
                slot = handle.stream.clone().lock_owned().await;
            }
            drop(slot);
            // A copy, the lock released: `read` may take the GIL (`ajson`), and a thread
            // holding the GIL may wait for this lock (the progress getters).
            let p = handle.progress().clone();
            read(&p)
        })
    }

    /// A request answered by [`Item::Done`]: its value, or `ended` once the stream ended.
    fn done(&self, py: Python<'_>, cmd: Cmd, ended: PyResult<usize>) -> PyResult<usize> {
        match self.handle.request_blocking(py, cmd)? {
            Some(Item::Done(n)) => Ok(n),
            Some(_) => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the generation answered another request",
            )),
            None => ended,
        }
    }
}

/// Makes the next delta into `held` unless one is there. Dropped while it waits (a cancelled
/// `__anext__`), it leaves the stream where it was; once the delta is made it is kept.
async fn hold_next(handle: Handle, held: Held, turn: Turn) {
    let taken = |h: &Held| lock(h).is_some();
    if taken(&held) {
        return;
    }
    let mut slot = turn.wait().await;
    if taken(&held) {
        return;
    }
    let next = handle.next_text_in(&mut slot).await;
    *lock(&held) = Some(next);
}

/// Parses the output as JSON, raising `weft.JsonError` (weft's message) when it is not.
fn parse_json(py: Python<'_>, text: &str) -> PyResult<Py<PyAny>> {
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        return Err(JsonError::new_err(
            weft::Error::Json {
                message: e.to_string(),
                output: text.to_string(),
            }
            .to_string(),
        ));
    }
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

#[pymethods]
impl Generation {
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // Never block here: a collection can run on any thread at any time.
        if let Ok(callbacks) = self.callbacks.try_lock() {
            for c in callbacks.iter() {
                // One Python reference each, shared by this list and the generator.
                visit.call(&**c)?;
            }
        }
        // The exception that ended it: its traceback holds the frames it went through, and a
        // frame that holds the generation made a cycle that kept the context's KV pages.
        if let Ok(raised) = self.handle.raised.try_lock() {
            if let Some(e) = raised.as_ref() {
                visit.call(e)?;
            }
        }
        Ok(())
    }

    /// Python's collector found the generation in a cycle nobody reaches: it ends here
    /// (dropping the generator, which holds the callbacks), as when it is dropped.
    fn __clear__(&self) {
        if let Ok(mut stream) = self.handle.stream.try_lock() {
            *stream = None;
        }
        if let Ok(mut callbacks) = self.callbacks.try_lock() {
            callbacks.clear();
        }
        if let Ok(mut raised) = self.handle.raised.try_lock() {
            *raised = None;
        }
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        // Threads iterating one generation take turns: a delta another thread took before
        // this one could is theirs, and this one waits for the next (it ended its loop as if
        // the generation had, a StopIteration mid-way). An ended stream keeps answering None.
        loop {
            let (handle, held) = (self.handle.clone(), self.held.clone());
            let turn = Turn::Later(handle.stream.clone());
            crate::wait(py, hold_next(handle, held, turn))?;
            if let Some(delta) = self.take_held() {
                return delta;
            }
        }
    }

    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// `weft._aio.next_delta(self)`: awaits `_ready()`, then returns `_take()` — so a
    /// cancellation can only fall before the delta is taken, and leaves it for the next call.
    fn __anext__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("weft._aio")?.getattr("next_delta")?.call1((slf,))
    }

    /// Awaitable: the next delta is made and held (see `__anext__`).
    fn _ready<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (handle, held) = (self.handle.clone(), self.held.clone());
        let turn = handle.turn(py)?;
        crate::awaitable(py, async move {
            hold_next(handle, held, turn).await;
            Ok(())
        })
    }

    /// The held delta; `StopAsyncIteration` at the end.
    fn _take(&self) -> PyResult<String> {
        match self.take_held() {
            Some(Ok(Some(d))) => Ok(d),
            Some(Err(e)) => Err(e),
            _ => Err(PyStopAsyncIteration::new_err(())),
        }
    }

    /// Runs to the end; the whole output text (cut before a stop string), the deltas already
    /// taken by iterating included.
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        self.drain_blocking(py)?;
        Ok(self.handle.progress().text.clone())
    }

    /// Runs to the end; every generated token id (a stop token excluded).
    fn tokens(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        self.drain_blocking(py)?;
        Ok(self.handle.progress().tokens.clone())
    }

    /// Runs to the end and parses the output as JSON (raises `weft.JsonError` if it is not).
    fn json(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let text = self.text(py)?;
        parse_json(py, &text)
    }

    /// `await g.atext()`: `text()` without blocking the event loop.
    fn atext<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.drain_then(py, |p| Ok(p.text.clone()))
    }

    /// `await g.atokens()`: `tokens()` without blocking the event loop.
    fn atokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.drain_then(py, |p| Ok(p.tokens.clone()))
    }

    /// `await g.ajson()`: `json()` without blocking the event loop.
    fn ajson<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.drain_then(py, |p| Python::attach(|py| parse_json(py, &p.text)))
    }

    /// The next step, or None once the generation has stopped (the context is free then).
    /// Add probes to it, drop its sampler with `clear_sampler()`, then `run()` it (or
    /// `await step.execute()`); after a step without its sampler, hand the token you chose
    /// to `accept`.
    fn next_step(&self, py: Python<'_>) -> PyResult<Option<Step>> {
        Ok(match self.handle.request_blocking(py, Cmd::Check)? {
            Some(Item::Ready(moves)) => Some(Step::new(self.handle.downgrade(), moves)),
            _ => None,
        })
    }

    /// Registers tokens chosen outside the loop (after a step whose sampler was cleared):
    /// they count against `max_tokens`, are checked against the stop rules and are run by
    /// the next step. Raises `weft.TokenOutOfVocab` (taking none of them) for an id past the
    /// vocabulary, `weft.TokenNotAllowed` for one the constraint does not allow there; does
    /// nothing once the generation has stopped.
    fn accept(&self, py: Python<'_>, tokens: Vec<u32>) -> PyResult<()> {
        self.done(py, Cmd::Accept(tokens), Ok(0)).map(|_| ())
    }

    /// Attaches `probe` to every step from now on (`index` 0: the position a step samples
    /// from); read it from each step's output with the handle returned.
    fn probe_each_step(
        &self,
        py: Python<'_>,
        index: usize,
        probe: PyRef<'_, Probe>,
    ) -> PyResult<ProbeHandle> {
        let ended = Err(ConfigError::new_err("the generation has stopped"));
        let n = self.done(py, Cmd::EachStep(index, probe.kind.clone()), ended)?;
        Ok(ProbeHandle::new(self.handle.id, n))
    }

    /// Gives the context's KV pages back to the pool; the next step recomputes them, and the
    /// output goes on exactly as if nothing happened.
    fn evict(&self, py: Python<'_>) -> PyResult<()> {
        self.done(py, Cmd::Evict, Ok(0)).map(|_| ())
    }

    /// The context as bytes with this generation in flight: `Engine.resume(bytes)` then
    /// `resume_generation()` on that context goes on exactly where this one is (the same
    /// tokens as if it had never stopped, constraints included). A generation with a Python
    /// constraint or speculator, or with adapters, cannot be saved (`weft.ConfigError`);
    /// every-step probes are not saved.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        match self.handle.request_blocking(py, Cmd::Snapshot)? {
            Some(Item::Bytes(b)) => Ok(pyo3::types::PyBytes::new(py, &b)),
            _ => Err(ConfigError::new_err(
                "the generation has ended and given its context back: snapshot the context",
            )),
        }
    }

    /// Stops the generation now and gives the context back (what was generated stays in it,
    /// the last token streamed pending); `stop_reason` turns "closed" if it had not stopped.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let stream = self.handle.stream.clone();
        crate::wait(py, async move { *stream.lock().await = None })?;
        self.mark_closed();
        Ok(())
    }

    /// `await g.aclose()`: `close()` for `contextlib.aclosing` and async code.
    fn aclose<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let stream = slf.borrow().handle.stream.clone();
        let this = slf.clone().unbind();
        // The stream's lock is awaited here, never blocked on: a runtime thread blocked on it
        // is one fewer for the in-flight `__anext__` or `atext()` that holds it, and with as
        // many closes as threads nothing would move again.
        crate::awaitable(py, async move {
            *stream.lock().await = None;
            Python::attach(|py| this.borrow(py).mark_closed());
            Ok(())
        })
    }

    /// Why it stopped: "max_tokens", "stop_token", "stop_sequence", "stop_string",
    /// "constraint", "context_full", "closed", "error" (a step raised), or None while it
    /// runs.
    #[getter]
    fn stop_reason(&self) -> Option<&'static str> {
        self.handle.progress().stop_reason
    }

    /// The text streamed so far (all of it once the generation has ended).
    #[getter]
    fn text_so_far(&self) -> String {
        self.handle.progress().text.clone()
    }

    /// Whether the generation has stopped.
    #[getter]
    fn is_done(&self) -> bool {
        self.handle.progress().done
    }

    /// Tokens accepted so far (a stop token excluded).
    #[getter]
    fn tokens_generated(&self) -> usize {
        self.handle.progress().tokens.len()
    }
}
