//! `weft.Engine`, `weft.Embedder` and `weft.Metrics`: a loaded model and its counters.

use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;

use crate::adapter::Adapter;
use crate::context::Context;
use crate::errors::{to_py, ConfigError, IntoPyResult};

/// The model path for a known name or a file path, fetched into the cache on first use.
/// `model` comes from Python as a `str` or any `os.PathLike` (`pathlib.Path`).
fn resolve(model: &std::path::Path) -> weft::Result<std::path::PathBuf> {
    let Some(name_or_path) = model.to_str() else {
        // A path whose bytes are not UTF-8 cannot be a known name: it is a file or nothing.
        return Ok(model.to_path_buf());
    };
    Ok(weft::Hub::resolve_from_env(
        name_or_path,
        &mut weft::NoProgress,
    )?)
}

/// The engine's settings as `Engine(...)` takes them.
struct Options<'a> {
    threads: Option<usize>,
    kv_tokens: Option<usize>,
    n_ctx: Option<usize>,
    kv_type: Option<&'a str>,
    prefix_cache: bool,
    resident_layers: Option<usize>,
    weights: Option<&'a str>,
    sampler: Option<weft::Sampler>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            threads: None,
            kv_tokens: None,
            n_ctx: None,
            kv_type: None,
            prefix_cache: true,
            resident_layers: None,
            weights: None,
            sampler: None,
        }
    }
}

impl Options<'_> {
    /// The engine's configuration; 0 threads, KV tokens, context positions or resident
    /// layers are refused (they were read as 1, silently).
    fn config(self) -> PyResult<weft::EngineConfig> {
        for (name, v) in [
            ("threads", self.threads),
            ("kv_tokens", self.kv_tokens),
            ("n_ctx", self.n_ctx),
            ("resident_layers", self.resident_layers),
        ] {
            if v == Some(0) {
                return Err(ConfigError::new_err(format!("{name} must be at least 1")));
            }
        }
        let mut config = weft::EngineConfig::default();
        if let Some(t) = self.threads {
            config.n_threads = t;
        }
        if let Some(k) = self.kv_tokens {
            config.kv_tokens = k;
        }
        config.n_ctx = self.n_ctx;
        if let Some(t) = self.kv_type {
            config.kv_type = t.parse().map_err(ConfigError::new_err)?;
        }
        if let Some(w) = self.weights {
            config.checkpoint_weights = w.parse().map_err(ConfigError::new_err)?;
        }
        config.prefix_cache = self.prefix_cache;
        config.layer_pager = self
            .resident_layers
            .map(|k| Arc::new(weft::models::LayerPager::new(k)));
        if let Some(s) = self.sampler {
            config.generation.sampler = s;
        }
        Ok(config)
    }
}

/// A seed drawn at random, apart in the forked children (workers) of one process too: each
/// `RandomState` is keyed afresh from the thread's random keys, which a forked child
/// inherits, so the process id is hashed in.
pub(crate) fn random_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// The bytes of `v`: bytes, or a `bytearray` or `memoryview` of them (a file read into a
/// buffer); `what` names it in the error.
fn bytes_like(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if v.is_instance_of::<PyByteArray>() || v.is_instance_of::<PyMemoryView>() {
        let copy = v.py().import("builtins")?.getattr("bytes")?.call1((v,))?;
        return Ok(copy.cast_into::<PyBytes>()?.as_bytes().to_vec());
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "{what} is bytes (or a bytearray or memoryview of them)"
    )))
}

