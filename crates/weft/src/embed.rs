//! Embeddings: one vector per text, pooled from the model's final-norm hidden states (seed 004's
//! `embed`, `embed_with`, `embed_batch`, `embed_batch_with`).
//!
//! Each text is one pass with a [`Hidden`] probe at the positions the pooling needs (the LM head
//! is skipped); a batch submits all its passes at once, so the scheduler runs many texts in one
//! model call. A text's vector is the same alone or in any batch.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kv_wait::{KvWait, KvWaiter};
use crate::probe::Hidden;

/// How the hidden states of a text's tokens become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The average over all tokens (llama.cpp's `--pooling mean`, sentence-transformers').
    #[default]
    Mean,
    /// The element-wise maximum over all tokens.
    Max,
    /// The last token's state (llama.cpp's `--pooling last`; what a causal model has read the
    /// whole text into).
    Last,
    /// The first token's state (llama.cpp's `--pooling cls`).
    Cls,
    /// No pooling: every token's state, one after the other (`tokens × n_embd` values).
    None,
}

impl std::str::FromStr for Pooling {
    type Err = Error;
    fn from_str(s: &str) -> Result<Pooling> {
        Ok(match s {
            "mean" => Pooling::Mean,
            "max" => Pooling::Max,
            "last" => Pooling::Last,
            "cls" => Pooling::Cls,
            "none" => Pooling::None,
            _ => {
                return Err(Error::Config(format!(
                    "unknown pooling {s:?} (mean, max, last, cls or none)"
                )))
            }
        })
    }
}

/// How [`Engine::embed_batch_opts`] pools and normalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedOptions {
    pub pooling: Pooling,
    /// Scale each vector (each token's, for [`Pooling::None`]) to unit L2 norm (default on).
    pub normalize: bool,
    /// When a decoder's pass finds the KV cache full because other contexts of the engine
    /// hold the pages (another thread's batch or generation), wait for them to give some
    /// back — up to 30 s without progress — rather than fail at once with the cache-full
    /// error (default on; a server with its own admission and preemption turns it off).
    pub wait_for_pages: bool,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            pooling: Pooling::Mean,
            normalize: true,
            wait_for_pages: true,
        }
    }
}

impl Engine {
    /// The embedding of `text`: mean-pooled final-norm hidden states, L2-normalized.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let a = engine.embed("A man is eating food.")?;
    /// let b = engine.embed("A man is eating a piece of bread.")?;
    /// let cosine: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    /// println!("{cosine}");
    /// # Ok(()) }
    /// ```
    pub fn embed(&self, text: &str) -> Result<Vec<f32>> {
        self.embed_with(text, Pooling::Mean)
    }

    /// [`Engine::embed`] with another pooling.
    pub fn embed_with(&self, text: &str, pooling: Pooling) -> Result<Vec<f32>> {
        let mut v = self.embed_batch_with(&[text], pooling)?;
        Ok(v.pop().unwrap_or_default())
    }

