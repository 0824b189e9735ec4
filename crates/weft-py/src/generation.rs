//! `weft.Generation`: a running `Generator` as a Python sync and async iterator of text
//! deltas, with collectors.
//!
//! The generator borrows its context, so both live in one pinned stream (the context in a
//! [`Lease`]): dropping the stream drops the generator, then puts the context back.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::context::Lease;
use crate::errors::{to_py, ConfigError, JsonError};

/// Everything `Context.generate` takes besides the context.
pub struct GenOptions {
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
            } else if s.is_instance_of::<PyDict>() || s.hasattr("keys")? {
                let json = s.py().import("json")?;
                json.call_method1("dumps", (s,))?.extract()?
            } else {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "json_schema must be a dict or a JSON string",
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

    fn apply<'c>(self, ctx: &'c mut weft::Context) -> weft::Generator<'c> {
        if let Some(seed) = self.seed {
            ctx.set_seed(seed);
        }
        let mut g = ctx.generate(self.sampler);
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
        g
    }
}

/// What the generation produced so far, readable without the stream.
#[derive(Default)]
struct Progress {
    tokens: Vec<u32>,
    text: String,
    stop_reason: Option<&'static str>,
}

type Deltas = Pin<Box<dyn Stream<Item = weft::Result<String>> + Send>>;

/// The stream, `None` once it ended (the context is back in its slot then).
type Shared = Arc<tokio::sync::Mutex<Option<Deltas>>>;

/// A delta made for an `__anext__` and not taken yet: one cancelled (a timeout) after its
/// delta was made leaves it here for the next call, rather than losing its text.
type Held = Arc<Mutex<Option<PyResult<Option<String>>>>>;

/// Ends its generator when dropped ([`weft::Generator::end`]).
struct EndOnDrop<'g, 'c>(&'g mut weft::Generator<'c>);

impl Drop for EndOnDrop<'_, '_> {
    fn drop(&mut self) {
        // An error here (the pass of a dropped step failed) leaves the context as it is.
        let _ = self.0.end();
    }
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

/// A generation in progress: iterate it (`for delta in g`, `async for delta in g`) for text
/// deltas, or collect it with `text()`, `tokens()`, `json()` (awaitable: `atext()`,
/// `atokens()`, `ajson()`). The context is busy until it ends, is closed or is dropped.
#[pyclass(frozen, module = "weft")]
pub struct Generation {
    stream: Shared,
    held: Held,
    progress: Arc<Mutex<Progress>>,
}

impl Generation {
    pub fn start(mut lease: Lease, opts: GenOptions) -> PyResult<Generation> {
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
        let record = progress.clone();
        let deltas = async_stream::stream! {
            let mut lease = lease;
            let mut gen = opts.apply(lease.ctx());
            // Dropped with the stream (a loop left early, `close()`): ends the generator so
            // the context keeps the last token streamed.
            let ending = EndOnDrop(&mut gen);
            let gen = &mut *ending.0;
            loop {
                let next = gen.next_text().await;
                {
                    let mut p = record.lock().unwrap_or_else(|p| p.into_inner());
                    let done = p.tokens.len();
                    p.tokens.extend_from_slice(&gen.tokens()[done.min(gen.tokens().len())..]);
                    if let Ok(Some(d)) = &next {
                        p.text.push_str(d);
                    }
                    p.stop_reason = gen.stop_reason().map(reason_name);
                }
                match next {
                    Ok(Some(d)) => yield Ok(d),
                    Ok(None) => break,
                    Err(e) => {
                        record
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .stop_reason
                            .get_or_insert("error");
                        yield Err(e);
                        break;
                    }
                }
            }
        };
        Ok(Generation {
            stream: Arc::new(tokio::sync::Mutex::new(Some(Box::pin(deltas)))),
            held: Arc::new(Mutex::new(None)),
            progress,
        })
    }

