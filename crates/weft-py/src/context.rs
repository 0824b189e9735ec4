//! `weft.Context`: one sequence's tokens and KV cache.
//!
//! A Rust `Generator` or `Forward` borrows its context mutably; Python has no borrows, so the
//! context lives in a [`Slot`] and a running generation or pass takes it out for as long as
//! it runs (a [`Lease`]) and puts it back when it ends or is dropped. Using the context
//! meanwhile raises `weft.ContextBusy` — the error Rust's borrow checker gives at compile time.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;

use crate::adapter::Adapter;
use crate::callbacks::{PyConstraint, PySpeculator};
use crate::errors::{ConfigError, ContextBusy, IntoPyResult};
use crate::forward::Forward;
use crate::generation::{GenOptions, Generation};
use crate::sampling::Sampler;

/// Where a context waits while no generation or pass holds it.
pub type Slot = Arc<Mutex<Option<weft::Context>>>;

fn lock(slot: &Slot) -> MutexGuard<'_, Option<weft::Context>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

fn busy() -> PyErr {
    ContextBusy::new_err(
        "the context is in use by a generation or pass that has not finished (finish or close it first)",
    )
}

/// The context taken out of its slot; put back when dropped.
pub struct Lease {
    slot: Slot,
    ctx: Option<weft::Context>,
}

impl Lease {
    pub fn take(slot: &Slot) -> PyResult<Lease> {
        let ctx = lock(slot).take().ok_or_else(busy)?;
        Ok(Lease {
            slot: slot.clone(),
            ctx: Some(ctx),
        })
    }

    pub fn ctx(&mut self) -> &mut weft::Context {
        self.ctx
            .as_mut()
            .expect("a lease holds its context until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.take() {
            *lock(&self.slot) = Some(ctx);
        }
    }
}

/// A sequence of tokens with its KV cache: fill it, fork it, generate from it, or run
/// passes on it with `forward()`.
#[pyclass(frozen, module = "weft")]
pub struct Context {
    slot: Slot,
}

impl Context {
    pub fn new(ctx: weft::Context) -> Context {
        Context {
            slot: Arc::new(Mutex::new(Some(ctx))),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut weft::Context) -> PyResult<T>) -> PyResult<T> {
        match lock(&self.slot).as_mut() {
            Some(ctx) => f(ctx),
            None => Err(busy()),
        }
    }

    /// Runs `f` on the context with the GIL released: tokenizing a long text or waiting for
    /// the scheduler must not stop the process's other Python threads.
    fn detached<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut weft::Context) -> weft::Result<T> + Send,
    ) -> PyResult<T> {
        let mut lease = Lease::take(&self.slot)?;
        py.detach(|| f(lease.ctx())).py()
    }
}

#[pymethods]
impl Context {
    /// Appends the tokens of `text` (not run until the next pass).
    fn fill(&self, py: Python<'_>, text: &str) -> PyResult<()> {
        self.detached(py, |c| c.fill(text))
    }

    /// Appends token ids.
    fn fill_tokens(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        self.detached(py, |c| c.fill_tokens(&ids))
    }