/// A loaded model with its scheduler thread. Every context of one engine shares its model
/// calls (continuous batching), whichever Python thread or asyncio task drives it.
///
/// `model` is a known name (`"smollm2-135m"`, `"gemma3-270m"`, fetched on first use), a
/// GGUF path, or a Hugging Face checkpoint folder (Llama or Gemma 3 in safetensors, with its
/// `config.json` and `tokenizer.json`) whose matrices are stored as `weights` once loaded:
/// "q8_0" (the default), "f16" or "f32"; a GGUF file keeps its types unless "f16" or "f32"
/// widens its quantized matrices (float activations, for small perturbations; slower).
/// `threads`: threads of the forward pass (default: the machine's cores). `kv_tokens`: the KV
/// cache's capacity in tokens, shared by every context of the engine (default 16384). `n_ctx`: the longest one context may grow (default:
/// the model's training context, at most `kv_tokens`; a larger value enlarges the cache to
/// hold it). `kv_type`: "f16" or "q8_0" (half the KV memory). `prefix_cache`: contexts
/// starting with the same full KV pages as an earlier one share them (outputs unchanged).
/// `resident_layers`: keep at most that many transformer blocks in memory and read the others
/// from the model file when a pass needs them (for models larger than memory; slower).
/// `sampler`: the sampler `generate` uses when given none (default: greedy).
#[pyclass(frozen, module = "weft")]
pub struct Engine {
    pub inner: weft::Engine,
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (
        model = std::path::PathBuf::from("smollm2-135m"), threads = None, kv_tokens = None, n_ctx = None, kv_type = None,
        prefix_cache = true, resident_layers = None, weights = None, sampler = None
    ), text_signature = "(model='smollm2-135m', threads=None, kv_tokens=None, n_ctx=None, \
        kv_type=None, prefix_cache=True, resident_layers=None, weights=None, sampler=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: std::path::PathBuf,
        threads: Option<usize>,
        kv_tokens: Option<usize>,
        n_ctx: Option<usize>,
        kv_type: Option<&str>,
        prefix_cache: bool,
        resident_layers: Option<usize>,
        weights: Option<&str>,
        sampler: Option<PyRef<'_, crate::sampling::Sampler>>,
    ) -> PyResult<Engine> {
        let config = Options {
            threads,
            kv_tokens,
            n_ctx,
            kv_type,
            prefix_cache,
            resident_layers,
            weights,
            sampler: sampler.map(|s| s.inner.clone()),
        }
        .config()?;
        let inner = py
            .detach(|| resolve(&model).and_then(|p| weft::Engine::open(&p, config)))
            .py()?;
        Ok(Engine { inner })
    }

    /// An engine on a GGUF model held in memory (`model`: bytes, e.g. read from an archive),
    /// with the tokenizer of its metadata or, given, of a `tokenizer.json` text; the other
    /// arguments as `Engine(...)` takes them.
    #[staticmethod]
    #[pyo3(signature = (
        model, tokenizer_json = None, *, threads = None, kv_tokens = None, n_ctx = None,
        kv_type = None, prefix_cache = true, sampler = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn from_bytes(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        tokenizer_json: Option<String>,
        threads: Option<usize>,
        kv_tokens: Option<usize>,
        n_ctx: Option<usize>,
        kv_type: Option<&str>,
        prefix_cache: bool,
        sampler: Option<PyRef<'_, crate::sampling::Sampler>>,
    ) -> PyResult<Engine> {
        let config = Options {
            threads,
            kv_tokens,
            n_ctx,
            kv_type,
            prefix_cache,
            sampler: sampler.map(|s| s.inner.clone()),
            ..Options::default()
        }
        .config()?;
        let bytes = bytes_like(model, "a model")?;
        let inner = py
            .detach(|| weft::Engine::from_bytes(bytes, tokenizer_json.as_deref(), config))
            .py()?;
        Ok(Engine { inner })
    }

    /// The engine's settings as it resolved them: `threads`, `kv_tokens`, `n_ctx` (the
    /// longest context), `kv_type`, `prefix_cache`, `resident_layers` (None: every block in
    /// memory), `weights` (how a checkpoint folder's matrices are stored) and `sampler` (the
    /// default of `generate`).
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let c = self.inner.config();
        let d = pyo3::types::PyDict::new(py);
        d.set_item("threads", c.n_threads)?;
        d.set_item("kv_tokens", c.kv_tokens)?;
        d.set_item("n_ctx", self.inner.n_ctx())?;
        d.set_item("kv_type", c.kv_type.to_string())?;
        d.set_item("prefix_cache", c.prefix_cache)?;
        let resident = c.layer_pager.as_ref().map(|p| p.resident_layers());
        d.set_item("resident_layers", resident)?;
        d.set_item("weights", c.checkpoint_weights.to_string())?;
        let sampler = crate::sampling::Sampler {
            inner: c.generation.sampler.clone(),
        };
        d.set_item("sampler", Py::new(py, sampler)?)?;
        Ok(d)
    }

    /// Whether `token` ends a generation by default (one of `stop_tokens`: the model's EOS
    /// and end-of-turn tokens).
    fn is_eos(&self, token: u32) -> bool {
        self.inner.is_eos(token)
    }

    /// The engine's adapter stack, first pushed first: `(adapter, scale)` pairs.
    fn lora_stack(&self) -> Vec<(Adapter, f32)> {
        self.inner
            .lora_stack()
            .into_iter()
            .map(|(inner, scale)| (Adapter { inner }, scale))
            .collect()
    }

    /// A new, empty context on this engine, with a sampling seed drawn at random (as the CLI
    /// and the server draw one): `set_seed` or `generate(seed=...)` make its samples
    /// reproducible.
    fn context(&self) -> Context {
        let mut ctx = self.inner.context();
        ctx.set_seed(random_seed());
        Context::new(ctx)
    }

    /// The vectors the model's first block reads for `ids` (a float32 array of
    /// `len(ids) × n_embd`): given to `Forward.input_embeds` they reproduce the ids' logits.
    fn input_embeddings<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<u32>,
    ) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
        let d = self.inner.info().n_embd;
        let rows = py.detach(|| self.inner.input_embeddings(&ids)).py()?;
        PyArray1::from_vec(py, rows).reshape([ids.len(), d])
    }

    /// Loads a LoRA adapter for this engine's model; an adapter for another architecture or
    /// shape, or a damaged file, raises.
    fn load_adapter(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<Adapter> {
        let inner = py.detach(|| self.inner.load_adapter(&path)).py()?;
        Ok(Adapter { inner })
    }

    /// Pushes `adapter` on the engine's stack: passes that name no adapter run with the stack.
    /// A scale that is not a finite number, or an adapter that does not fit this engine's
    /// model, raises and leaves the stack as it was.
    #[pyo3(signature = (adapter, scale = 1.0))]
    fn push_lora(&self, adapter: &Adapter, scale: f32) -> PyResult<()> {
        self.inner.push_lora(&adapter.inner, scale).py()
    }

    /// Removes the adapter pushed last, returning it with its scale.
    fn pop_lora(&self) -> Option<(Adapter, f32)> {
        self.inner
            .pop_lora()
            .map(|(inner, scale)| (Adapter { inner }, scale))
    }

    /// Empties the stack: passes that name no adapter run the base model.
    fn clear_loras(&self) {
        self.inner.clear_loras();
    }

    /// The context a `Context.snapshot()` holds, going on exactly where it was taken
    /// (`SnapshotCorrupt`, `SnapshotVersion`, `ModelFingerprintMismatch`, or `ConfigError` for
    /// another `kv_type`, if it cannot).
    fn resume(&self, py: Python<'_>, snapshot: &Bound<'_, PyAny>) -> PyResult<Context> {
        let bytes = bytes_like(snapshot, "a snapshot")?;
        let ctx = py.detach(|| self.inner.resume(&bytes)).py()?;
        Ok(Context::new(ctx))
    }

    /// The token ids of `text`. `add_bos` starts them with the model's BOS token when the
    /// model wants one, as the first fill of a context does; special tokens written in the
    /// text (`<|im_start|>`) are parsed unless `parse_special` is false (then they are plain
    /// text, as `weft tokenize --no-parse-special`).
    #[pyo3(signature = (text, add_bos = false, parse_special = true))]
    fn tokenize(&self, py: Python<'_>, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        // Without the GIL, as `Context.fill`: a long text takes a while.
        py.detach(|| self.inner.tokenizer().encode(text, add_bos, parse_special))
    }

    /// The text of `ids`, control tokens (`<|im_end|>`, padding) rendered as their text
    /// unless `skip_special` is true (transformers' `skip_special_tokens`); a leading BOS the
    /// tokenizer adds is dropped either way.
    #[pyo3(signature = (ids, skip_special = false))]
    fn detokenize(&self, py: Python<'_>, ids: Vec<u32>, skip_special: bool) -> PyResult<String> {
        py.detach(|| match skip_special {
            true => self.inner.detokenize_skip_special(&ids),
            false => self.inner.detokenize(&ids),
        })
        .py()
    }

    /// The scheduler's counters now (once the scheduler has applied the commands before: it
    /// may finish a model call first, so other Python threads run meanwhile).
    fn metrics(&self, py: Python<'_>) -> Metrics {
        Metrics::from(py.detach(|| self.inner.metrics()))
    }

    /// Most tokens one context may hold.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }

    /// Number of token ids the model knows.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.info().vocab_size
    }

    /// The model's end-of-turn token ids.
    #[getter]
    fn stop_tokens(&self) -> Vec<u32> {
        self.inner.stop_tokens().to_vec()
    }

    /// Embeddings of `texts` (pooled final-norm hidden states): a float32 array
    /// `[len(texts), n_embd]`, or `[n_embd]` for one string. `pooling`: mean, max, last, cls
    /// (`None`, the default: the model's own — the GGUF's `pooling_type`, else mean — as
    /// `Embedder.embed`).
    #[pyo3(signature = (texts, pooling = None, normalize = true))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        pooling: Option<&str>,
        normalize: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        embed(py, &self.inner, texts, pooling, normalize)
    }

    fn __repr__(&self) -> String {
        format!("weft.Engine({:?})", self.inner)
    }
}

