//! The engine handle: a loaded model, its tokenizer and the scheduler thread that runs every
//! context's passes.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weft_core::checkpoint::WeightType;
use weft_core::gguf::GgufFile;
use weft_core::kv::{KvLayout, KvType};
use weft_core::models::{LayerPager, ModelInfo};
use weft_core::runner::{ModelRunner, RunnerConfig};
use weft_core::sampling::Sampler;
use weft_core::tokenizer::Tokenizer;
use weft_hub::{Hub, NoProgress};

use crate::chat::ChatTemplate;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::generator::StopRules;
use crate::scheduler::{self, Shared};

/// How an [`Engine`] is set up. `Default` suits one machine running a small model.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Threads for the forward pass (default: available cores).
    pub n_threads: usize,
    /// KV cache capacity in tokens over all contexts (default 16384).
    pub kv_tokens: usize,
    /// Longest context (default: the model's training context, at most `kv_tokens`). When
    /// given, the KV cache holds at least this many tokens, and it may exceed the training
    /// context (as llama.cpp's `-c` may; the model's output may degrade there).
    pub n_ctx: Option<usize>,
    /// Token budget of one scheduler step; longer prompts are prefilled in chunks (default 512).
    pub step_tokens: usize,
    /// How long a step waits for contexts that announced more passes (default 2 ms).
    pub batch_wait: Duration,
    /// How the KV cache stores keys and values (default [`KvType::F16`], as llama.cpp).
    /// [`KvType::Q8_0`] holds the same tokens in about half the memory (34 bytes per 32
    /// values), with a perplexity within 0.5% of f16's on the models weft ships for.
    pub kv_type: KvType,
    /// Automatic prefix cache (default on): a context whose first tokens fill the same full
    /// KV pages as an earlier context's attaches them instead of computing them. Outputs are
    /// bit-identical either way; finished contexts' pages stay cached until the pool needs
    /// them (least recently used first).
    pub prefix_cache: bool,
    /// Layer paging for models larger than memory (default `None`: every block resident):
    /// at most the pager's number of transformer blocks stay in memory, the others are read
    /// from the model file (or the pager's [`PagerSource`](weft_core::models::PagerSource))
    /// when a pass reaches them. Outputs are the same; passes are slower.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use weft::{Engine, EngineConfig, models::LayerPager};
    /// # fn main() -> weft::Result<()> {
    /// let path = weft::Hub::from_env()?.resolve("gemma3-270m", &mut weft::NoProgress)?;
    /// let config = EngineConfig {
    ///     layer_pager: Some(Arc::new(LayerPager::new(4))),
    ///     ..EngineConfig::default()
    /// };
    /// let engine = Engine::open(&path, config)?;
    /// let mut ctx = engine.context();
    /// ctx.fill("The loom")?;
    /// let text = weft::block_on(ctx.generate(weft::Sampler::Argmax).max_tokens(8).collect_text())?;
    /// let stats = engine.layer_pager().map(|p| p.stats());
    /// println!("{text} ({stats:?})");
    /// # Ok(()) }
    /// ```
    pub layer_pager: Option<Arc<LayerPager>>,
    /// How the matrices of a Hugging Face checkpoint folder are stored once loaded (default
    /// [`WeightType::Q8_0`]). A GGUF file keeps its own types under Q8_0; F16 or F32 widen its
    /// quantized matrices ([`crate::checkpoint::widen`]: float activations, so outputs move
    /// smoothly under small perturbations; more memory, slower decode). See
    /// [`crate::checkpoint`].
    pub checkpoint_weights: WeightType,
    /// What generators use where they set nothing themselves: the sampler of
    /// `ctx.generate(None)` and the stop rules every generator starts from (seed 004's
    /// engine-wide sampler config).
    pub generation: GenerationDefaults,
}

