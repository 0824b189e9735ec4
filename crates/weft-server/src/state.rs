//! What every handler shares: the configuration, the engine once it is loaded, the
//! admission gate and the counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use weft::{Adapter, EmbeddingModel, Engine};

use crate::admission::{Admission, Preempted};
use crate::error::ApiError;
use crate::metrics::{Gauges, ServerMetrics};

/// How a server behaves. `Default` suits one user on one machine.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The id the model is served under (`/v1/models`, the `model` field).
    pub model_id: String,
    /// Requests to the API need `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Most requests generating at once (default 64).
    pub parallel: usize,
    /// Most requests waiting to start; one more gets 429 (default 256).
    pub max_queue: usize,
    /// Largest request body in bytes; a larger one gets 413 (default 8 MiB).
    pub body_limit: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_id: weft::hub::DEFAULT_MODEL.to_string(),
            api_key: None,
            parallel: 64,
            max_queue: 256,
            body_limit: 8 << 20,
        }
    }
}

/// An embedding model and the id it is served under.
struct Served {
    id: String,
    model: Arc<dyn EmbeddingModel>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served").field("id", &self.id).finish()
    }
}

/// A known model's name for any of its aliases (`smollm2` -> `smollm2-135m`), else `asked`: a
/// request may name the model either way, whichever the server was started with.
pub fn canonical(asked: &str) -> &str {
    weft::hub::find(asked).map_or(asked, |m| m.name)
}

/// The shared state behind the router.
#[derive(Debug)]
pub struct State {
    pub config: ServerConfig,
    engine: OnceLock<Engine>,
    /// LoRA adapters served beside the base model, by name.
    adapters: OnceLock<Vec<(String, Adapter)>>,
    /// The model `/v1/embeddings` serves (`--embedding-model`), with its id.
    embedding: OnceLock<Served>,
    load_error: OnceLock<String>,
    pub admission: Arc<Admission>,
    pub metrics: ServerMetrics,
    ids: AtomicU64,
    /// When the server started (Unix seconds): the `created` of the models it lists.
    pub started: u64,
}

impl State {
    pub fn new(config: ServerConfig) -> State {
        State {
            admission: Arc::new(Admission::new(config.parallel, config.max_queue)),
            config,
            engine: OnceLock::new(),
            adapters: OnceLock::new(),
            embedding: OnceLock::new(),
            load_error: OnceLock::new(),
            metrics: ServerMetrics::default(),
            ids: AtomicU64::new(0),
            started: unix_time(),
        }
    }

    /// The LoRA adapters requests can name (`"model": "BASE:NAME"` or `"NAME"`): set before
    /// the engine.
    pub fn set_adapters(&self, adapters: Vec<(String, Adapter)>) {
        let _ = self.adapters.set(adapters);
    }

    /// The adapters served, by name.
    pub fn adapters(&self) -> &[(String, Adapter)] {
        self.adapters.get().map_or(&[], Vec::as_slice)
    }

    /// Serves `model` on `/v1/embeddings` under `id` (beside the chat model, whose pooled
    /// hidden states `/v1/embeddings` gives when asked for by the chat model's id).
    pub fn set_embedding_model(&self, id: String, model: Arc<dyn EmbeddingModel>) {
        let _ = self.embedding.set(Served { id, model });
    }

    /// The id of the embedding model, if one is served.
    pub fn embedding_id(&self) -> Option<&str> {
        self.embedding.get().map(|s| s.id.as_str())
    }

    /// The model a `/v1/embeddings` request names (absent: the embedding model if there is
    /// one, else the chat model), with the id to report.
    pub fn embedding_model(&self, asked: Option<&str>) -> Result<Embedding, ApiError> {
        let chat_id = self.config.model_id.as_str();
        let chat = || -> Result<Embedding, ApiError> {
            let engine = self.engine()?.clone();
            Ok(Embedding {
                id: chat_id.to_string(),
                model: Arc::new(engine.clone()),
                kv: Some(engine),
            })
        };
        let served = |e: &Served| Embedding {
            id: e.id.clone(),
            model: e.model.clone(),
            kv: None,
        };
        match (self.embedding.get(), asked.map(canonical)) {
            (Some(e), None) => Ok(served(e)),
            (Some(e), Some(m)) if m == e.id => Ok(served(e)),
            (_, None) => chat(),
            (_, Some(m)) if m == chat_id => chat(),
            (_, Some(m)) => {
                let mut served = vec![chat_id.to_string()];
                served.extend(self.embedding_id().map(str::to_string));
                Err(ApiError::model_not_found(m, &served.join(", ")))
            }
        }
    }