    /// Makes the context hold `messages` (`[{"role": ..., "content": ...}]`) rendered by the
    /// model's chat template, with the assistant's turn opened. Call it with the whole
    /// conversation at every turn: a context holding an earlier turn keeps the start of its
    /// tokens the new rendering shares and buffers only the rest.
    fn fill_chat(&self, py: Python<'_>, messages: &Bound<'_, PyAny>) -> PyResult<()> {
        use pyo3::exceptions::{PyKeyError, PyTypeError};
        let shape = "fill_chat takes a list of messages: [{\"role\": ..., \"content\": ...}]";
        if messages.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err(shape));
        }
        let mut list = Vec::new();
        for m in messages
            .try_iter()
            .map_err(|_| PyTypeError::new_err(shape))?
        {
            let m = m?;
            // Any mapping: a dict, a MappingProxyType, ... (a string or a pair is not one).
            if m.cast::<pyo3::types::PyMapping>().is_err() {
                return Err(PyTypeError::new_err(format!("{shape}; got a message {m}")));
            }
            let field = |k: &str| -> PyResult<String> {
                let v = m
                    .get_item(k)
                    .map_err(|_| PyKeyError::new_err(format!("a message has no {k:?}")))?;
                v.extract().map_err(|_| {
                    PyTypeError::new_err(format!("a message's {k:?} must be a string, got {v}"))
                })
            };
            list.push(weft::Message::new(field("role")?, field("content")?));
        }
        self.detached(py, |c| c.fill_chat(&list))
    }

    /// The context as bytes — tokens, KV pages, pending tokens, random state — for
    /// `Engine.resume`, in this process or another with the same model file. The LoRA
    /// adapters that computed the pages are not recorded: resume with the same ones.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let bytes = self.detached(py, |c| c.snapshot())?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// Gives the context's KV pages back to the pool but keeps its tokens: they become
    /// pending again and the next pass recomputes them (outputs unchanged). Contexts with
    /// custom positions or attention masks cannot be recomputed (`weft.ConfigError`).
    fn evict(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |c| c.evict())
    }

    /// Appends tokens given as vectors: `rows` (`len(ids) × n_embd` floats, e.g. a NumPy
    /// array of that shape) are what the model's first block reads at those positions, and
    /// `ids` what the context records there (placeholders). `Engine.input_embeddings(ids)`
    /// gives the vectors of real tokens. `attn_bias`, if given, is an additive attention bias
    /// for the new tokens: one row per new token of `len(ctx) + len(pending) + len(ids)`
    /// values (the tokens before them, then the new ones); `-inf` hides a token, and entries
    /// past a token's own position must be `-inf`. Without it attention is causal.
    #[pyo3(signature = (ids, rows, attn_bias = None))]
    fn fill_embeds(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        rows: &Bound<'_, PyAny>,
        attn_bias: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let rows = crate::forward::vectors(rows, ids.len())?;
        let bias = attn_bias.map(crate::forward::floats).transpose()?;
        self.detached(py, |c| c.fill_embeds(&ids, &rows, bias.as_deref()))
    }

    /// Takes up the generation saved in the snapshot this context was resumed from
    /// (`Generation.snapshot()`): it goes on as if it had never stopped, its sampler, stop
    /// rules, constraints and progress restored (`tokens()` and the collectors include what
    /// it generated before). `max_tokens` and `horizon` replace the saved ones if given.
    #[pyo3(signature = (*, max_tokens = None, horizon = None))]
    fn resume_generation(
        &self,
        max_tokens: Option<usize>,
        horizon: Option<usize>,
    ) -> PyResult<Generation> {
        let mut lease = Lease::take(&self.slot)?;
        if !lease.ctx().has_saved_generator() {
            return Err(ConfigError::new_err(
                "this context holds no saved generation: it was not resumed from a \
                 Generation.snapshot(), or its generation was already taken up",
            ));
        }
        let opts = GenOptions {
            resume: true,
            max_tokens,
            horizon,
            ..GenOptions::default()
        };
        Generation::start(lease, opts, Default::default(), Vec::new())
    }

    /// A copy sharing this context's KV pages (copy-on-write).
    fn fork(&self, py: Python<'_>) -> PyResult<Context> {
        self.detached(py, |c| c.fork()).map(Context::new)
    }

    /// Keeps the first `n` tokens.
    fn truncate(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.detached(py, |c| c.truncate(n))
    }

    /// Sets the seed of this context's sampling.
    fn set_seed(&self, seed: u64) -> PyResult<()> {
        self.with(|c| {
            c.set_seed(seed);
            Ok(())
        })
    }

    /// Tokens already run (in the KV cache); `len(ctx)` counts these.
    #[getter]
    fn tokens(&self) -> PyResult<Vec<u32>> {
        self.with(|c| Ok(c.tokens().to_vec()))
    }

    /// Tokens filled but not run yet.
    #[getter]
    fn pending(&self) -> PyResult<Vec<u32>> {
        self.with(|c| Ok(c.pending().to_vec()))
    }

    /// Tokens already run (in the KV cache), as `len(ctx.tokens)`; tokens filled but not
    /// run yet (`ctx.pending`) count once a generation or a `ctx.forward()` pass has run them.
    fn __len__(&self) -> PyResult<usize> {
        self.with(|c| Ok(c.len()))
    }

    /// Generates from the context: an iterator (sync and async) of text deltas, with the
    /// collectors `text()`, `tokens()`, `json()` and their awaitable forms `atext()`, …
    ///
    /// `sampler`: a `weft.Sampler` (default: the engine's, `Engine(sampler=...)`, greedy
    /// unless set).
    /// `stop`: a stop string or a list of them (token ids in the list are stop tokens, as in
    /// seed 000's `stop=[id, ...]`); `stop_token_ids`: extra stop tokens;
    /// `stop_sequences`: lists of ids that end the generation when they appear.
    /// `repeat_penalty`, `presence_penalty`, `frequency_penalty` (llama.cpp's semantics, over
    /// the last `penalty_last_n` tokens: 64 by default, 0 = all) discourage repeats.
    /// `adapters`: LoRA adapters with their scales (none or an empty list: the engine's
    /// stack; an adapter at scale 0 runs the base model whatever the stack holds). One of
    /// `json_schema` (a dict), `regex`, `grammar` (Lark) or `gbnf` constrains the output.
    /// `constrain`: your own constraint (or a list of them, composed with a schema): an
    /// object with `allowed(accepted, vocab_size)` → the ids allowed next (or a bool mask over
    /// the vocabulary, a NumPy array or a list; None for all) and optionally
    /// `is_terminal(accepted)` → bool. `speculate` drafts with the n-gram drafter;
    /// `speculator`, your own drafter instead: an object with `draft(tokens, max)` → ids (or
    /// None), and optionally `accepted(drafted, accepted)`. An exception from either ends the
    /// generation and is raised by the call that ran the step and every later one. `seed`
    /// seeds the sampling. `horizon`: how many more steps to announce to
    /// the scheduler after each (default: the steps left before `max_tokens`). `zo_seed`
    /// with `zo_sigma` perturbs the adapters' weights by `zo_sigma · ε(zo_seed)` on every
    /// step (evolution strategies).
    #[pyo3(signature = (
        sampler = None, *, max_tokens = None, min_tokens = None, stop = None,
        stop_token_ids = None, stop_sequences = None, json_schema = None, regex = None,
        grammar = None, gbnf = None, speculate = false, seed = None, ignore_eos = false,
        logit_bias = None, repeat_penalty = None, presence_penalty = None,
        frequency_penalty = None, penalty_last_n = None, adapters = None, constrain = None,
        speculator = None, horizon = None, zo_seed = None, zo_sigma = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        sampler: Option<PyRef<'_, Sampler>>,
        max_tokens: Option<usize>,
        min_tokens: Option<usize>,
        stop: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<Vec<u32>>,
        stop_sequences: Option<Vec<Vec<u32>>>,
        json_schema: Option<&Bound<'_, PyAny>>,
        regex: Option<String>,
        grammar: Option<String>,
        gbnf: Option<String>,
        speculate: bool,
        seed: Option<u64>,
        ignore_eos: bool,
        logit_bias: Option<&Bound<'_, PyAny>>,
        repeat_penalty: Option<f32>,
        presence_penalty: Option<f32>,
        frequency_penalty: Option<f32>,
        penalty_last_n: Option<usize>,
        adapters: Option<Vec<(PyRef<'_, Adapter>, f32)>>,
        constrain: Option<&Bound<'_, PyAny>>,
        speculator: Option<&Bound<'_, PyAny>>,
        horizon: Option<usize>,
        zo_seed: Option<u64>,
        zo_sigma: Option<f32>,
    ) -> PyResult<Generation> {
        let raised: crate::driver::Raised = Default::default();
        let constraints = match constrain {
            None => Vec::new(),
            Some(c) if c.is_instance_of::<pyo3::types::PyList>() => c
                .try_iter()?
                .map(|c| PyConstraint::new(&c?, raised.clone()))
                .collect::<PyResult<_>>()?,
            Some(c) => vec![PyConstraint::new(c, raised.clone())?],
        };
        if speculate && speculator.is_some() {
            return Err(ConfigError::new_err(
                "give speculate=True (the built-in drafter) or a speculator, not both",
            ));
        }
        let speculator = speculator
            .map(|s| PySpeculator::new(s, raised.clone()))
            .transpose()?;
        // The callback objects, for Python's garbage collector (see `Generation`).
        let mut callbacks: Vec<_> = constraints.iter().map(PyConstraint::object).collect();
        callbacks.extend(speculator.as_ref().map(PySpeculator::object));
        let zo_seed = match (zo_seed, zo_sigma) {
            (None, None) => None,
            (Some(seed), Some(sigma)) if sigma.is_finite() => Some((seed, sigma)),
            (Some(_), Some(sigma)) => {
                return Err(ConfigError::new_err(format!(
                    "zo_seed: sigma must be a finite number, got {sigma}"
                )))
            }
            _ => {
                return Err(ConfigError::new_err(
                    "zo_seed and zo_sigma go together: give both",
                ))
            }
        };
        let (stop, mut stop_ids) = stop_arg(stop)?;
        stop_ids.extend(stop_token_ids.unwrap_or_default());
        let penalties = penalties_arg(
            repeat_penalty,
            presence_penalty,
            frequency_penalty,
            penalty_last_n,
        )?;
        let opts = GenOptions {
            sampler: sampler.map(|s| s.inner.clone()),
            max_tokens,
            min_tokens,
            stop,
            stop_token_ids: stop_ids,
            stop_sequences: stop_sequences.unwrap_or_default(),
            penalties,
            adapters: adapters
                .unwrap_or_default()
                .into_iter()
                .map(|(a, s)| (a.inner.clone(), s))
                .collect(),
            schema: GenOptions::schema(json_schema, regex, grammar, gbnf)?,
            speculate,
            seed,
            ignore_eos,
            logit_bias: logit_bias.map(bias_arg).transpose()?.unwrap_or_default(),
            horizon,
            zo_seed,
            constraints,
            speculator,
            resume: false,
        };
        Generation::start(Lease::take(&self.slot)?, opts, raised, callbacks)
    }

    /// Fills `tokens`, runs them with anything pending and returns the logits after the last
    /// one, a float32 array over the vocabulary (seed 002's `prefill_get_last_logits`; no
    /// tokens: the pending ones). Generating afterwards continues from them.
    #[pyo3(signature = (tokens = Vec::new()))]
    fn prefill<'py>(&self, py: Python<'py>, tokens: Vec<u32>) -> PyResult<Bound<'py, PyAny>> {
        crate::callbacks::not_inside_a_callback()?;
        let mut lease = Lease::take(&self.slot)?;
        let logits = crate::wait(py, async move { lease.ctx().prefill(&tokens).await })?.py()?;
        Ok(numpy::PyArray1::from_vec(py, logits).into_any())
    }

    /// Runs one given token and returns the logits after it (seed 002's `decode_get_logits`).
    fn decode<'py>(&self, py: Python<'py>, token: u32) -> PyResult<Bound<'py, PyAny>> {
        self.prefill(py, vec![token])
    }

    /// A pass builder over this context: its pending tokens are the pass's first inputs.
    fn forward(&self) -> PyResult<Forward> {
        let (ran, pending) = self.with(|c| Ok((c.len(), c.pending().len())))?;
        Ok(Forward::new(self.slot.clone(), ran, pending))
    }

    fn __repr__(&self) -> String {
        match lock(&self.slot).as_ref() {
            Some(c) => format!("weft.Context(len={})", c.len()),
            None => "weft.Context(busy)".to_string(),
        }
    }
}