/// The engine's generation defaults (see [`EngineConfig::generation`]).
///
/// ```no_run
/// use weft::{Engine, EngineConfig, GenerationDefaults, Sampler, StopRules};
/// # fn main() -> weft::Result<()> {
/// let path = weft::Hub::from_env()?.resolve("smollm2-135m", &mut weft::NoProgress)?;
/// let config = EngineConfig {
///     generation: GenerationDefaults {
///         sampler: Sampler::TopP { p: 0.9, temperature: 0.7 },
///         stop: StopRules::new().max_tokens(64).stop_string("\n\n"),
///     },
///     ..EngineConfig::default()
/// };
/// let engine = Engine::open(&path, config)?;
/// let mut ctx = engine.context();
/// ctx.fill("Once upon a time")?;
/// // No sampler and no stop rules given: the engine's are used.
/// let text = weft::block_on(ctx.generate(None).collect_text())?;
/// assert_eq!(engine.config().generation.stop.max_tokens, 64);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationDefaults {
    /// The sampler of a generator made without one (default [`Sampler::Argmax`]: greedy, as
    /// Hugging Face's `generate` is without `do_sample`).
    pub sampler: Sampler,
    /// The stop rules every generator starts from (default: 256 tokens and the model's
    /// end-of-turn set); builder calls such as `max_tokens` change the generator's copy.
    pub stop: StopRules,
}

impl Default for GenerationDefaults {
    fn default() -> Self {
        GenerationDefaults {
            sampler: Sampler::Argmax,
            stop: StopRules::default(),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        let r = RunnerConfig::default();
        EngineConfig {
            n_threads: r.n_threads,
            kv_tokens: r.kv_tokens,
            n_ctx: r.n_ctx,
            step_tokens: r.max_ubatch,
            batch_wait: Duration::from_millis(2),
            kv_type: KvType::F16,
            prefix_cache: true,
            layer_pager: None,
            checkpoint_weights: WeightType::Q8_0,
            generation: GenerationDefaults::default(),
        }
    }
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Metrics {
    /// Model calls made by the scheduler.
    pub steps: u64,
    /// Passes answered.
    pub passes: u64,
    /// Mean passes per model call (how much contexts shared model calls).
    pub mean_batch_passes: f64,
    /// Largest number of passes in one model call.
    pub max_batch_passes: u64,
    /// Mean tokens per model call.
    pub mean_batch_tokens: f64,
    /// Tokens run in passes of more than one token (prompts, chunks, multi-token inputs).
    pub tokens_prefilled: u64,
    /// Tokens run in one-token passes (decode steps).
    pub tokens_decoded: u64,
    /// KV pages in use, over all layer groups.
    pub kv_pages_used: usize,
    /// KV pages free, over all layer groups (pages only the prefix cache holds count as free).
    pub kv_pages_free: usize,
    /// Prompt tokens looked up in the prefix cache, and those found there (not computed).
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Cached pages given back to the pool to make room.
    pub prefix_evictions: u64,
    /// Times the scheduler waited the whole [`EngineConfig::batch_wait`] for a pass a context
    /// had announced (its `horizon`) and gave up: each is a step delayed for nothing.
    pub batch_wait_timeouts: u64,
}

pub(crate) struct Inner {
    pub shared: Arc<Shared>,
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
    pub chat_error: Option<String>,
    pub info: ModelInfo,
    pub n_ctx: usize,
    pub stop_tokens: Vec<u32>,
    /// The configuration in effect (thread count and context length resolved).
    pub config: EngineConfig,
    /// llguidance's token trie and parser factory, built on the first constraint.
    pub llg: std::sync::OnceLock<Arc<llguidance::ParserFactory>>,
    /// The model file (and its path, when opened from one), the KV cache's layout and the
    /// fingerprint, computed on the first snapshot or resume.
    pub file: Arc<GgufFile>,
    pub path: Option<PathBuf>,
    pub kv_layout: KvLayout,
    pub fingerprint: std::sync::OnceLock<String>,
    /// The engine-level adapter stack (see [`Engine::push_lora`]).
    pub lora_stack: std::sync::Mutex<Vec<(crate::adapter::Adapter, f32)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A copy left by `fork()` has no scheduler thread to stop or join.
        if self.shared.orphaned() {
            return;
        }
        self.shared.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A loaded model with its scheduler: cheap to clone, `Send + Sync`.
///
/// Every [`Context`] made from an engine submits its passes to the engine's one scheduler
/// thread, which batches the passes of all live contexts into shared model calls.
///
/// ```no_run
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("The capital of France is")?;
/// let text = weft::block_on(ctx.generate(weft::Sampler::Argmax).max_tokens(8).collect_text())?;
/// println!("{text}");
/// # Ok::<(), weft::Error>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.info.arch)
            .finish()
    }
}

impl Engine {
    /// Loads a known model by name (fetched into the cache on first use, see [`Hub`]), or a
    /// GGUF file or Hugging Face checkpoint folder by path (see [`Engine::open`]), with the
    /// default configuration.
    pub fn load(model: &str) -> Result<Engine> {
        let path = Hub::resolve_from_env(model, &mut NoProgress)?;
        Engine::open(&path, EngineConfig::default())
    }