/// A sentence-embedding encoder (a sentence-transformers folder, e.g. `"all-minilm-l6-v2"`)
/// or a GGUF decoder used for embeddings.
#[pyclass(frozen, module = "weft")]
pub struct Embedder {
    inner: Arc<dyn weft::EmbeddingModel>,
}

#[pymethods]
impl Embedder {
    #[new]
    #[pyo3(
        signature = (model = std::path::PathBuf::from("all-minilm-l6-v2"), threads = None),
        text_signature = "(model='all-minilm-l6-v2', threads=None)"
    )]
    fn new(
        py: Python<'_>,
        model: std::path::PathBuf,
        threads: Option<usize>,
    ) -> PyResult<Embedder> {
        let config = Options {
            threads,
            ..Options::default()
        }
        .config()?;
        let inner = py
            .detach(|| resolve(&model).and_then(|p| weft::open_embedding_model(&p, config)))
            .py()?;
        Ok(Embedder { inner })
    }

    /// Embeddings of `texts` as `Engine.embed`; `pooling=None` uses the model's own.
    #[pyo3(signature = (texts, pooling = None, normalize = true))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        pooling: Option<&str>,
        normalize: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        embed(py, self.inner.as_ref(), texts, pooling, normalize)
    }

    /// Length of the vectors.
    #[getter]
    fn dimensions(&self) -> usize {
        self.inner.dimensions()
    }
}