/// The error for a `stop` that is neither a string nor a list of strings and token ids.
/// `stop=`: one string or a list of them, as OpenAI's `stop` takes; token ids in the list
/// stop as `stop_token_ids` do (seed 000's `stop=[id, ...]`). Returns (strings, ids).
pub(crate) fn stop_arg(stop: Option<&Bound<'_, PyAny>>) -> PyResult<(Vec<String>, Vec<u32>)> {
    let Some(s) = stop else {
        return Ok((Vec::new(), Vec::new()));
    };
    if let Ok(one) = s.extract::<String>() {
        return Ok((vec![one], Vec::new()));
    }
    // Bytes would pass as a list of ids (`b"\n"` as token 10): say what is meant instead.
    if s.is_instance_of::<pyo3::types::PyBytes>() || s.is_instance_of::<pyo3::types::PyByteArray>()
    {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "stop must be a string, or a list of strings and token ids, not bytes (decode \
             them: stop=b\"...\".decode())",
        ));
    }
    let items: Vec<Bound<'_, PyAny>> = s.extract().map_err(|_| not_a_stop())?;
    let (mut strings, mut ids) = (Vec::new(), Vec::new());
    for item in items {
        match item.extract::<String>() {
            Ok(text) => strings.push(text),
            Err(_) => ids.push(item.extract().map_err(|_| not_a_stop())?),
        }
    }
    Ok((strings, ids))
}

