//! LoRA adapters in the public API: loading, the engine's default stack, and the adapters of
//! one pass.

use std::path::Path;
use std::sync::Arc;

use weft_core::gguf::GgufFile;
use weft_core::lora::{self, AdapterSet, LoraAdapter, ZoSeed};

use crate::engine::Engine;
use crate::error::{Error, Result};

/// A loaded LoRA adapter: cheap to clone, shared by every pass that names it. The base model's
/// weights are never copied or changed; a pass with an adapter adds its low-rank delta
/// `scale · (alpha / rank) · B·(A·x)` to each adapted projection.
///
/// ```no_run
/// # fn main() -> weft::Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let pirate = engine.load_adapter("pirate.gguf".as_ref())?; // or a PEFT directory
/// let mut ctx = engine.context();
/// ctx.fill("Tell me about the sea.")?;
/// let text = weft::block_on(
///     ctx.generate(weft::Sampler::Argmax).adapter(&pirate, 1.0).max_tokens(32).collect_text(),
/// )?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Adapter(pub(crate) Arc<LoraAdapter>);

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("name", &self.0.name())
            .field("projections", &self.0.len())
            .field("max_rank", &self.0.max_rank())
            .finish()
    }
}

impl PartialEq for Adapter {
    fn eq(&self, other: &Adapter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Adapter {
    /// Where it was loaded from.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The highest rank of its projections.
    pub fn rank(&self) -> usize {
        self.0.max_rank()
    }

    /// The adapter as the engine core holds it.
    pub fn as_core(&self) -> &Arc<LoraAdapter> {
        &self.0
    }
}

/// The adapters one pass runs with (empty: the engine's stack).
#[derive(Debug, Clone, Default)]
pub(crate) struct PassAdapters {
    pub stack: Vec<(Adapter, f32)>,
    pub zo: Option<ZoSeed>,
}

impl PassAdapters {
    /// The set the runner applies: these adapters, or the engine's stack when none are named.
    pub fn resolve(&self, engine: &Engine) -> Result<Option<AdapterSet>> {
        let stack = if self.stack.is_empty() {
            engine.lora_stack()
        } else {
            self.stack.clone()
        };
        // A NaN or infinite scale would turn every logit into NaN (read as 0).
        if let Some((a, scale)) = stack.iter().find(|(_, s)| !s.is_finite()) {
            return Err(Error::Config(format!(
                "adapter {}: its scale must be a finite number, got {scale}",
                a.name()
            )));
        }
        if let Some(z) = self.zo.filter(|z| !z.sigma.is_finite()) {
            return Err(Error::Config(format!(
                "zo_seed: sigma must be a finite number, got {}",
                z.sigma
            )));
        }
        if stack.is_empty() {
            return match self.zo {
                Some(z) if z.sigma != 0.0 => Err(Error::Config(
                    "zo_seed perturbs adapter weights: the pass has no adapter".into(),
                )),
                _ => Ok(None),
            };
        }
        let set = AdapterSet {
            stack: stack.into_iter().map(|(a, s)| (a.0, s)).collect(),
            zo: self.zo,
        };
        Ok((!set.is_noop()).then_some(set))
    }
}

impl Engine {
    /// Loads a LoRA adapter for this engine's model: llama.cpp's GGUF LoRA file (what
    /// `convert_lora_to_gguf.py` writes) or a Hugging Face PEFT directory
    /// (`adapter_config.json` + `adapter_model.safetensors`). An adapter for another
    /// architecture or with shapes that do not fit the model, a damaged file or an option
    /// weft does not implement (DoRA, …) is an error naming what is wrong.
    pub fn load_adapter(&self, path: &Path) -> Result<Adapter> {
        let base = &self.inner.file;
        let adapter = if path.is_dir() {
            lora::peft::load(path, base)?
        } else {
            let file = GgufFile::open(path)?;
            lora::gguf::load(&file, base, &path.display().to_string())?
        };
        Ok(Adapter(Arc::new(adapter)))
    }

    /// Pushes `adapter` with `scale` on the engine's stack: passes that name no adapter run
    /// with the whole stack (the sum of its scaled deltas). Hot-swappable: takes effect for
    /// passes submitted afterwards.
    pub fn push_lora(&self, adapter: &Adapter, scale: f32) {
        self.stack().push((adapter.clone(), scale));
    }

    /// Removes the adapter pushed last, returning it.
    pub fn pop_lora(&self) -> Option<(Adapter, f32)> {
        self.stack().pop()
    }

    /// Empties the stack: passes that name no adapter run the base model.
    pub fn clear_loras(&self) {
        self.stack().clear();
    }

    /// The adapters on the stack with their scales, bottom first.
    pub fn lora_stack(&self) -> Vec<(Adapter, f32)> {
        self.stack().clone()
    }

    fn stack(&self) -> std::sync::MutexGuard<'_, Vec<(Adapter, f32)>> {
        self.inner
            .lora_stack
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}
