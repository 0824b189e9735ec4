//! The layer pager: at most K transformer blocks' weights resident, for models larger than
//! memory (seed 004's `LayerPager` / `PagerSource`).
//!
//! A paged model keeps its embeddings, output projection and norms resident and loads each
//! block when a forward pass reaches it: the block's tensors are read (from the mapped model
//! file, or from a user [`PagerSource`]) and repacked exactly as at a normal load, so outputs
//! are bit-identical with and without paging. A forward pass walks every block in order, so
//! when K blocks are resident the most recently used one is dropped first (the one whose next
//! use is furthest away): K − 1 blocks stay resident from pass to pass and each pass loads at
//! most the other n − K + 1 (dropping the least recently used block would drop each block just
//! before the next pass needs it, and reload all n every pass). Paging trades speed for
//! memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Loader;
use crate::error::Result;
use crate::gguf::TensorInfo;

/// Where a paged model reads its blocks' tensors from, instead of the mapped model file (a
/// second disk, a network store, a decrypting reader…).
///
/// ```
/// use weft_core::gguf::{GgufFile, TensorInfo};
/// use weft_core::models::PagerSource;
///
/// /// Reads tensors from a model file on every call, counting the reads.
/// struct Counting(GgufFile, std::sync::atomic::AtomicUsize);
/// impl PagerSource for Counting {
///     fn read(&self, info: &TensorInfo) -> weft_core::Result<Vec<u8>> {
///         self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         Ok(self.0.tensor_data(info).to_vec())
///     }
/// }
/// ```
pub trait PagerSource: Send + Sync {
    /// The bytes of the tensor `info` describes (named, typed and shaped as in the model
    /// file), in the GGUF data layout: `info.n_bytes` bytes.
    fn read(&self, info: &TensorInfo) -> Result<Vec<u8>>;
}

/// What a pager did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagerStats {
    /// Blocks loaded (read and repacked), the first load of each included.
    pub loads: u64,
    /// Blocks dropped to make room.
    pub evictions: u64,
}

/// The policy of a paged model: how many blocks stay resident and where their tensors come
/// from. Give it to the runner or engine configuration; one pager serves one model.
pub struct LayerPager {
    resident: usize,
    source: Option<Arc<dyn PagerSource>>,
    loads: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for LayerPager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerPager")
            .field("resident_layers", &self.resident)
            .field("custom_source", &self.source.is_some())
            .finish()
    }
}

/// Pagers compare by identity: two configurations are equal when they share one pager.
impl PartialEq for LayerPager {
    fn eq(&self, other: &LayerPager) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for LayerPager {}

impl LayerPager {
    /// A pager keeping at most `resident_layers` blocks (at least 1) and reading the others
    /// from the mapped model file.
    pub fn new(resident_layers: usize) -> LayerPager {
        LayerPager {
            resident: resident_layers.max(1),
            source: None,
            loads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// A pager reading the blocks' tensors from `source`.
    pub fn with_source(resident_layers: usize, source: Arc<dyn PagerSource>) -> LayerPager {
        LayerPager {
            source: Some(source),
            ..LayerPager::new(resident_layers)
        }
    }

    /// How many blocks stay resident at most.
    pub fn resident_layers(&self) -> usize {
        self.resident
    }

    /// Loads and evictions so far.
    pub fn stats(&self) -> PagerStats {
        PagerStats {
            loads: self.loads.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn source(&self) -> Option<&Arc<dyn PagerSource>> {
        self.source.as_ref()
    }
}

type LoadBlock<B> = Box<dyn Fn(usize) -> Result<B> + Send + Sync>;

/// A model's transformer blocks: all resident, or paged.
pub(crate) struct Blocks<B> {
    paged: Option<Paged<B>>,
    resident: Vec<Arc<B>>,
}

struct Paged<B> {
    pager: Arc<LayerPager>,
    load: LoadBlock<B>,
    state: Mutex<Resident<B>>,
}

/// Each block, when resident, and the resident ones from least to most recently used.
struct Resident<B> {
    slots: Vec<Option<Arc<B>>>,
    lru: VecDeque<usize>,
}

impl<B> Blocks<B> {
    /// `n` blocks made by `load`: all loaded now, or with `pager`, loaded on demand (each is
    /// loaded once here, so a bad tensor is an error now rather than in a forward pass).
    pub fn load(
        n: usize,
        pager: Option<Arc<LayerPager>>,
        load: impl Fn(usize) -> Result<B> + Send + Sync + 'static,
    ) -> Result<Blocks<B>> {
        let Some(pager) = pager else {
            return Ok(Blocks {
                paged: None,
                resident: (0..n)
                    .map(|i| load(i).map(Arc::new))
                    .collect::<Result<_>>()?,
            });
        };
        let blocks = Blocks {
            paged: Some(Paged {
                pager,
                load: Box::new(load),
                state: Mutex::new(Resident {
                    slots: Vec::new(),
                    lru: VecDeque::new(),
                }),
            }),
            resident: Vec::new(),
        };
        // A slot for each block as it loads, not all `n` up front: the count comes from the
        // file, and a crafted one (billions) must end at its first missing block's error.
        for i in 0..n {
            if let Some(p) = &blocks.paged {
                let mut guard = p.state.lock().unwrap_or_else(|e| e.into_inner());
                guard.slots.push(None);
            }
            blocks.get(i)?;
        }
        Ok(blocks)
    }

    /// `n` blocks read by `load(loader, cfg, i)`: through the pager's [`PagerSource`] when it
    /// has one, else from `l`'s model file.
    pub fn load_from<C>(
        l: &Loader,
        cfg: &C,
        n: usize,
        pager: Option<Arc<LayerPager>>,
        load: fn(&Loader, &C, usize) -> Result<B>,
    ) -> Result<Blocks<B>>
    where
        B: 'static,
        C: Clone + Send + Sync + 'static,
    {
        let loader = Loader {
            source: pager.as_ref().and_then(|p| p.source().cloned()),
            // A pager loads its layers beside running passes: on the loading thread alone.
            repack_threads: if pager.is_some() { 1 } else { l.repack_threads },
            ..l.clone()
        };
        let cfg = cfg.clone();
        Blocks::load(n, pager, move |i| load(&loader, &cfg, i))
    }

    /// Block `i`, loading it (and dropping the most recently used one) if needed.
    pub fn get(&self, i: usize) -> Result<Arc<B>> {
        let Some(p) = &self.paged else {
            return Ok(self.resident[i].clone());
        };
        let mut guard = p.state.lock().unwrap_or_else(|e| e.into_inner());
        let Resident { slots, lru } = &mut *guard;
        if let Some(b) = &slots[i] {
            let b = b.clone();
            lru.retain(|&j| j != i);
            lru.push_back(i);
            return Ok(b);
        }
        // Make room first, so at most K blocks are ever held by the pager.
        while lru.len() >= p.pager.resident {
            let Some(old) = lru.pop_back() else { break };
            slots[old] = None;
            p.pager.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let b = Arc::new((p.load)(i)?);
        p.pager.loads.fetch_add(1, Ordering::Relaxed);
        slots[i] = Some(b.clone());
        lru.push_back(i);
        Ok(b)
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        match &self.paged {
            Some(p) => p
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .slots
                .len(),
            None => self.resident.len(),
        }
    }
}
