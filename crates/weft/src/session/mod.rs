//! Sessions that outlive the process: a context's snapshot (tokens, KV pages, positions,
//! pending tokens, random state and an in-flight generator) written as bytes, and resumed on
//! any engine running the same model (llama.cpp's session files, seed 004's
//! `snapshot` / `resume`).

pub(crate) mod fingerprint;
mod format;

use std::io::{Read, Write};

use weft_core::sampling::Rng;

use crate::context::Context;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::scheduler::Command;

/// The snapshot format version this weft writes; it reads every version up to this one.
pub const SNAPSHOT_VERSION: u32 = format::VERSION;
use format::Saved;

impl Engine {
    /// The model fingerprint: the SHA-256 of the whole GGUF file, `sha256:<hex>`. Computed on
    /// first use (a moment for a few hundred megabytes) and cached next to the model file
    /// when the engine was opened from a path.
    pub fn fingerprint(&self) -> &str {
        let inner = &self.inner;
        inner
            .fingerprint
            .get_or_init(|| fingerprint::fingerprint(&inner.file, inner.path.as_deref()))
    }

    /// A context continuing exactly where the snapshot `bytes` was taken (see
    /// [`Context::snapshot`]): same tokens, KV pages, positions, pending tokens and random
    /// state; a generator that was in flight is taken up with [`Context::resume_generator`].
    ///
    /// Errors: [`Error::ModelFingerprintMismatch`] for a snapshot of another model,
    /// [`Error::SnapshotVersion`] for one written by a newer weft, [`Error::SnapshotCorrupt`]
    /// for anything truncated or damaged, [`Error::Config`] for one taken with another KV
    /// type ([`EngineConfig::kv_type`](crate::EngineConfig::kv_type)),
    /// [`Error::ContextTooLong`] when it does not fit this
    /// engine's context length, and the KV cache's error when its pages do not fit the pool.
    /// On every error nothing is left allocated.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("A long system prompt, computed once.")?;
    /// weft::block_on(ctx.flush_logits())?;
    /// std::fs::write("session.weft", ctx.snapshot()?)?;
    ///
    /// // Later, in another process:
    /// let mut ctx = engine.resume(&std::fs::read("session.weft")?)?;
    /// ctx.fill(" And a question.")?;
    /// # Ok(()) }
    /// ```
    pub fn resume(&self, bytes: &[u8]) -> Result<Context> {
        let saved = format::decode(bytes)?;
        if saved.fingerprint != self.fingerprint() {
            return Err(Error::ModelFingerprintMismatch {
                snapshot: format!("{} {}", saved.arch, short(&saved.fingerprint)),
                model: format!("{} {}", self.info().arch, short(self.fingerprint())),
            });
        }
        let ours = self.inner.kv_layout.kv_type;
        if saved.layout.kv_type != ours {
            // A sound snapshot for another setting, not a damaged one.
            return Err(Error::Config(format!(
                "the snapshot's KV cache stores {}, this engine's {ours} (open the engine with the same KV type: `kv_type` in EngineConfig, `--kv-type` in the CLI)",
                saved.layout.kv_type
            )));
        }
        if saved.layout != self.inner.kv_layout {
            return Err(Error::SnapshotCorrupt {
                reason: "its KV cache layout differs from this model's".into(),
            });
        }
        self.check_ids(saved.tokens.iter().chain(&saved.pending).copied())?;
        let n_ctx = self.n_ctx();
        let len = saved.tokens.len() + saved.pending.len();
        let top = saved
            .kv
            .positions
            .iter()
            .max()
            .map_or(0, |&p| p as usize + 1);
        if len > n_ctx || top > n_ctx {
            return Err(Error::ContextTooLong {
                len: len.max(top),
                n_ctx,
            });
        }
        let Saved {
            tokens,
            kv,
            pending,
            rng,
            generator,
            custom_attention,
            ..
        } = saved;
        // A new context: if the import fails, dropping it frees its (empty) sequence.
        let mut ctx = self.context();
        let positions = kv.positions.clone();
        let (reply, done) = std::sync::mpsc::sync_channel(1);
        self.inner.shared.command(Command::Import {
            seq: ctx.seq(),
            state: Box::new(kv),
            reply,
        });
        done.recv().unwrap_or(Err(Error::EngineStopped))?;
        ctx.restore_imported(
            tokens,
            positions,
            pending,
            Rng::from_state(rng),
            generator,
            custom_attention,
        );
        Ok(ctx)
    }