/// A `logit_bias=` mapping of token ids to biases: a dict, or any mapping (its `items()`).
pub(crate) fn bias_arg(bias: &Bound<'_, PyAny>) -> PyResult<Vec<(u32, f32)>> {
    let not_a_bias = || {
        pyo3::exceptions::PyTypeError::new_err(
            "logit_bias must be a mapping of token ids to biases ({id: bias})",
        )
    };
    let items = bias.call_method0("items").map_err(|_| not_a_bias())?;
    items
        .try_iter()?
        .map(|item| item?.extract::<(u32, f32)>().map_err(|_| not_a_bias()))
        .collect()
}

/// The penalties of `repeat_penalty=`, `presence_penalty=`, `frequency_penalty=` and
/// `penalty_last_n=` (llama.cpp's defaults for those not given; none given: no penalties).
pub(crate) fn penalties_arg(
    repeat: Option<f32>,
    presence: Option<f32>,
    frequency: Option<f32>,
    last_n: Option<usize>,
) -> PyResult<Option<weft::Penalties>> {
    if [repeat, presence, frequency].iter().all(Option::is_none) {
        return Ok(None);
    }
    let off = weft::Penalties::default();
    let p = weft::Penalties {
        repetition: repeat.unwrap_or(off.repetition),
        presence: presence.unwrap_or(off.presence),
        frequency: frequency.unwrap_or(off.frequency),
        last_n: last_n.unwrap_or(off.last_n),
    };
    p.validate()
        .map_err(|e| crate::errors::to_py(weft::Error::Sampler(e)))?;
    Ok(Some(p))
}

fn not_a_stop() -> PyErr {
    pyo3::exceptions::PyTypeError::new_err(
        "stop must be a string, or a list of strings and token ids",
    )
}
