//! [`Embedder`]: sentence embeddings from an encoder model — a BERT read from a
//! sentence-transformers folder (`model.safetensors`, `config.json`, `tokenizer.json`, and the
//! optional `sentence_bert_config.json`, `modules.json` and its pooling `config.json`), such as
//! all-MiniLM-L6-v2.
//!
//! An encoder has no KV cache and generates nothing: each text is one sequence that attends to
//! itself in both directions, and many texts go through the model in one call (no padding;
//! each text attends only to its own tokens, so its vector is the same alone or in a batch).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use weft_core::models::bert::{Bert, BertConfig};
use weft_core::models::TensorFile;
use weft_core::threadpool::ThreadPool;
use weft_core::tokenizer::Tokenizer;
use weft_hub::{Hub, NoProgress};

use crate::embed::{pool, EmbedOptions, Pooling};
use crate::error::{Error, Result};

/// How an [`Embedder`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedderConfig {
    /// Threads for the forward pass (default: available cores).
    pub n_threads: usize,
    /// Tokens per model call: a batch is cut into calls of at most this many tokens
    /// (default 4096; a longer single text runs alone).
    pub batch_tokens: usize,
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        EmbedderConfig {
            n_threads: weft_core::runner::RunnerConfig::default().n_threads,
            batch_tokens: crate::embed::GROUP_TOKENS,
        }
    }
}

/// A loaded encoder model: cheap to clone, usable from many threads (model calls take turns).
///
/// ```no_run
/// # fn main() -> weft::Result<()> {
/// let model = weft::Embedder::load("all-minilm-l6-v2")?; // fetched on first use
/// let v = model.embed_batch(&["A man is eating food.", "A man is eating a piece of bread."])?;
/// let cosine: f32 = v[0].iter().zip(&v[1]).map(|(a, b)| a * b).sum();
/// println!("{cosine:.3}"); // 0.755
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Embedder {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    model: Bert,
    tokenizer: Tokenizer,
    /// Longest input in tokens, `[CLS]` and `[SEP]` included; longer texts are truncated.
    max_tokens: usize,
    pooling: Pooling,
    batch_tokens: usize,
    run: Mutex<ThreadPool>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("name", &self.inner.name)
            .field("dim", &self.dim())
            .finish()
    }
}

/// Reads an optional JSON file of the model folder.
fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            Error::Core(weft_core::Error::BadModel {
                reason: format!("{}: {e}", path.display()),
            })
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Core(weft_core::Error::Io {
            path: path.to_path_buf(),
            source,
        })),
    }
}

/// The folder of the model's pooling module, from `modules.json` (`1_Pooling` without one).
/// A module weft does not run (a `Dense` projection, a `LayerNorm`, …) is an error: leaving
/// it out would give vectors other than the model's.
fn pooling_dir(dir: &Path) -> Result<PathBuf> {
    let Some(modules) = read_json(&dir.join("modules.json"))? else {
        return Ok(PathBuf::from("1_Pooling"));
    };
    let unsupported = |what: String| {
        Error::Core(weft_core::Error::UnsupportedModel {
            what: format!("{what} (modules.json)"),
        })
    };
    let mut pooling = None;
    for module in modules.as_array().into_iter().flatten() {
        let kind = module.get("type").and_then(Value::as_str).unwrap_or("");
        let path = module.get("path").and_then(Value::as_str).unwrap_or("");
        match kind.rsplit('.').next().unwrap_or(kind) {
            "Transformer" | "Normalize" => {}
            "Pooling" => pooling = Some(PathBuf::from(path)),
            other => {
                return Err(unsupported(format!(
                    "a sentence-transformers {other:?} module ({path})"
                )))
            }
        }
    }
    Ok(pooling.unwrap_or_else(|| PathBuf::from("1_Pooling")))
}

/// The pooling a sentence-transformers `Pooling` module's `config.json` asks for; modes weft
/// does not compute (`mean_sqrt_len`, `weightedmean`, several at once) are errors.
fn pooling_mode(config: &Value) -> Result<Pooling> {
    let modes = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_max_tokens", Some(Pooling::Max)),
        ("pooling_mode_lasttoken", Some(Pooling::Last)),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let on: Vec<_> = modes
        .iter()
        .filter(|(k, _)| config.get(*k).and_then(Value::as_bool) == Some(true))
        .collect();
    match on.as_slice() {
        [] => Ok(Pooling::Mean),
        [(_, Some(p))] => Ok(*p),
        _ => {
            let names: Vec<&str> = on.iter().map(|(k, _)| *k).collect();
            Err(Error::Core(weft_core::Error::UnsupportedModel {
                what: format!("sentence-transformers pooling {}", names.join(" + ")),
            }))
        }
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| {
        Error::Core(weft_core::Error::Io {
            path: path.to_path_buf(),
            source,
        })
    })
}

