//! The paged KV cache: keys and values of every live sequence, in fixed-size pages.
//!
//! Layers are gathered in *groups* that share a page table: a Llama model has one group; Gemma 3
//! has a full-attention group (its global layers) and a sliding-window group (its local layers),
//! whose pages are released once they fall far enough behind the window. Each sequence holds one
//! page table per group mapping its slots (tokens in the order they were written) to pages.
//!
//! Key design decision (after vLLM's block pool): the cache is passed into the model, never
//! owned by a layer, and pages are reference-counted so a fork shares every full page with its
//! parent and copies only the partial last one; a write to a shared page copies it first.
//!
//! Storage is f16, as llama.cpp's default KV cache, or Q8_0 (ggml's 8-bit blocks, half the
//! bytes; [`KvType`]), chosen per cache. A layer's keys (and its values) are stored head by
//! head, each head's pages in page order (`[kv_head][page][slot][row]`, a row being `head_dim`
//! values in that type; `head_page`). The pages a sequence is given (lowest free first) mostly
//! follow one another, so a decode reads each head's keys and values as two long runs that the
//! hardware prefetchers follow. With the heads side by side within a page
//! (`[page][kv_head]`), SmolLM2's decode read a 4 KiB run out of every 12 KiB, and its
//! attention at depth 4,096 took 20–35% longer on one thread and 5–25% on two (AMD EPYC Zen 5).

mod page_pool;
mod prefix;
mod storage;
mod transfer;

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::kernels::attention as kernels;
pub use crate::kernels::attention::KvType;
pub use page_pool::{PageId, PagePool};
pub use prefix::PrefixStats;
use storage::Storage;
pub use transfer::{GroupState, SeqState};

/// Tokens per page.
pub const PAGE_SIZE: usize = kernels::PAGE_SLOTS;

/// Where KV head `head`'s rows of page `page` lie in one layer's key (or value) storage of
/// `n_pages` pages, `head_bytes` bytes (`PAGE_SIZE` rows) each: heads outermost, then pages.
fn head_page(n_pages: usize, page: usize, head: usize, head_bytes: usize) -> Range<usize> {
    let at = (head * n_pages + page) * head_bytes;
    at..at + head_bytes
}

/// Identifies a sequence in a [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Which layers share a page table, and how far back they look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// The model layers stored in this group.
    pub layers: Vec<usize>,
    /// Sliding window in positions (`None`: full attention).
    pub window: Option<usize>,
}

/// The shape of a model's KV cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub groups: Vec<GroupSpec>,
    /// How keys and values are stored.
    pub kv_type: KvType,
}

impl KvLayout {
    /// Bytes of one stored key (or value) row: `head_dim` values as [`KvLayout::kv_type`].
    pub fn row_bytes(&self) -> usize {
        self.kv_type.row_bytes(self.head_dim)
    }

    /// Bytes of one page of one layer's keys (or values): every KV head's [`PAGE_SIZE`] rows
    /// (a KV head's keys stored as [`crate::kernels::attention`] lays out a key page).
    pub fn page_bytes(&self) -> usize {
        PAGE_SIZE * self.n_kv_heads * self.row_bytes()
    }
}

/// One group's pages: a pool and, per layer, the key and value storage as bytes (zero-filled
/// by the allocator, so the OS maps it lazily and unused capacity costs no memory; aligned to
/// a memory page).
#[derive(Debug)]
struct Group {
    window: Option<usize>,
    pool: PagePool,
    keys: Vec<Storage>,
    values: Vec<Storage>,
}

/// One sequence: the position of each slot and one page table per group.
#[derive(Debug, Clone, Default)]
struct Sequence {
    positions: Vec<u32>,
    /// `tables[g][i]`: page of slots `i*PAGE_SIZE..(i+1)*PAGE_SIZE` in group `g`; `None` once
    /// a sliding-window group has released it.
    tables: Vec<Vec<Option<PageId>>>,
    max_pos: Option<u32>,
    /// Token id of each slot, while every slot was written by a plain causal pass (see
    /// [`KvCache::publish`]); and the prefix-cache hash of each full page so far.
    tokens: Vec<u32>,
    hashes: Vec<u64>,
    /// Some slot was written under a custom mask or position: its pages are never shared.
    unshareable: bool,
    /// The prefix-cache salt its pages were written under (see [`KvCache::publish`]).
    salt: u64,
}