/// One string → a 1-D array; a list of strings → a 2-D array (rows in order).
fn embed<'py>(
    py: Python<'py>,
    model: &dyn weft::EmbeddingModel,
    texts: &Bound<'py, PyAny>,
    pooling: Option<&str>,
    normalize: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let pooling = match pooling {
        Some(p) => p.parse::<weft::Pooling>().map_err(to_py)?,
        None => model.default_pooling(),
    };
    if pooling == weft::Pooling::None {
        return Err(ConfigError::new_err(
            "pooling \"none\" gives a vector per token, which embed() does not return: for a \
             decoder, use Context.forward with weft.Hidden(); for an encoder, the CLI's \
             `weft embed --pooling none`",
        ));
    }
    // A str is one text (a lone surrogate raises UnicodeEncodeError, as encoding it would);
    // anything else must be a sequence of them.
    let single = match texts.cast::<pyo3::types::PyString>() {
        Ok(s) => Some(s.extract::<String>()?),
        Err(_) => None,
    };
    let list: Vec<String> = match &single {
        Some(s) => vec![s.clone()],
        None if texts.is_instance_of::<pyo3::types::PyBytes>() => {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "texts must be a str or a list of str, not bytes: decode them first",
            ))
        }
        None => texts.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err("texts must be a str or a list of str")
        })?,
    };
    crate::callbacks::not_inside_a_callback()?;
    let opts = weft::EmbedOptions {
        pooling,
        normalize,
        ..weft::EmbedOptions::default()
    };
    // The library asks between its groups of inputs (and while a batch waits for KV pages)
    // whether to go on: a Ctrl-C stops a long list there, and raises.
    let mut interrupt = None;
    let mut go_on = |_done: usize| match Python::attach(|py| py.check_signals()) {
        Ok(()) => true,
        Err(e) => {
            interrupt = Some(e);
            false
        }
    };
    let vectors = py.detach(|| {
        let ids: Vec<Vec<u32>> = list.iter().map(|t| model.input_ids(t)).collect();
        model.embed_ids_watched(&ids, opts, &mut go_on)
    });
    if let Some(e) = interrupt {
        return Err(e);
    }
    let vectors = vectors.py()?;
    if single.is_some() {
        let v = vectors.into_iter().next().unwrap_or_default();
        return Ok(PyArray1::from_vec(py, v).into_any());
    }
    let dim = model.dimensions();
    let flat: Vec<f32> = vectors.into_iter().flatten().collect();
    let rows = flat.len() / dim.max(1);
    let array = PyArray1::from_vec(py, flat).reshape([rows, dim])?;
    Ok(array.into_any())
}