    /// The embeddings of `texts` (mean pooling, L2-normalized), computed together.
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_batch_with(texts, Pooling::Mean)
    }

    /// [`Engine::embed_batch`] with another pooling.
    pub fn embed_batch_with(&self, texts: &[&str], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
        self.embed_batch_opts(
            texts,
            EmbedOptions {
                pooling,
                ..EmbedOptions::default()
            },
        )
    }

    /// The embeddings of `texts` with the given pooling and normalization. Each text is
    /// tokenized as a fresh context's first fill (with the model's BOS if it wants one); a text
    /// with no tokens (empty, on a model without BOS) gives [`Error::Config`] naming it, one
    /// longer than the context [`Error::ContextTooLong`].
    pub fn embed_batch_opts(&self, texts: &[&str], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let inputs: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| self.tokenizer().encode(t, true, true))
            .collect();
        self.embed_tokens(&inputs, opts)
    }

    /// The embeddings of inputs given as token ids (used as they are: no BOS is added).
    pub fn embed_tokens(&self, inputs: &[Vec<u32>], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed_tokens_watched(inputs, opts, &mut |_| true)
    }

    /// [`Engine::embed_tokens`], asking `go_on` before each group of inputs with the number
    /// of inputs done before the group (and again, with the same number, before each pause
    /// while the group waits for KV pages, with [`EmbedOptions::wait_for_pages`]); `false`
    /// stops the batch there with [`Error::Cancelled`] (its KV pages are given back). What a
    /// progress bar, a server's check that its client is still there or Python's Ctrl-C hang
    /// on.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let inputs: Vec<Vec<u32>> = (0..1000)
    ///     .map(|i| engine.tokenize(&format!("sentence {i}")))
    ///     .collect();
    /// let opts = weft::EmbedOptions::default();
    /// let vectors = engine.embed_tokens_watched(&inputs, opts, &mut |done| {
    ///     eprintln!("{done} of {} done", inputs.len());
    ///     true
    /// })?;
    /// assert_eq!(vectors.len(), 1000);
    /// # Ok(()) }
    /// ```
    pub fn embed_tokens_watched(
        &self,
        inputs: &[Vec<u32>],
        opts: EmbedOptions,
        go_on: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Vec<Vec<f32>>> {
        // Texts go in groups that fit in half the KV pages free now, so a long list never
        // fills the pool (each text's pages are freed as soon as its group is done), and in
        // at most GROUP_TOKENS tokens, so that `go_on` is asked often.
        let budget = (self.kv_free_tokens() / 2).clamp(1, GROUP_TOKENS);
        let mut out = Vec::with_capacity(inputs.len());
        let mut group = Vec::new();
        let mut tokens = 0;
        for (i, ids) in inputs.iter().enumerate() {
            let n = ids.len();
            if n == 0 {
                return Err(Error::Config(format!(
                    "embedding input {i} has no tokens (an empty text: this model adds no BOS \
                     token to one)"
                )));
            }
            if n > self.n_ctx() {
                return Err(Error::ContextTooLong {
                    len: n,
                    n_ctx: self.n_ctx(),
                });
            }
            let mut ctx = self.context();
            ctx.fill_tokens(ids)?;
            // Whole pages: a text holds its partial last page too.
            let pages = n.div_ceil(weft_core::kv::PAGE_SIZE) * weft_core::kv::PAGE_SIZE;
            if !group.is_empty() && tokens + pages > budget {
                let done = out.len();
                out.extend(embed_group(&mut group, opts, done, go_on)?);
                tokens = 0;
            }
            tokens += pages;
            group.push(ctx);
        }
        let done = out.len();
        out.extend(embed_group(&mut group, opts, done, go_on)?);
        Ok(out)
    }
}

/// Tokens of the inputs one model call (an encoder's) or one group of passes (a decoder's)
/// holds at most (an input longer than this goes alone): between two groups a batch asks its
/// watcher whether to go on. Each input's vector does not depend on its group.
pub(crate) const GROUP_TOKENS: usize = 4096;