/// Page usage of one group, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageUsage {
    pub total: usize,
    pub free: usize,
}

/// The KV cache of one model.
#[derive(Debug)]
pub struct KvCache {
    layout: KvLayout,
    groups: Vec<Group>,
    /// For each model layer: (group, index of the layer within the group).
    layer_slot: Vec<(usize, usize)>,
    seqs: HashMap<SeqId, Sequence>,
    next_id: u64,
    prefix: prefix::PrefixCache,
}

impl KvCache {
    /// A cache with room for `max_tokens` tokens in each group. Storage is zero-initialized
    /// lazily by the OS, so unused capacity costs address space, not memory.
    ///
    /// Errors when the storage (pages × heads × row bytes, per layer) cannot be allocated, or
    /// when the layout's [`KvType`] cannot hold rows of its head size.
    pub fn new(layout: KvLayout, max_tokens: usize) -> Result<KvCache> {
        if !layout.kv_type.fits(layout.head_dim) {
            return Err(Error::KvTypeUnfit {
                kv_type: layout.kv_type.name(),
                head_dim: layout.head_dim,
            });
        }
        let n_pages = max_tokens.div_ceil(PAGE_SIZE).max(1);
        let elems = PAGE_SIZE
            .checked_mul(layout.n_kv_heads)
            .and_then(|e| e.checked_mul(layout.row_bytes()))
            .and_then(|e| e.checked_mul(n_pages))
            .filter(|&e| e <= isize::MAX as usize / 2)
            .ok_or(Error::KvTooLarge { max_tokens })?;
        let alloc = || Storage::zeroed(elems).ok_or(Error::KvTooLarge { max_tokens });
        let mut layer_slot = vec![(0, 0); layout.n_layers];
        let mut groups = Vec::with_capacity(layout.groups.len());
        for (g, spec) in layout.groups.iter().enumerate() {
            for (i, &l) in spec.layers.iter().enumerate() {
                if let Some(slot) = layer_slot.get_mut(l) {
                    *slot = (g, i);
                }
            }
            let storage = || {
                (0..spec.layers.len())
                    .map(|_| alloc())
                    .collect::<Result<Vec<_>>>()
            };
            // The storage first: it fails cleanly on a size no machine holds, where the
            // pool's bookkeeping (8 bytes a page) would be the first to exhaust memory.
            let (keys, values) = (storage()?, storage()?);
            groups.push(Group {
                window: spec.window,
                pool: PagePool::new(n_pages).ok_or(Error::KvTooLarge { max_tokens })?,
                keys,
                values,
            });
        }
        Ok(KvCache {
            layout,
            groups,
            layer_slot,
            seqs: HashMap::new(),
            next_id: 0,
            prefix: prefix::PrefixCache::default(),
        })
    }

    /// How many tokens the cache holds over all sequences: the size asked for, rounded up
    /// to whole pages.
    pub fn capacity(&self) -> usize {
        self.groups.first().map_or(0, |g| g.pool.n_pages()) * PAGE_SIZE
    }

    /// The cache's shape.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Starts an empty sequence (under an id no live sequence has).
    pub fn new_sequence(&mut self) -> SeqId {
        let id = self.free_id();
        let seq = Sequence {
            tables: vec![Vec::new(); self.groups.len()],
            ..Sequence::default()
        };
        self.seqs.insert(id, seq);
        id
    }