    /// [`Engine::resume`] from a reader (a file, a socket).
    pub fn resume_from(&self, mut r: impl Read) -> Result<Context> {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes)?;
        self.resume(&bytes)
    }
}

/// The first hex digits of a fingerprint, for messages.
fn short(fp: &str) -> &str {
    fp.get(..19).unwrap_or(fp)
}

impl Context {
    /// The context as a self-describing, versioned byte string: its tokens, the KV pages it
    /// holds (keys and values as stored, f16) and their positions, the pending tokens, the
    /// random state, and the model's fingerprint. [`Engine::resume`] turns it back into a
    /// context, in this process or another one, on any engine that runs the same model file.
    /// Taking a snapshot changes nothing; it waits for a pass still in flight.
    ///
    /// It records the keys and values, not which LoRA adapters computed them: resume it on an
    /// engine with the same adapters on its stack to continue as the context would have.
    ///
    /// The format (a checksummed envelope around a GGUF body) is described in
    /// `crates/weft/src/session/format.rs`; weft reads every earlier version of it.
    /// See [`Generator::snapshot`](crate::Generator::snapshot) to save a generation in flight.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("Once upon a time")?;
    /// let first = weft::block_on(ctx.generate(weft::Sampler::Argmax).max_tokens(20).collect_text())?;
    /// let bytes = ctx.snapshot()?;
    /// drop((ctx, engine));
    ///
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.resume(&bytes)?;
    /// let more = weft::block_on(ctx.generate(weft::Sampler::Argmax).max_tokens(20).collect_text())?;
    /// println!("{first}{more}");
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&mut self) -> Result<Vec<u8>> {
        self.snapshot_with(None, &[])
    }

    /// [`Context::snapshot`] written to `w`.
    pub fn snapshot_to(&mut self, mut w: impl Write) -> Result<()> {
        let bytes = self.snapshot()?;
        w.write_all(&bytes)?;
        Ok(w.flush()?)
    }

    /// A snapshot holding `generator` (JSON) and with `more_pending` after the pending tokens.
    pub(crate) fn snapshot_with(
        &mut self,
        generator: Option<String>,
        more_pending: &[u32],
    ) -> Result<Vec<u8>> {
        self.settle();
        if self.has_vectors_or_bias() {
            return Err(Error::Config(
                "snapshot: the context holds input vectors or an attention bias \
                 (fill_embeds / input_embeds), which snapshots do not record"
                    .into(),
            ));
        }
        let (reply, done) = std::sync::mpsc::sync_channel(1);
        self.engine().inner.shared.command(Command::Export {
            seq: self.seq(),
            reply,
        });
        let kv = done.recv().unwrap_or(Err(Error::EngineStopped))?;
        if kv.positions.len() != self.len() {
            return Err(Error::Config(format!(
                "snapshot: the KV cache holds {} tokens, the context {}",
                kv.positions.len(),
                self.len()
            )));
        }
        let mut pending = self.pending().to_vec();
        pending.extend_from_slice(more_pending);
        let saved = Saved {
            fingerprint: self.engine().fingerprint().to_string(),
            arch: self.engine().info().arch.to_string(),
            layout: self.engine().inner.kv_layout.clone(),
            tokens: self.tokens().to_vec(),
            kv,
            pending,
            rng: self.rng().state(),
            generator,
            custom_attention: self.ran_custom_attention(),
        };
        Ok(format::encode(&saved))
    }
}
