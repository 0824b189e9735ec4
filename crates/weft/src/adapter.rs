//! LoRA adapters in the public API: loading, the engine's default stack, and the adapters of
//! one pass.

use std::path::Path;
use std::sync::{Arc, Weak};

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
pub struct Adapter {
    core: Arc<LoraAdapter>,
    /// The model it was loaded for, and checked against then (a weak pointer: it keeps no
    /// model alive, and its address is never another model's while it exists).
    loaded_for: Weak<GgufFile>,
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("name", &self.core.name())
            .field("projections", &self.core.len())
            .field("max_rank", &self.core.max_rank())
            .finish()
    }
}

impl PartialEq for Adapter {
    fn eq(&self, other: &Adapter) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }
}

impl Adapter {
    /// Where it was loaded from.
    pub fn name(&self) -> &str {
        self.core.name()
    }

    /// The highest rank of its projections.
    pub fn rank(&self) -> usize {
        self.core.max_rank()
    }

    /// The adapter as the engine core holds it.
    pub fn as_core(&self) -> &Arc<LoraAdapter> {
        &self.core
    }

    /// Checks that it fits `engine`'s model: at once for the engine that loaded it, and
    /// projection by projection for another (an adapter loaded by one engine and used on a
    /// second, which may hold another model).
    fn check_fits(&self, engine: &Engine) -> Result<()> {
        let model = &engine.inner.file;
        if std::ptr::eq(self.loaded_for.as_ptr(), Arc::as_ptr(model)) {
            return Ok(());
        }
        Ok(self.core.check_fits(model)?)
    }
}

/// A scale an adapter can run with: a NaN or infinite one would turn every logit into NaN.
fn check_scale(adapter: &Adapter, scale: f32) -> Result<()> {
    if scale.is_finite() {
        return Ok(());
    }
    Err(Error::Config(format!(
        "adapter {}: its scale must be a finite number, got {scale}",
        adapter.name()
    )))
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
        for (adapter, scale) in &stack {
            check_scale(adapter, *scale)?;
            adapter.check_fits(engine)?;
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
            stack: stack.into_iter().map(|(a, s)| (a.core, s)).collect(),
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
        Ok(Adapter {
            core: Arc::new(adapter),
            loaded_for: Arc::downgrade(base),
        })
    }

    /// Pushes `adapter` with `scale` on the engine's stack: passes that name no adapter run
    /// with the whole stack (the sum of its scaled deltas). Hot-swappable: takes effect for
    /// passes submitted afterwards. A scale that is not a finite number, or an adapter that
    /// does not fit this engine's model (one loaded by an engine of another model), is an
    /// error, and the stack stays as it was.
    pub fn push_lora(&self, adapter: &Adapter, scale: f32) -> Result<()> {
        check_scale(adapter, scale)?;
        adapter.check_fits(self)?;
        self.stack().push((adapter.clone(), scale));
        Ok(())
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