impl Embedder {
    /// Loads a known encoder by name (fetched into the cache on first use, see [`Hub`]), or a
    /// model folder / its `model.safetensors` by path, with the default configuration.
    pub fn load(model: &str) -> Result<Embedder> {
        let path = Hub::resolve_from_env(model, &mut NoProgress)?;
        Embedder::open(&path, EmbedderConfig::default())
    }

    /// Loads the model folder at `path` (or the folder of the `model.safetensors` at `path`).
    pub fn open(path: &Path, config: EmbedderConfig) -> Result<Embedder> {
        let (dir, weights) = if path.is_dir() {
            (path.to_path_buf(), path.join("model.safetensors"))
        } else {
            let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
            (dir, path.to_path_buf())
        };
        let tensors = TensorFile::open(&weights)?;
        let bert_config = read_text(&dir.join("config.json"))?;
        let tokenizer = read_text(&dir.join("tokenizer.json"))?;
        let sentence = read_json(&dir.join("sentence_bert_config.json"))?;
        let pooling_dir = pooling_dir(&dir)?;
        let pooling = read_json(&dir.join(pooling_dir).join("config.json"))?;
        Embedder::build(
            dir.display().to_string(),
            &tensors,
            &bert_config,
            &tokenizer,
            sentence.as_ref(),
            pooling.as_ref(),
            config,
        )
    }

    /// Builds an embedder from memory: the safetensors bytes, `config.json` and
    /// `tokenizer.json` (seed 004's `load_model_from_bytes`). Mean pooling; inputs are
    /// truncated to the tokenizer's truncation length, or the model's positions.
    pub fn from_bytes(
        model: Vec<u8>,
        config_json: &str,
        tokenizer_json: &str,
        config: EmbedderConfig,
    ) -> Result<Embedder> {
        let tensors = TensorFile::from_bytes("model.safetensors", model)?;
        let name = "(from bytes)".to_string();
        Embedder::build(
            name,
            &tensors,
            config_json,
            tokenizer_json,
            None,
            None,
            config,
        )
    }