    /// Whether `seq` is live.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    fn seq(&self, seq: SeqId) -> Result<&Sequence> {
        self.seqs
            .get(&seq)
            .ok_or(Error::UnknownSequence { seq: seq.0 })
    }

    /// Number of slots (tokens) written for `seq`.
    pub fn len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.seq(seq)?.positions.len())
    }

    /// The position of every slot of `seq`.
    pub fn positions(&self, seq: SeqId) -> Result<&[u32]> {
        Ok(&self.seq(seq)?.positions)
    }

    /// Drops a sequence and releases its pages.
    pub fn free_sequence(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            for (g, table) in s.tables.iter().enumerate() {
                for page in table.iter().flatten() {
                    self.groups[g].pool.release(*page);
                }
            }
        }
    }

    /// Page usage per group.
    /// Page usage per group. Pages only the prefix cache holds count as free: the pool
    /// takes them back when it needs room.
    pub fn usage(&self) -> Vec<PageUsage> {
        let cached = self.evictable();
        self.groups
            .iter()
            .map(|g| PageUsage {
                total: g.pool.n_pages(),
                free: g.pool.n_free() + cached,
            })
            .collect()
    }

    /// Appends slots for `positions` to `seq`, allocating pages (and copying a shared last page
    /// before it is written). Returns the index of the first new slot. On error nothing changes.
    pub fn append(&mut self, seq: SeqId, positions: &[u32]) -> Result<usize> {
        let s = self
            .seqs
            .get(&seq)
            .ok_or(Error::UnknownSequence { seq: seq.0 })?;
        let start = s.positions.len();
        if positions.is_empty() {
            // Nothing will be written: a shared last page stays shared.
            return Ok(start);
        }
        let end = start + positions.len();
        // A token placed behind the highest position so far (custom positions) would see the
        // keys within its window: none of them may lie in a page a sliding-window group
        // released (attention would skip it as empty, silently).
        if let Some(low) = positions.iter().copied().min() {
            if s.max_pos.is_some_and(|m| low <= m) {
                for (g, group) in self.groups.iter().enumerate() {
                    let Some(window) = group.window else { continue };
                    let released_needed = s.tables[g].iter().enumerate().any(|(i, p)| {
                        p.is_none()
                            && s.positions[i * PAGE_SIZE..((i + 1) * PAGE_SIZE).min(start)]
                                .iter()
                                .any(|&q| u64::from(q) + window as u64 > u64::from(low))
                    });
                    if released_needed {
                        return Err(Error::PositionBehindWindow {
                            seq: seq.0,
                            pos: low,
                        });
                    }
                }
            }
        }
        // Pages needed in each group: new pages plus a copy of a shared partial last page.
        let needed: Vec<usize> = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                let table = &s.tables[g];
                let new_pages = end.div_ceil(PAGE_SIZE).saturating_sub(table.len());
                let cow = start % PAGE_SIZE != 0
                    && table
                        .last()
                        .and_then(|p| *p)
                        .is_some_and(|p| group.pool.refcount(p) > 1);
                new_pages + usize::from(cow)
            })
            .collect();
        // Room comes from the free list, then from pages only the prefix cache holds.
        self.make_room(&needed);
        for (group, &needed) in self.groups.iter().zip(&needed) {
            if needed > group.pool.n_free() {
                return Err(Error::KvCacheFull {
                    needed_pages: needed,
                    free_pages: group.pool.n_free(),
                });
            }
        }
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(Error::UnknownSequence { seq: seq.0 })?;
        let n_heads = self.layout.n_kv_heads;
        for (g, group) in self.groups.iter_mut().enumerate() {
            let table = &mut s.tables[g];
            if start % PAGE_SIZE != 0 {
                if let Some(Some(last)) = table.last_mut() {
                    if group.pool.refcount(*last) > 1 {
                        *last = group.copy_page(*last, n_heads)?;
                    }
                }
            }
            while table.len() < end.div_ceil(PAGE_SIZE) {
                let page = group.pool.allocate().ok_or(Error::KvCacheFull {
                    needed_pages: 1,
                    free_pages: 0,
                })?;
                table.push(Some(page));
            }
        }
        s.positions.extend_from_slice(positions);
        let top = positions.iter().copied().max();
        s.max_pos = s.max_pos.max(top);
        Ok(start)
    }

    /// Releases sliding-window pages that lie more than two windows behind the highest position
    /// of `seq`. The extra window of slack lets a sequence rewind (speculative decoding, retries)
    /// by up to one window without losing keys it still needs. Call it once the slots appended
    /// have been written (the runner does, after a successful forward pass).
    pub fn release_behind_window(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let Some(max_pos) = s.max_pos else { return };
        for (g, group) in self.groups.iter_mut().enumerate() {
            let Some(window) = group.window else { continue };
            let horizon = u64::from(max_pos).saturating_sub(2 * window as u64);
            for (i, slot) in s.tables[g].iter_mut().enumerate() {
                let Some(page) = *slot else { continue };
                let end = ((i + 1) * PAGE_SIZE).min(s.positions.len());
                if end == (i + 1) * PAGE_SIZE
                    && s.positions[i * PAGE_SIZE..end]
                        .iter()
                        .all(|&p| u64::from(p) < horizon)
                {
                    group.pool.release(page);
                    *slot = None;
                }
            }
        }
    }

    /// Shortens `seq` to its first `n` slots, releasing the pages past them.
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.rewind(seq, n, false)
    }

    /// [`KvCache::truncate`] for running the first dropped slot again (a generator's last
    /// token, for its logits; the token after the drafts a speculative step accepted): the
    /// keys a query at that slot's position sees must still be there, where `truncate` asks
    /// for those the last kept slot's query saw (so that it can run again in turn).
    pub fn truncate_to_rerun(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.rewind(seq, n, true)
    }

    fn rewind(&mut self, seq: SeqId, n: usize, rerun: bool) -> Result<()> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(Error::UnknownSequence { seq: seq.0 })?;
        if n >= s.positions.len() {
            return Ok(());
        }
        // The position of the query that must see its keys: the last kept slot's, or the
        // first dropped one's.
        let query = match rerun {
            true => Some(s.positions[n]),
            false => n.checked_sub(1).map(|i| s.positions[i]),
        };
        // Every slot that query could see must still be there.
        for (g, group) in self.groups.iter().enumerate() {
            if let (Some(window), Some(last)) = (group.window, query) {
                let first_needed = (0..n)
                    .find(|&j| u64::from(s.positions[j]) + window as u64 > u64::from(last))
                    .unwrap_or(n);
                let evicted = (first_needed / PAGE_SIZE..n.div_ceil(PAGE_SIZE))
                    .any(|i| s.tables[g].get(i).is_some_and(|p| p.is_none()));
                if evicted {
                    return Err(Error::RewindPastWindow {
                        seq: seq.0,
                        to: n,
                        window,
                    });
                }
            }
        }
        for (g, group) in self.groups.iter_mut().enumerate() {
            let keep = n.div_ceil(PAGE_SIZE);
            for page in s.tables[g].drain(keep..).flatten() {
                group.pool.release(page);
            }
        }
        s.positions.truncate(n);
        s.tokens.truncate(n);
        s.hashes.truncate(n / PAGE_SIZE);
        s.max_pos = s.positions.iter().copied().max();
        Ok(())
    }

    /// Starts an empty sequence under a caller-chosen id (an engine that hands out ids itself,
    /// without waiting for the cache). Errors if the id is taken.
    pub fn insert_sequence(&mut self, id: SeqId) -> Result<()> {
        if self.seqs.contains_key(&id) {
            return Err(Error::SequenceExists { seq: id.0 });
        }
        let seq = Sequence {
            tables: vec![Vec::new(); self.groups.len()],
            ..Sequence::default()
        };
        self.seqs.insert(id, seq);
        Ok(())
    }

    /// A new sequence with the same contents as `seq`, sharing every page with it. Nothing is
    /// copied here, so a fork never needs a free page: the first write into a shared page (the
    /// partial last one, or any page after a rewind) copies it then (see [`KvCache::append`]).
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        self.seq(seq)?;
        let id = self.free_id();
        self.fork_as(seq, id)?;
        Ok(id)
    }

    /// The next id no live sequence has (ids a caller chose with [`KvCache::insert_sequence`]
    /// or [`KvCache::fork_as`] are skipped, not reused: that lost the sequence holding one).
    fn free_id(&mut self) -> SeqId {
        while self.seqs.contains_key(&SeqId(self.next_id)) {
            self.next_id = self.next_id.wrapping_add(1);
        }
        let id = SeqId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// [`KvCache::fork`] under a caller-chosen id. Errors if `seq` is unknown or `id` taken.
    pub fn fork_as(&mut self, seq: SeqId, id: SeqId) -> Result<()> {
        if self.seqs.contains_key(&id) {
            return Err(Error::SequenceExists { seq: id.0 });
        }
        let child = self.seq(seq)?.clone();
        for (g, group) in self.groups.iter_mut().enumerate() {
            for page in child.tables[g].iter().flatten() {
                group.pool.retain(*page);
            }
        }
        self.seqs.insert(id, child);
        Ok(())
    }

    /// Where slot `slot` of `seq` lives in `layer`'s storage: (page, offset in page).
    fn locate(&self, layer: usize, seq: &Sequence, slot: usize) -> Option<(usize, PageId, usize)> {
        let (g, _) = self.layer_slot[layer];
        let page = (*seq.tables[g].get(slot / PAGE_SIZE)?)?;
        Some((g, page, slot % PAGE_SIZE))
    }

    /// Stores the key and value of one slot for every KV head (`k`, `v`: `n_kv_heads × head_dim`),
    /// rounded to the cache's [`KvType`].
    pub fn write(
        &mut self,
        layer: usize,
        seq: SeqId,
        slot: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let (hd, nh, rb) = (
            self.layout.head_dim,
            self.layout.n_kv_heads,
            self.layout.row_bytes(),
        );
        let kv_type = self.layout.kv_type;
        let s = self.seq(seq)?;
        let (g, page, off) = self.locate(layer, s, slot).ok_or(Error::BadBatch {
            reason: format!(
                "slot {slot} of sequence {} holds no page in layer {layer} (never appended, or \
                 released behind the sliding window)",
                seq.0
            ),
        })?;
        let li = self.layer_slot[layer].1;
        let group = &mut self.groups[g];
        let n_pages = group.pool.n_pages();
        for h in 0..nh {
            let at = head_page(n_pages, page as usize, h, PAGE_SIZE * rb);
            let key_page = &mut group.keys[li][at.clone()];
            kernels::write_key(kv_type, &k[h * hd..(h + 1) * hd], key_page, off);
            let row = &mut group.values[li][at.start + off * rb..at.start + (off + 1) * rb];
            kernels::quantize_row(kv_type, &v[h * hd..(h + 1) * hd], row);
        }
        Ok(())
    }

    /// A read-only view of `seq` in `layer`, for attention.
    pub fn view(&self, layer: usize, seq: SeqId) -> Result<SeqView<'_>> {
        let s = self.seq(seq)?;
        let (g, li) = self.layer_slot[layer];
        let group = &self.groups[g];
        Ok(SeqView {
            positions: &s.positions,
            table: &s.tables[g],
            keys: &group.keys[li],
            values: &group.values[li],
            n_pages: group.pool.n_pages(),
            n_kv_heads: self.layout.n_kv_heads,
            row_bytes: self.layout.row_bytes(),
            kv_type: self.layout.kv_type,
            window: group.window,
        })
    }
}