    /// Takes the delta `hold_next` made, if any.
    fn take_held(&self) -> Option<PyResult<Option<String>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Runs to the end (after a held delta, whose text is already in the progress; a held
    /// error is raised), delta by delta with the GIL released, so that Ctrl-C
    /// (`KeyboardInterrupt`) stops it between two deltas rather than after the last.
    fn drain_blocking(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(Err(e)) = self.take_held() {
            return Err(e);
        }
        loop {
            let stream = self.stream.clone();
            match py.detach(|| weft::block_on(next_delta(stream)))? {
                Some(_) => py.check_signals()?,
                None => return Ok(()),
            }
        }
    }

    /// After the stream was dropped by `close`: no held delta, and "closed" unless it had
    /// stopped.
    fn mark_closed(&self) {
        self.take_held();
        self.progress().stop_reason.get_or_insert("closed");
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
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
        let (stream, progress) = (self.stream.clone(), self.progress.clone());
        crate::awaitable(py, async move {
            drain(stream).await?;
            let p = progress.lock().unwrap_or_else(|p| p.into_inner());
            read(&p)
        })
    }
}

/// The next delta, `None` at the end. The stream is dropped (and the context freed) as soon
/// as it ends or fails.
async fn next_delta(stream: Shared) -> PyResult<Option<String>> {
    advance(&mut *stream.lock().await).await
}

/// The next delta of the stream in `slot`, which is emptied when the stream ends or fails.
async fn advance(slot: &mut Option<Deltas>) -> PyResult<Option<String>> {
    let Some(s) = slot.as_mut() else {
        return Ok(None);
    };
    match s.next().await {
        Some(Ok(d)) => Ok(Some(d)),
        Some(Err(e)) => {
            *slot = None;
            Err(to_py(e))
        }
        None => {
            *slot = None;
            Ok(None)
        }
    }
}

async fn drain(stream: Shared) -> PyResult<()> {
    while next_delta(stream.clone()).await?.is_some() {}
    Ok(())
}

/// Makes the next delta into `held` unless one is there. Dropped while it waits (a cancelled
/// `__anext__`), it leaves the stream where it was; once the delta is made it is kept.
async fn hold_next(stream: Shared, held: Held) {
    let taken = |h: &Held| h.lock().unwrap_or_else(|p| p.into_inner()).is_some();
    if taken(&held) {
        return;
    }
    let mut guard = stream.lock().await;
    if taken(&held) {
        return;
    }
    let next = advance(&mut guard).await;
    *held.lock().unwrap_or_else(|p| p.into_inner()) = Some(next);
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
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let (stream, held) = (self.stream.clone(), self.held.clone());
        py.detach(|| weft::block_on(hold_next(stream, held)));
        self.take_held().unwrap_or(Ok(None))
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
        let (stream, held) = (self.stream.clone(), self.held.clone());
        crate::awaitable(py, async move {
            hold_next(stream, held).await;
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

    /// Runs to the end; the whole output text (cut before a stop string).
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        self.drain_blocking(py)?;
        Ok(self.progress().text.clone())
    }

    /// Runs to the end; every generated token id (a stop token excluded).
    fn tokens(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        self.drain_blocking(py)?;
        Ok(self.progress().tokens.clone())
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

    /// Stops the generation now and gives the context back (what was generated stays in it,
    /// the last token streamed pending); `stop_reason` turns "closed" if it had not stopped.
    fn close(&self, py: Python<'_>) {
        let stream = self.stream.clone();
        py.detach(|| weft::block_on(async { *stream.lock().await = None }));
        self.mark_closed();
    }

    /// `await g.aclose()`: `close()` for `contextlib.aclosing` and async code.
    fn aclose<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let stream = slf.borrow().stream.clone();
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
        self.progress().stop_reason
    }

    /// The text streamed so far.
    #[getter]
    fn text_so_far(&self) -> String {
        self.progress().text.clone()
    }
}
