//! LoRA adapters: low-rank deltas on a base model's projections, applied per batch row.
//!
//! An adapter holds, for some projections `W` (rows = output features, cols = input features),
//! two small matrices `A` (`rank × in`) and `B` (`out × rank`) and a scale `alpha / rank`. A row
//! `x` of a pass with adapter stack `[(a₁, s₁), (a₂, s₂), …]` computes
//!
//! ```text
//! y = W·x + Σᵢ sᵢ · (alphaᵢ / rankᵢ) · Bᵢ·(Aᵢ·x)
//! ```
//!
//! The base matmul runs once for all rows; each row then adds its own adapters' deltas, so rows
//! with different adapters (or none) share one model call and a row's result never depends on
//! the others (Punica / S-LoRA style). Adapters are read from llama.cpp's GGUF LoRA files
//! ([`gguf`]) or Hugging Face PEFT directories ([`peft`]); the base weights are never copied or
//! changed.

mod apply;
pub mod gguf;
pub mod peft;
pub mod zo;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use apply::apply;
pub(crate) use apply::pair_from;

/// The projections an adapter can target, named as in a GGUF model (`blk.N.<name>.weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    /// Every projection, in key order.
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The GGUF tensor name part (`attn_q`, …, `ffn_down`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// The Hugging Face module name (`q_proj`, …, `down_proj`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// The projection a GGUF weight name `blk.N.<name>.weight` belongs to, with its layer.
    pub fn parse_gguf(tensor: &str) -> Option<(usize, Proj)> {
        let rest = tensor.strip_prefix("blk.")?.strip_suffix(".weight")?;
        let (layer, name) = rest.split_once('.')?;
        let proj = Proj::ALL.into_iter().find(|p| p.gguf_name() == name)?;
        Some((layer.parse().ok()?, proj))
    }
}

/// Identifies a projection of a model: its layer and kind (an adapter's tensors and a
/// model's [`Linear`](crate::models::Linear)s meet on this key).
pub fn key(layer: usize, proj: Proj) -> u32 {
    (layer as u32) * 8 + proj as u32
}

/// One adapted projection: `A` (`rank × in`, row-major) and `B` transposed (`rank × out`,
/// row-major, so adding `B·t` streams contiguous rows), stored in f16: a decode step reads every
/// adapter weight once, and half the bytes is what keeps an adapter cheap.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    pub rank: usize,
    pub n_in: usize,
    pub n_out: usize,
    pub a: Vec<half::f16>,
    pub bt: Vec<half::f16>,
    /// `alpha / rank` (`alpha / √rank` for rsLoRA; 1 when the adapter gives no alpha).
    pub scale: f32,
}

/// A loaded adapter: its pairs by projection key.
#[derive(Debug)]
pub struct LoraAdapter {
    id: u64,
    name: String,
    arch: String,
    pairs: HashMap<u32, LoraPair>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    /// An adapter for architecture `arch` from its pairs (keyed by [`key`]).
    pub fn new(
        name: impl Into<String>,
        arch: impl Into<String>,
        pairs: HashMap<u32, LoraPair>,
    ) -> LoraAdapter {
        LoraAdapter {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
            arch: arch.into(),
            pairs,
        }
    }

    /// The architecture of the base model it was made for.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// A number unique to this adapter in the process (its identity for the prefix cache).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where it was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pair for a projection key, if the adapter targets it.
    pub fn pair(&self, key: u32) -> Option<&LoraPair> {
        self.pairs.get(&key)
    }

    /// Number of adapted projections.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether it adapts nothing.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The highest rank of its pairs.
    pub fn max_rank(&self) -> usize {
        self.pairs.values().map(|p| p.rank).max().unwrap_or(0)
    }

    /// Checks that it fits the model in `base`: the same architecture, and every projection it
    /// adapts there with its shape. Loading checks this against the model it was loaded for;
    /// a pass on another model (an adapter shared between engines) checks it again, since a
    /// delta of the wrong size would run past the model's rows.
    pub fn check_fits(&self, base: &crate::gguf::GgufFile) -> crate::error::Result<()> {
        let base_arch = base.architecture()?;
        if self.arch != base_arch {
            return Err(crate::error::Error::BadAdapter {
                reason: format!(
                    "{} is an adapter for {} models, the base model is {base_arch}",
                    self.name, self.arch
                ),
            });
        }
        for (&key, pair) in &self.pairs {
            let (layer, proj) = (key as usize / 8, Proj::ALL[key as usize % 8]);
            let target = format!("blk.{layer}.{}.weight", proj.gguf_name());
            let (n_in, n_out) = gguf::base_shape(base, &target, &self.name)?;
            if (n_in, n_out) != (pair.n_in, pair.n_out) {
                return Err(crate::error::Error::BadAdapter {
                    reason: format!(
                        "{}: its {target} delta is {} × {}, the base tensor is {n_out} × {n_in}",
                        self.name, pair.n_out, pair.n_in
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A zeroth-order perturbation: the adapter weights `θ + sigma · ε(seed)` (see [`zo`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZoSeed {
    pub seed: u64,
    pub sigma: f32,
}

/// What one pass runs with: a stack of adapters with their scales, and maybe a perturbation.
#[derive(Debug, Clone, Default)]
pub struct AdapterSet {
    pub stack: Vec<(Arc<LoraAdapter>, f32)>,
    pub zo: Option<ZoSeed>,
}

impl AdapterSet {
    /// Whether it changes nothing (no adapter with a non-zero scale, no perturbation).
    pub fn is_noop(&self) -> bool {
        self.stack.iter().all(|(_, s)| *s == 0.0) && self.zo.is_none_or(|z| z.sigma == 0.0)
    }

    /// A hash of the adapters (by id) and scales: pages written under different sets are
    /// different pages for the prefix cache. 0 for a no-op set.
    pub fn identity(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        if self.is_noop() {
            return 0;
        }
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new();
        for (a, s) in &self.stack {
            (a.id(), s.to_bits()).hash(&mut h);
        }
        if let Some(z) = self.zo {
            (z.seed, z.sigma.to_bits()).hash(&mut h);
        }
        h.finish() | 1
    }
}