impl Group {
    /// Copies `page` (in every layer, for each of the `n_heads` KV heads) to a fresh page and
    /// drops one holder of the original.
    fn copy_page(&mut self, page: PageId, n_heads: usize) -> Result<PageId> {
        let fresh = self.pool.allocate().ok_or(Error::KvCacheFull {
            needed_pages: 1,
            free_pages: 0,
        })?;
        let n_pages = self.pool.n_pages();
        for store in self.keys.iter_mut().chain(self.values.iter_mut()) {
            // Each head's rows of the page: the storage's share of one (head, page).
            let n = store.len() / n_pages / n_heads;
            for h in 0..n_heads {
                let src = head_page(n_pages, page as usize, h, n);
                let dst = head_page(n_pages, fresh as usize, h, n);
                store.copy_within(src, dst.start);
            }
        }
        self.pool.release(page);
        Ok(fresh)
    }
}

/// One sequence's keys and values in one layer.
#[derive(Debug, Clone, Copy)]
pub struct SeqView<'a> {
    /// Position of each slot.
    pub positions: &'a [u32],
    table: &'a [Option<PageId>],
    keys: &'a [u8],
    values: &'a [u8],
    /// Pages in the layer's storage (see [`head_page`]).
    n_pages: usize,
    n_kv_heads: usize,
    row_bytes: usize,
    /// How the rows are stored.
    pub kv_type: KvType,
    /// The layer's sliding window, if any.
    pub window: Option<usize>,
}

impl<'a> SeqView<'a> {
    /// The keys and values of KV head `head` for the slots of page `i` of the table, or `None`
    /// for a released page: [`PAGE_SIZE`] keys as a key page (see
    /// [`crate::kernels::attention`]) and [`PAGE_SIZE`] value rows, stored as
    /// [`SeqView::kv_type`].
    pub fn page(&self, i: usize, head: usize) -> Option<(&'a [u8], &'a [u8])> {
        let page = (*self.table.get(i)?)? as usize;
        if head >= self.n_kv_heads {
            return None;
        }
        let at = head_page(self.n_pages, page, head, PAGE_SIZE * self.row_bytes);
        Some((self.keys.get(at.clone())?, self.values.get(at)?))
    }

    /// The index of the first page still in the cache (the table's length if none is): a
    /// sliding-window layer releases the pages that fall out of its window, from the front.
    pub fn first_live_page(&self) -> usize {
        self.table
            .iter()
            .position(Option::is_some)
            .unwrap_or(self.table.len())
    }
}

#[cfg(test)]
pub(crate) mod tests;