    /// Loads the GGUF file at `path`, or the Hugging Face checkpoint folder at `path` (a Llama
    /// or Gemma 3 decoder in safetensors, with its `config.json` and `tokenizer.json`),
    /// converted on its first load, its matrices in [`EngineConfig::checkpoint_weights`] (see
    /// [`crate::checkpoint`]), and kept converted in the cache for later loads.
    pub fn open(path: &Path, config: EngineConfig) -> Result<Engine> {
        crate::embed::ensure_decoder(path)?;
        let (file, at) = crate::converted::open_model(path, config.checkpoint_weights)?;
        Engine::build(Arc::new(file), at, config, None)
    }

    /// Loads a GGUF model held in memory (embedded in a binary, received over a socket, …),
    /// with the tokenizer of a Hugging Face `tokenizer.json` when one is given (see
    /// [`Tokenizer::from_json`]), else the GGUF's own. The special tokens the `tokenizer.json`
    /// does not name (its EOS, for one) are taken from the GGUF where the two agree on their
    /// text. The tokenizer must not have more tokens than the model has embeddings.
    ///
    /// ```no_run
    /// use weft::{Engine, EngineConfig, Sampler};
    /// # fn main() -> weft::Result<()> {
    /// let model = std::fs::read("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let tokenizer = std::fs::read_to_string("tokenizer.json")?;
    /// let engine = Engine::from_bytes(model, Some(&tokenizer), EngineConfig::default())?;
    /// let mut ctx = engine.context();
    /// ctx.fill("The capital of France is")?;
    /// let text = weft::block_on(ctx.generate(Sampler::Argmax).max_tokens(8).collect_text())?;
    /// println!("{text}");
    /// # Ok(()) }
    /// ```
    #[doc(alias = "load_model_from_bytes")]
    pub fn from_bytes(
        model: Vec<u8>,
        tokenizer_json: Option<&str>,
        config: EngineConfig,
    ) -> Result<Engine> {
        let file = Arc::new(GgufFile::from_bytes(model)?);
        let tokenizer = match tokenizer_json {
            Some(json) => {
                let mut tokenizer = Tokenizer::from_json(json)?;
                tokenizer.fill_special_from_gguf(&file)?;
                Some(tokenizer)
            }
            None => None,
        };
        Engine::build(file, None, config, tokenizer)
    }

    /// Builds an engine over an opened GGUF file.
    pub fn from_file(file: Arc<GgufFile>, config: EngineConfig) -> Result<Engine> {
        Engine::build(file, None, config, None)
    }

    /// Builds an engine over a GGUF file opened from `path`: as [`Engine::from_file`], and
    /// the model fingerprint snapshots need is cached next to the file.
    pub fn from_file_at(file: Arc<GgufFile>, path: &Path, config: EngineConfig) -> Result<Engine> {
        Engine::build(file, Some(path.to_path_buf()), config, None)
    }