/// The engine's counters (`Engine.metrics()`): model calls, passes, batch sizes, KV pages.
#[pyclass(frozen, get_all, module = "weft")]
#[derive(Clone)]
pub struct Metrics {
    /// Model calls made by the scheduler.
    steps: u64,
    /// Passes answered.
    passes: u64,
    /// Mean passes per model call.
    mean_batch_passes: f64,
    /// Largest number of passes in one model call.
    max_batch_passes: u64,
    /// Mean tokens per model call.
    mean_batch_tokens: f64,
    /// Tokens run in passes of more than one token.
    tokens_prefilled: u64,
    /// Tokens run in one-token passes (decode steps).
    tokens_decoded: u64,
    /// KV pages in use.
    kv_pages_used: usize,
    /// KV pages free.
    kv_pages_free: usize,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    prefix_queried_tokens: u64,
    prefix_hit_tokens: u64,
}

impl From<weft::Metrics> for Metrics {
    fn from(m: weft::Metrics) -> Metrics {
        Metrics {
            steps: m.steps,
            passes: m.passes,
            mean_batch_passes: m.mean_batch_passes,
            max_batch_passes: m.max_batch_passes,
            mean_batch_tokens: m.mean_batch_tokens,
            tokens_prefilled: m.tokens_prefilled,
            tokens_decoded: m.tokens_decoded,
            kv_pages_used: m.kv_pages_used,
            kv_pages_free: m.kv_pages_free,
            prefix_queried_tokens: m.prefix_queried_tokens,
            prefix_hit_tokens: m.prefix_hit_tokens,
        }
    }
}

/// `Metrics`' fields in their constructor's order (pickling).
type MetricsFields = (u64, u64, f64, u64, f64, u64, u64, usize, usize, u64, u64);

impl Metrics {
    fn fields(&self) -> MetricsFields {
        (
            self.steps,
            self.passes,
            self.mean_batch_passes,
            self.max_batch_passes,
            self.mean_batch_tokens,
            self.tokens_prefilled,
            self.tokens_decoded,
            self.kv_pages_used,
            self.kv_pages_free,
            self.prefix_queried_tokens,
            self.prefix_hit_tokens,
        )
    }
}

#[pymethods]
impl Metrics {
    /// Counters by hand (what unpickling calls); every field defaults to zero.
    #[new]
    #[pyo3(signature = (
        steps = 0, passes = 0, mean_batch_passes = 0.0, max_batch_passes = 0,
        mean_batch_tokens = 0.0, tokens_prefilled = 0, tokens_decoded = 0, kv_pages_used = 0,
        kv_pages_free = 0, prefix_queried_tokens = 0, prefix_hit_tokens = 0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        steps: u64,
        passes: u64,
        mean_batch_passes: f64,
        max_batch_passes: u64,
        mean_batch_tokens: f64,
        tokens_prefilled: u64,
        tokens_decoded: u64,
        kv_pages_used: usize,
        kv_pages_free: usize,
        prefix_queried_tokens: u64,
        prefix_hit_tokens: u64,
    ) -> Metrics {
        Metrics {
            steps,
            passes,
            mean_batch_passes,
            max_batch_passes,
            mean_batch_tokens,
            tokens_prefilled,
            tokens_decoded,
            kv_pages_used,
            kv_pages_free,
            prefix_queried_tokens,
            prefix_hit_tokens,
        }
    }

    /// Pickling (counters sent to another process): the class and its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, pyo3::types::PyType>, MetricsFields) {
        (slf.get_type(), slf.get().fields())
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }

    /// Equal counters hash alike (a class with `__eq__` and no `__hash__` is unhashable).
    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let f = self.fields();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (f.0, f.1, f.2.to_bits(), f.3, f.4.to_bits(), f.5, f.6).hash(&mut h);
        (f.7, f.8, f.9, f.10).hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        format!(
            "weft.Metrics(steps={}, passes={}, mean_batch_passes={:.2}, kv_pages_used={}, kv_pages_free={})",
            self.steps, self.passes, self.mean_batch_passes, self.kv_pages_used, self.kv_pages_free
        )
    }
}
