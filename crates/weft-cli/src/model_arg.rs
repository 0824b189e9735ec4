//! `-m MODEL`: a known model name (fetched on first use), a path to a GGUF file, or a Hugging
//! Face checkpoint folder (Llama or Gemma 3 in safetensors, converted as it loads).

use std::path::{Path, PathBuf};

use anyhow::Context;
use weft::{GgufFile, Hub};

use crate::progress::Bar;

/// The `-m/--model` option shared by every command that needs a model.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArg {
    /// A known model name (see `weft models`), the path of a GGUF file, or a Hugging Face
    /// checkpoint folder (Llama or Gemma 3 safetensors with config.json and tokenizer.json).
    #[arg(short = 'm', long = "model", default_value = weft::hub::DEFAULT_MODEL)]
    pub model: String,
    /// How a checkpoint folder's matrices are stored once loaded: q8_0 (default; fastest),
    /// f16 or f32 (the checkpoint's values). A GGUF file keeps its own types, unless f16 or
    /// f32 is asked: its quantized matrices are then widened (for small perturbations; slower).
    #[arg(long = "weights", value_name = "TYPE", default_value = "q8_0")]
    pub weights: weft::checkpoint::WeightType,
}

impl ModelArg {
    /// The model's local path, fetching a known model if it is not cached yet.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        Ok(Hub::resolve_from_env(&self.model, &mut Bar::default())?)
    }

    /// Opens the model file.
    pub fn open(&self) -> anyhow::Result<GgufFile> {
        self.open_path(&self.path()?)
    }

    /// Opens the model file at an already resolved `path`.
    pub fn open_path(&self, path: &Path) -> anyhow::Result<GgufFile> {
        Ok(self.open_path_from(path)?.0)
    }

    /// An engine (scheduler and all) with `config` over the model at an already resolved
    /// `path`. Snapshots cache the model's fingerprint next to the file the weights are
    /// mapped from (not next to `path` when `--weights` widened a GGUF file's: a session saved
    /// under one weight type must not load under another).
    pub fn engine(&self, path: &Path, config: weft::EngineConfig) -> anyhow::Result<weft::Engine> {
        let (file, mapped) = self.open_path_from(path)?;
        let file = std::sync::Arc::new(file);
        Ok(match mapped {
            Some(mapped) => weft::Engine::from_file_at(file, &mapped, config)?,
            None => weft::Engine::from_file(file, config)?,
        })
    }

    /// Opens the model at an already resolved `path`, and names the file it is mapped from:
    /// `path` itself for a GGUF file, the cached conversion of a checkpoint folder, or `None`
    /// when the conversion is held in memory.
    pub fn open_path_from(&self, path: &Path) -> anyhow::Result<(GgufFile, Option<PathBuf>)> {
        weft::ensure_decoder(path)?;
        weft::open_model(path, self.weights).with_context(|| {
            let mut msg = format!("cannot load model {}", path.display());
            // A known name resolved to the cache: its file was verified once, and may have
            // been damaged since.
            if weft::hub::find(&self.model).is_some_and(|_| !Path::new(&self.model).exists()) {
                msg += &format!(
                    " (the cached file may be damaged: `weft pull {}` hashes it again and \
                     fetches it anew if it no longer matches)",
                    self.model
                );
            }
            msg
        })
    }
}

/// The options of the commands that run a model: `-t/--threads` and `--resident-layers`.
#[derive(Debug, Clone, clap::Args)]
pub struct ThreadsArg {
    /// Threads for the forward pass (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Keep at most K transformer blocks in memory, reading the others from the model file
    /// when a pass needs them (for models larger than memory; slower). Default: all.
    #[arg(long, value_name = "K")]
    pub resident_layers: Option<usize>,
    /// How the KV cache stores keys and values: f16 (llama.cpp's default) or q8_0 (half the
    /// memory, a perplexity within 0.5% of f16's).
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16")]
    pub kv_type: weft::KvType,
}

impl ThreadsArg {
    /// The runner configuration these options ask for.
    pub fn runner_config(&self) -> anyhow::Result<weft::RunnerConfig> {
        let mut cfg = weft::RunnerConfig::default();
        cfg.n_threads = self.checked()?.unwrap_or(cfg.n_threads);
        cfg.layer_pager = self.pager()?;
        cfg.kv_type = self.kv_type;
        Ok(cfg)
    }

    /// `--threads`, if given, after checking its range.
    pub fn checked(&self) -> anyhow::Result<Option<usize>> {
        if let Some(t) = self.threads {
            anyhow::ensure!(
                (1..=256).contains(&t),
                "--threads must be between 1 and 256"
            );
        }
        Ok(self.threads)
    }

    /// Checks the options' ranges: called first, so that a bad value is an error before a
    /// model is fetched, loaded or converted (minutes for a checkpoint folder).
    pub fn check(&self) -> anyhow::Result<()> {
        self.checked()?;
        self.pager().map(drop)
    }

    /// The layer pager `--resident-layers` asks for.
    pub fn pager(&self) -> anyhow::Result<Option<std::sync::Arc<weft::models::LayerPager>>> {
        match self.resident_layers {
            None => Ok(None),
            Some(0) => anyhow::bail!("--resident-layers must be at least 1"),
            Some(k) => Ok(Some(std::sync::Arc::new(weft::models::LayerPager::new(k)))),
        }
    }

    /// The engine configuration these options ask for.
    pub fn engine_config(&self) -> anyhow::Result<weft::EngineConfig> {
        let mut cfg = weft::EngineConfig::default();
        cfg.n_threads = self.checked()?.unwrap_or(cfg.n_threads);
        cfg.layer_pager = self.pager()?;
        cfg.kv_type = self.kv_type;
        Ok(cfg)
    }
}

/// `-c/--ctx-size`, for the commands that hold one conversation (`run`, `chat`).
#[derive(Debug, Clone, clap::Args)]
pub struct ContextArg {
    /// Longest context in tokens, prompt and output together (default: the model's training
    /// context, at most 16384). The KV cache is sized to hold it. Longer than the training
    /// context is allowed, as llama.cpp's `-c` allows it; the model's output may degrade there.
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
}

impl ContextArg {
    /// [`ThreadsArg::engine_config`] with this context length (and KV capacity) when
    /// `--ctx-size` was given.
    pub fn engine_config(&self, threads: &ThreadsArg) -> anyhow::Result<weft::EngineConfig> {
        let mut cfg = threads.engine_config()?;
        self.check()?;
        cfg.n_ctx = self.ctx_size;
        Ok(cfg)
    }

    /// Checks `--ctx-size`'s range (see [`ThreadsArg::check`]).
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(n) = self.ctx_size {
            anyhow::ensure!(n >= MIN_CTX, "--ctx-size must be at least {MIN_CTX}");
        }
        Ok(())
    }
}

/// The shortest `--ctx-size`: room for a short prompt and a few tokens.
const MIN_CTX: usize = 16;