    /// The engine over `file`, with `tokenizer` or else the file's own.
    fn build(
        file: Arc<GgufFile>,
        path: Option<PathBuf>,
        config: EngineConfig,
        tokenizer: Option<Tokenizer>,
    ) -> Result<Engine> {
        weft_core::models::check_architecture(&file)?;
        let tokenizer = match tokenizer {
            Some(t) => t,
            None => Tokenizer::from_gguf(&file)?,
        };
        let (chat, chat_error) = match ChatTemplate::from_gguf(&file, &tokenizer) {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let runner = ModelRunner::new(
            file.clone(),
            &RunnerConfig {
                n_threads: config.n_threads.max(1),
                kv_tokens: config.kv_tokens,
                n_ctx: config.n_ctx,
                max_ubatch: config.step_tokens.max(1),
                prefix_cache: config.prefix_cache,
                layer_pager: config.layer_pager.clone(),
                kv_type: config.kv_type,
            },
        )?;
        let info = runner.info().clone();
        if tokenizer.vocab_size() > info.vocab_size {
            return Err(Error::Config(format!(
                "the tokenizer has {} tokens but the model only {}: its ids would run past the embeddings",
                tokenizer.vocab_size(),
                info.vocab_size
            )));
        }
        let n_ctx = runner.n_ctx();
        let kv_layout = runner.kv().layout().clone();
        let stop_tokens = crate::chat::stop_tokens(&tokenizer);
        let config = EngineConfig {
            n_threads: config.n_threads.max(1),
            kv_tokens: runner.kv().capacity(),
            n_ctx: Some(n_ctx),
            step_tokens: config.step_tokens.max(1),
            ..config
        };
        let shared = Arc::new(Shared::new(runner, config.step_tokens, config.batch_wait));
        let thread = scheduler::spawn(shared.clone())
            .map_err(|e| Error::Config(format!("cannot start the scheduler thread: {e}")))?;
        Ok(Engine {
            inner: Arc::new(Inner {
                shared,
                tokenizer,
                chat,
                chat_error,
                info,
                n_ctx,
                stop_tokens,
                llg: std::sync::OnceLock::new(),
                file,
                path,
                kv_layout,
                fingerprint: std::sync::OnceLock::new(),
                config,
                lora_stack: std::sync::Mutex::new(Vec::new()),
                thread: Some(thread),
            }),
        })
    }

    /// The whole configuration in effect: what was asked, with the thread count, the context
    /// length (`n_ctx`, resolved from the model), the KV cache's real size (`kv_tokens`: at
    /// least `n_ctx`, in whole pages) and the step budget filled in.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The layer pager, when the engine pages its blocks (see [`EngineConfig::layer_pager`]).
    pub fn layer_pager(&self) -> Option<&Arc<LayerPager>> {
        self.inner.config.layer_pager.as_ref()
    }

    /// A new, empty context.
    pub fn context(&self) -> Context {
        Context::new(self.clone())
    }

    /// The model's shape and vocabulary.
    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    /// The vectors the model's first block reads for `ids`, `ids.len() × n_embd` values: the
    /// embedding rows, scaled as the model scales them (Gemma 3: by √n_embd). Given to
    /// [`Context::fill_embeds`] or [`crate::Forward::input_embeds`] they reproduce the ids'
    /// logits exactly; a multimodal front end mixes its projected features with them.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let ids = engine.tokenize("Hello");
    /// let rows = engine.input_embeddings(&ids)?;
    /// assert_eq!(rows.len(), ids.len() * engine.info().n_embd);
    /// # Ok(()) }
    /// ```
    pub fn input_embeddings(&self, ids: &[u32]) -> Result<Vec<f32>> {
        self.check_ids(ids.iter().copied())?;
        Ok(self.inner.shared.runner().input_embeddings(ids)?)
    }

    /// Longest context in tokens.
    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx
    }

    /// The smallest sliding window of the model's layers (`None`: every layer sees the whole
    /// context). A pass can be rolled back by this many tokens at least.
    pub(crate) fn smallest_window(&self) -> Option<usize> {
        self.inner
            .kv_layout
            .groups
            .iter()
            .filter_map(|g| g.window)
            .min()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Token ids of `text` (special tokens written in the text are parsed; no BOS is added).
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.inner.tokenizer.encode(text, false, true)
    }