/// A model that turns texts (or token ids) into vectors: a decoder [`Engine`] (pooled
/// final-norm hidden states) or an encoder [`Embedder`](crate::Embedder). What the CLI's
/// `weft embed` and the server's `/v1/embeddings` run on.
pub trait EmbeddingModel: Send + Sync {
    /// The vectors of `texts`.
    fn embed_texts(&self, texts: &[&str], opts: EmbedOptions) -> Result<Vec<Vec<f32>>>;
    /// The vectors of inputs given as token ids.
    fn embed_ids(&self, inputs: &[Vec<u32>], opts: EmbedOptions) -> Result<Vec<Vec<f32>>>;
    /// [`EmbeddingModel::embed_ids`], asking `go_on` before each group of inputs (and while
    /// a decoder's batch waits for KV pages) with the number of inputs done before the group;
    /// `false` stops there with [`Error::Cancelled`]. Weft's models ask between groups; the
    /// default, for a model of one's own, asks once before all of them.
    fn embed_ids_watched(
        &self,
        inputs: &[Vec<u32>],
        opts: EmbedOptions,
        go_on: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Vec<Vec<f32>>> {
        match go_on(0) {
            true => self.embed_ids(inputs, opts),
            false => Err(Error::Cancelled),
        }
    }
    /// The ids the model sees for `text` (what a request's token count is).
    fn input_ids(&self, text: &str) -> Vec<u32>;
    /// Length of the pooled vectors.
    fn dimensions(&self) -> usize;
    /// The pooling the model is meant to be used with.
    fn default_pooling(&self) -> Pooling;
    /// The model's tokenizer.
    fn tokenizer(&self) -> &weft_core::tokenizer::Tokenizer;
}

impl EmbeddingModel for Engine {
    fn embed_texts(&self, texts: &[&str], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed_batch_opts(texts, opts)
    }
    fn embed_ids(&self, inputs: &[Vec<u32>], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed_tokens(inputs, opts)
    }
    fn embed_ids_watched(
        &self,
        inputs: &[Vec<u32>],
        opts: EmbedOptions,
        go_on: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Vec<Vec<f32>>> {
        self.embed_tokens_watched(inputs, opts, go_on)
    }
    fn input_ids(&self, text: &str) -> Vec<u32> {
        self.tokenizer().encode(text, true, true)
    }
    fn dimensions(&self) -> usize {
        self.info().n_embd
    }
    /// The file's `<arch>.pooling_type` (llama.cpp's: 1 mean, 2 cls, 3 last), as an embedding
    /// GGUF names it; mean for a model that names none (or one weft does not compute).
    fn default_pooling(&self) -> Pooling {
        let key = format!("{}.pooling_type", self.info().arch);
        match self.inner.file.opt_u64(&key) {
            Ok(Some(2)) => Pooling::Cls,
            Ok(Some(3)) => Pooling::Last,
            _ => Pooling::Mean,
        }
    }
    fn tokenizer(&self) -> &weft_core::tokenizer::Tokenizer {
        Engine::tokenizer(self)
    }
}

impl EmbeddingModel for crate::Embedder {
    fn embed_texts(&self, texts: &[&str], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed_batch_opts(texts, opts)
    }
    fn embed_ids(&self, inputs: &[Vec<u32>], opts: EmbedOptions) -> Result<Vec<Vec<f32>>> {
        self.embed_tokens(inputs, opts)
    }
    fn embed_ids_watched(
        &self,
        inputs: &[Vec<u32>],
        opts: EmbedOptions,
        go_on: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Vec<Vec<f32>>> {
        self.embed_tokens_watched(inputs, opts, go_on)
    }
    fn input_ids(&self, text: &str) -> Vec<u32> {
        self.tokenize(text)
    }
    fn dimensions(&self) -> usize {
        self.dim()
    }
    fn default_pooling(&self) -> Pooling {
        self.pooling()
    }
    fn tokenizer(&self) -> &weft_core::tokenizer::Tokenizer {
        crate::Embedder::tokenizer(self)
    }
}

/// Opens the model at `path` for embeddings: a GGUF decoder as an [`Engine`] (with `config`),
/// anything else (a sentence-transformers folder or its `model.safetensors`) as an
/// [`Embedder`](crate::Embedder) on `config.n_threads` threads.
pub fn open_embedding_model(
    path: &std::path::Path,
    config: crate::EngineConfig,
) -> Result<std::sync::Arc<dyn EmbeddingModel>> {
    if is_gguf(path) {
        return Ok(std::sync::Arc::new(Engine::open(path, config)?));
    }
    let embedder = crate::Embedder::open(
        path,
        crate::EmbedderConfig {
            n_threads: config.n_threads,
            ..crate::EmbedderConfig::default()
        },
    )?;
    Ok(std::sync::Arc::new(embedder))
}

/// Refuses a path that holds an encoder (a sentence-transformers folder or its
/// `model.safetensors`) where a decoder (a GGUF file or a generator's checkpoint folder) is
/// needed, with a message that says so (rather than "not a GGUF file"), and a folder without
/// the `config.json` a checkpoint needs.
pub fn ensure_decoder(path: &std::path::Path) -> Result<()> {
    let folder = path.is_dir() || path.extension().is_some_and(|e| e == "safetensors");
    if !folder || is_gguf(path) {
        return Ok(());
    }
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(std::path::Path::new("."))
    };
    if !dir.join("config.json").is_file() {
        return Err(Error::Config(format!(
            "{} has no config.json: a model folder is a Hugging Face checkpoint (config.json, tokenizer.json, model.safetensors); or pass a GGUF file",
            dir.display()
        )));
    }
    if weft_core::checkpoint::is_encoder(dir) {
        return Err(Error::Config(format!(
            "{} is an encoder model (safetensors), not a decoder: weft embeds text with it (weft::Embedder, `weft embed`), but this needs a decoder (a GGUF file or a Llama / Gemma 3 checkpoint folder)",
            path.display()
        )));
    }
    Ok(())
}

/// Whether the file at `path` is to be read as GGUF: it starts with the GGUF magic, or its
/// name ends in `.gguf` (a damaged or mistaken download then gets the GGUF reader's error,
/// not a safetensors reader's).
pub fn is_gguf(path: &std::path::Path) -> bool {
    if path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// Runs one pass per context of `group` (all submitted together), pools, and frees them;
/// first asks `go_on` with the `done` inputs before the group, as the group's waits for KV
/// pages do.
fn embed_group(
    group: &mut Vec<crate::Context>,
    opts: EmbedOptions,
    done: usize,
    go_on: &mut dyn FnMut(usize) -> bool,
) -> Result<Vec<Vec<f32>>> {
    let result = match go_on(done) {
        true => embed_group_waiting(group, opts, &mut || go_on(done)),
        false => Err(Error::Cancelled),
    };
    group.clear();
    result
}

/// [`embed_group`]: runs every context's pass; those that find the cache full (other contexts
/// of the engine, a generation or another batch, took the pages) run again once pages come
/// back (`go_on` is asked before each wait). Each context gives its pages back as soon as its
/// vector is read.
fn embed_group_waiting(
    group: &mut [crate::Context],
    opts: EmbedOptions,
    go_on: &mut dyn FnMut() -> bool,
) -> Result<Vec<Vec<f32>>> {
    let mut out: Vec<Option<Vec<f32>>> = vec![None; group.len()];
    let mut waiter = KvWaiter::default();
    loop {
        let todo: Vec<usize> = (0..group.len()).filter(|&i| out[i].is_none()).collect();
        let Some(&first) = todo.first() else { break };
        let engine = group[first].engine().clone();
        let passes = group
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| out[*i].is_none())
            .map(|(_, ctx)| embed_one(ctx, opts));
        let results = crate::block_on(futures_util::future::join_all(passes));
        let (mut progressed, mut full) = (false, None);
        for (i, r) in todo.into_iter().zip(results) {
            match r {
                Ok(v) => {
                    out[i] = Some(v);
                    group[i].evict()?;
                    progressed = true;
                }
                Err(e) if e.is_kv_full() => full = Some(e),
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = full {
            if !opts.wait_for_pages && !progressed {
                return Err(e);
            }
            match waiter.next(&engine, progressed, &e) {
                KvWait::GiveUp => return Err(e),
                KvWait::Retry => {}
                KvWait::Sleep(_) if !go_on() => return Err(Error::Cancelled),
                KvWait::Sleep(pause) => std::thread::sleep(pause),
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// One context's pass, its hidden states pooled.
async fn embed_one(ctx: &mut crate::Context, opts: EmbedOptions) -> Result<Vec<f32>> {
    let mut fwd = ctx.forward();
    let n = fwd.len();
    let indices: Vec<usize> = match opts.pooling {
        Pooling::Last => vec![n - 1],
        Pooling::Cls => vec![0],
        Pooling::Mean | Pooling::Max | Pooling::None => (0..n).collect(),
    };
    let handles: Vec<_> = indices.iter().map(|&i| fwd.probe(i, Hidden)).collect();
    let out = fwd.execute().await?;
    let rows: Vec<&[f32]> = handles
        .iter()
        .map(|&h| out.hidden(h).unwrap_or(&[]))
        .collect();
    Ok(pool(&rows, opts))
}

/// Pools token rows into one vector (or, for [`Pooling::None`], concatenates them) and
/// normalizes.
pub(crate) fn pool(rows: &[&[f32]], opts: EmbedOptions) -> Vec<f32> {
    let d = rows.first().map_or(0, |r| r.len());
    let normalize = |v: &mut [f32]| {
        let norm = v
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        if opts.normalize && norm > 0.0 {
            v.iter_mut()
                .for_each(|x| *x = (f64::from(*x) / norm) as f32);
        }
    };
    match opts.pooling {
        Pooling::None => {
            let mut out: Vec<f32> = rows.concat();
            if d > 0 {
                out.chunks_exact_mut(d).for_each(normalize);
            }
            out
        }
        Pooling::Mean => {
            let mut sum = vec![0f64; d];
            for r in rows {
                for (s, &x) in sum.iter_mut().zip(*r) {
                    *s += f64::from(x);
                }
            }
            let mut v: Vec<f32> = sum.iter().map(|s| (s / rows.len() as f64) as f32).collect();
            normalize(&mut v);
            v
        }
        Pooling::Max => {
            let mut v = vec![f32::NEG_INFINITY; d];
            for r in rows {
                for (m, &x) in v.iter_mut().zip(*r) {
                    *m = m.max(x);
                }
            }
            normalize(&mut v);
            v
        }
        Pooling::Last | Pooling::Cls => {
            let mut v = rows.first().map(|r| r.to_vec()).unwrap_or_default();
            normalize(&mut v);
            v
        }
    }
}