    fn build(
        name: String,
        tensors: &TensorFile,
        bert_config: &str,
        tokenizer_json: &str,
        sentence: Option<&Value>,
        pooling: Option<&Value>,
        config: EmbedderConfig,
    ) -> Result<Embedder> {
        // Threads first: a bad count is an error before the model loads.
        let pool = ThreadPool::try_new(config.n_threads)?;
        let cfg = BertConfig::from_json(bert_config)?;
        let tokenizer = Tokenizer::from_json(tokenizer_json)?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(Error::Core(weft_core::Error::BadModel {
                reason: format!(
                    "the tokenizer has {} tokens, the model's embedding table only {}",
                    tokenizer.vocab_size(),
                    cfg.vocab_size
                ),
            }));
        }
        if cfg.max_position_embeddings < 2 {
            return Err(Error::Core(weft_core::Error::BadModel {
                reason: format!(
                    "max_position_embeddings is {}: an encoder needs room for [CLS] and [SEP]",
                    cfg.max_position_embeddings
                ),
            }));
        }
        // sentence-transformers truncates to `max_seq_length`, overriding the tokenizer file.
        let max_tokens = sentence
            .and_then(|s| s.get("max_seq_length"))
            .and_then(Value::as_u64)
            .map(|n| n as usize)
            .or(tokenizer.truncation())
            .unwrap_or(cfg.max_position_embeddings)
            .clamp(2, cfg.max_position_embeddings);
        let pooling = pooling.map_or(Ok(Pooling::Mean), pooling_mode)?;
        let model = Bert::load(tensors, cfg)?;
        Ok(Embedder {
            inner: Arc::new(Inner {
                name,
                model,
                tokenizer,
                max_tokens,
                pooling,
                batch_tokens: config.batch_tokens.max(1),
                run: Mutex::new(pool),
            }),
        })
    }

    /// The model's folder (or `(from bytes)`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Length of the vectors.
    pub fn dim(&self) -> usize {
        self.inner.model.config().hidden_size
    }

    /// Longest input in tokens (`[CLS]` and `[SEP]` included); longer texts are truncated.
    pub fn max_tokens(&self) -> usize {
        self.inner.max_tokens
    }

    /// The pooling the model was trained with (its pooling module's `config.json`, found
    /// through `modules.json`; mean without one).
    pub fn pooling(&self) -> Pooling {
        self.inner.pooling
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The ids the model sees for `text`: `[CLS]`, the text's pieces (truncated to fit
    /// [`max_tokens`](Embedder::max_tokens)), `[SEP]`.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let tok = &self.inner.tokenizer;
        let special = tok.vocab().special();
        let mut ids = tok.encode(text, false, true);
        let wrap = usize::from(special.add_bos) + usize::from(special.add_eos);
        ids.truncate(self.inner.max_tokens.saturating_sub(wrap));
        let mut out = Vec::with_capacity(ids.len() + wrap);
        out.extend(special.bos.filter(|_| special.add_bos));
        out.extend(ids);
        out.extend(special.eos.filter(|_| special.add_eos));
        out
    }

    /// The embedding of `text`, pooled as the model was trained ([`Embedder::pooling`]) and
    /// L2-normalized.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>> {
        self.embed_with(text, self.pooling())
    }

    /// [`Embedder::embed`] with another pooling.
    pub fn embed_with(&self, text: &str, pooling: Pooling) -> Result<Vec<f32>> {
        let mut v = self.embed_batch_with(&[text], pooling)?;
        Ok(v.pop().unwrap_or_default())
    }

    /// The embeddings of `texts`, computed together.
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_batch_with(texts, self.pooling())
    }

    /// [`Embedder::embed_batch`] with another pooling.
    pub fn embed_batch_with(&self, texts: &[&str], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
        self.embed_batch_opts(
            texts,
            EmbedOptions {
                pooling,
                ..EmbedOptions::default()
            },
        )
    }

    /// The embeddings of `texts` with the given pooling and normalization.
    pub fn embed_batch_opts(&self, texts: &[&str], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| self.tokenize(t)).collect();
        self.embed_tokens(&ids, opts)
    }

    /// The embeddings of already tokenized inputs (each as [`Embedder::tokenize`] gives it,
    /// special tokens included). An input longer than the model's positions is
    /// [`Error::ContextTooLong`]; an empty one [`Error::EmptyPass`].
    pub fn embed_tokens(&self, inputs: &[Vec<u32>], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed_tokens_watched(inputs, opts, &mut |_| true)
    }

    /// [`Embedder::embed_tokens`], asking `go_on` before each model call with the number of
    /// inputs done so far; `false` stops there with [`Error::Cancelled`] (as
    /// [`crate::Engine::embed_tokens_watched`]).
    pub fn embed_tokens_watched(
        &self,
        inputs: &[Vec<u32>],
        opts: EmbedOptions,
        go_on: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Vec<Vec<f32>>> {
        let cfg = self.inner.model.config();
        for ids in inputs {
            if ids.is_empty() {
                return Err(Error::EmptyPass);
            }
            if ids.len() > cfg.max_position_embeddings {
                return Err(Error::ContextTooLong {
                    len: ids.len(),
                    n_ctx: cfg.max_position_embeddings,
                });
            }
            crate::error::check_vocab(ids.iter().copied(), cfg.vocab_size)?;
        }
        let d = self.dim();
        let mut out = Vec::with_capacity(inputs.len());
        let mut start = 0;
        while start < inputs.len() {
            if !go_on(start) {
                return Err(Error::Cancelled);
            }
            // As many inputs as fit in one call's token budget (at least one).
            let mut end = start + 1;
            let mut tokens = inputs[start].len();
            while end < inputs.len() && tokens + inputs[end].len() <= self.inner.batch_tokens {
                tokens += inputs[end].len();
                end += 1;
            }
            let group: Vec<&[u32]> = inputs[start..end].iter().map(Vec::as_slice).collect();
            let hidden = {
                let threads = self
                    .inner
                    .run
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                self.inner.model.forward(&threads, &group)?
            };
            let mut rows = hidden.chunks_exact(d);
            for ids in &group {
                let token_rows: Vec<&[f32]> = rows.by_ref().take(ids.len()).collect();
                let picked: Vec<&[f32]> = match opts.pooling {
                    Pooling::Cls => token_rows[..1].to_vec(),
                    Pooling::Last => token_rows[token_rows.len() - 1..].to_vec(),
                    _ => token_rows,
                };
                out.push(pool(&picked, opts));
            }
            start = end;
        }
        Ok(out)
    }
}