    /// Makes the loaded engine available: `/health` turns 200.
    pub fn set_engine(&self, engine: Engine) {
        let _ = self.engine.set(engine);
    }

    /// The model could not be loaded: requests keep getting 503 with this message.
    pub fn set_load_error(&self, message: String) {
        let _ = self.load_error.set(message);
    }

    /// Why the model could not be loaded, if it could not.
    pub fn load_error(&self) -> Option<&str> {
        self.load_error.get().map(String::as_str)
    }

    /// The engine, or 503 while it loads.
    pub fn engine(&self) -> Result<&Engine, ApiError> {
        self.engine
            .get()
            .ok_or_else(|| match self.load_error.get() {
                Some(e) => ApiError::unavailable(format!("The model failed to load: {e}")),
                None => ApiError::unavailable("The model is still loading; retry shortly."),
            })
    }

    /// The adapter name in `asked` when it names one as `BASE:NAME` (the base model by its
    /// served id or an alias), else `asked` itself.
    fn adapter_part<'a>(&self, asked: &'a str) -> &'a str {
        let base = self.config.model_id.as_str();
        if let Some(name) = asked.strip_prefix(base).and_then(|r| r.strip_prefix(':')) {
            return name;
        }
        match asked.split_once(':') {
            Some((alias, name)) if canonical(alias) == base => name,
            _ => asked,
        }
    }

    /// Checks a request's `model` field: absent or the served id (the base model), or an
    /// adapter as `BASE:NAME` (vLLM's convention; `BASE` may be an alias) or `NAME`, which is
    /// returned.
    pub fn check_model(&self, asked: Option<&str>) -> Result<Option<Adapter>, ApiError> {
        let Some(m) = asked else { return Ok(None) };
        if canonical(m) == self.config.model_id {
            return Ok(None);
        }
        let name = self.adapter_part(m);
        match self.adapters().iter().find(|(n, _)| n == name) {
            Some((_, a)) => Ok(Some(a.clone())),
            None if self.embedding_id() == Some(canonical(m)) => {
                Err(ApiError::not_a_generative_model(m, &self.config.model_id))
            }
            None => Err(ApiError::model_not_found(m, &self.served_ids().join(", "))),
        }
    }

    /// The model id a response reports for a request that asked for `asked`: an adapter as
    /// `BASE:NAME` however it was named (`NAME`, `alias:NAME`), as `/v1/models` lists it; the
    /// base model under its own name rather than an alias.
    pub fn reported_model(&self, asked: Option<String>) -> String {
        let base = &self.config.model_id;
        match asked {
            Some(m) if canonical(&m) == base => base.clone(),
            Some(m) => {
                let name = self.adapter_part(&m);
                let adapter = self.adapters().iter().any(|(n, _)| n == name);
                if name.len() < m.len() || adapter {
                    format!("{base}:{name}")
                } else {
                    m
                }
            }
            None => base.clone(),
        }
    }

    /// Every id requests may name: the base model, then `BASE:NAME` per adapter.
    pub fn served_ids(&self) -> Vec<String> {
        let base = &self.config.model_id;
        std::iter::once(base.clone())
            .chain(self.adapters().iter().map(|(n, _)| format!("{base}:{n}")))
            .collect()
    }

    /// A fresh random id (`prefix-` and 24 hex digits).
    pub fn new_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{:016x}{:08x}",
            self.random(),
            self.random() as u32
        )
    }

    /// A random 64-bit value (request ids, seeds of requests that give none).
    pub fn random(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    }

    /// Waits for KV pages after a preemption (see [`crate::admission`]); keep the guard
    /// until the recomputing pass has run.
    pub async fn preempted(&self, engine: &Engine, need: usize) -> Preempted {
        self.metrics.preemptions.fetch_add(1, Ordering::Relaxed);
        self.admission.wait_for_pages(engine, need).await
    }

    /// The gauges `/metrics` shows. Reading the engine's counters may wait for its current
    /// step, so call this off the async workers.
    pub fn gauges(&self) -> Gauges {
        let (running, waiting) = self.admission.counts();
        Gauges {
            running,
            waiting,
            engine: self.engine.get().map(Engine::metrics),
        }
    }
}

/// The model a `/v1/embeddings` request runs on.
pub struct Embedding {
    /// The id to report.
    pub id: String,
    pub model: Arc<dyn EmbeddingModel>,
    /// The chat engine, when the vectors come from it: they take pages of its KV pool, so
    /// the request is admitted as a generation is.
    pub kv: Option<Engine>,
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