    /// `Ok` when every one of `ids` is in the model's vocabulary, else
    /// [`Error::TokenOutOfVocab`] naming the first that is not.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// assert!(engine.check_ids(engine.tokenize("Hello")).is_ok());
    /// assert!(engine.check_ids([u32::MAX]).is_err());
    /// # Ok(()) }
    /// ```
    pub fn check_ids(&self, ids: impl IntoIterator<Item = u32>) -> Result<()> {
        crate::error::check_vocab(ids, self.info().vocab_size)
    }

    /// The text of `ids`, as llama.cpp's detokenizer renders it: a leading BOS the tokenizer
    /// would have added is dropped, other control tokens (`<|im_end|>`, a padding EOS) appear
    /// as their text. [`detokenize_skip_special`](Engine::detokenize_skip_special) leaves them
    /// out.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids.iter().copied())?;
        Ok(self.inner.tokenizer.decode(ids)?)
    }

    /// The text of `ids` without their control tokens (BOS, EOS, padding, chat markers), as
    /// transformers' `decode(ids, skip_special_tokens=True)`: the text a generation streams.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let ids = engine.tokenize("<|im_start|>Hello<|im_end|>");
    /// assert_eq!(engine.detokenize_skip_special(&ids)?, "Hello");
    /// # Ok(()) }
    /// ```
    pub fn detokenize_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids.iter().copied())?;
        Ok(self.inner.tokenizer.decode_with(ids, false)?)
    }

    /// Whether `id` ends generation by default (EOS, end-of-turn markers).
    pub fn is_eos(&self, id: u32) -> bool {
        self.inner.stop_tokens.contains(&id)
    }

    /// The model's default stop set (EOS and end-of-turn markers from the GGUF).
    pub fn stop_tokens(&self) -> &[u32] {
        &self.inner.stop_tokens
    }

    /// The model's chat template, when the GGUF has one or weft knows the family.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.inner.chat.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "this model has no usable chat template: {}",
                self.inner.chat_error.as_deref().unwrap_or("unknown")
            ))
        })
    }

    /// The scheduler's counters and the KV pool's state. Context operations issued before
    /// the call (a context dropped, forked, truncated) are counted: if the scheduler has not
    /// applied them yet, this waits until it has (at most until its current step ends). See
    /// [`Engine::kv_free_tokens`] for a reading that never waits.
    pub fn metrics(&self) -> Metrics {
        self.inner.shared.wait_applied();
        let c = &self.inner.shared.counters;
        let steps = c.steps.load(Ordering::Relaxed);
        let per_step = |v: u64| {
            if steps == 0 {
                0.0
            } else {
                v as f64 / steps as f64
            }
        };
        Metrics {
            steps,
            passes: c.passes.load(Ordering::Relaxed),
            mean_batch_passes: per_step(c.step_passes.load(Ordering::Relaxed)),
            max_batch_passes: c.max_step_passes.load(Ordering::Relaxed),
            mean_batch_tokens: per_step(c.step_tokens.load(Ordering::Relaxed)),
            tokens_prefilled: c.prefilled.load(Ordering::Relaxed),
            tokens_decoded: c.decoded.load(Ordering::Relaxed),
            kv_pages_used: c.kv_used.load(Ordering::Relaxed),
            kv_pages_free: c.kv_free.load(Ordering::Relaxed),
            prefix_queried_tokens: c.prefix_queried.load(Ordering::Relaxed),
            prefix_hit_tokens: c.prefix_hits.load(Ordering::Relaxed),
            prefix_evictions: c.prefix_evictions.load(Ordering::Relaxed),
            batch_wait_timeouts: c.batch_wait_timeouts.load(Ordering::Relaxed),
        }
    }

    /// Tokens that fit in the free KV pages of the fullest layer group, as of the scheduler's
    /// last step or context operation: never waits.
    pub fn kv_free_tokens(&self) -> usize {
        self.inner
            .shared
            .counters
            .kv_free_min
            .load(Ordering::Relaxed)
            * weft_core::kv::PAGE_SIZE
    }
}
