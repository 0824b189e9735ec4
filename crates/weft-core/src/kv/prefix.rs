//! The automatic prefix cache (after vLLM's block hashes).
//!
//! Every full page of a sequence written by plain causal passes (no custom mask, each token at
//! the position equal to its slot) is *published* under a hash chained over its parent page:
//! `hash(parent hash, the page's token ids)`. A new sequence whose first tokens hash the same
//! *attaches* those pages instead of computing them. Attached keys and values are the ones
//! the sequence would have computed itself (weft's kernels give a token the same result
//! whatever else is in its batch), so outputs are bit-identical with and without the cache.
//!
//! The cache holds one reference on each page it publishes. A page that only the cache holds
//! counts as free: the pool evicts such pages, least recently used first, when it needs room.
//! Entries also keep their token ids and parent hash, so a hash collision can never attach
//! the wrong page.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{KvCache, PageId, SeqId, PAGE_SIZE};

/// What the prefix cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Tokens of new sequences looked up in the cache.
    pub queried_tokens: u64,
    /// Of those, tokens whose pages were attached instead of computed.
    pub hit_tokens: u64,
    /// Cached pages given back to the pool to make room.
    pub evictions: u64,
}

/// One published page: its page in every layer group.
#[derive(Debug, Clone)]
struct Entry {
    parent: u64,
    tokens: Vec<u32>,
    pages: Vec<PageId>,
    last_used: u64,
}

/// The cache's state inside a [`KvCache`].
#[derive(Debug, Default)]
pub(super) struct PrefixCache {
    pub enabled: bool,
    entries: HashMap<u64, Entry>,
    tick: u64,
    pub stats: PrefixStats,
}

/// The hash of the root "page" every chain starts from.
const ROOT: u64 = 0x77_65_66_74; // "weft"

/// The hash every chain of pages written under `salt` starts from.
fn root(salt: u64) -> u64 {
    if salt == 0 {
        ROOT
    } else {
        chain(ROOT, &[salt as u32, (salt >> 32) as u32])
    }
}

/// The hash of a page from its parent's hash and its token ids.
fn chain(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same value in every run.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl KvCache {
    /// Turns the automatic prefix cache on or off (it starts off; the engine turns it on).
    /// Turning it off gives back every page only the cache holds.
    pub fn set_prefix_cache(&mut self, on: bool) {
        self.prefix.enabled = on;
        if !on {
            let entries = std::mem::take(&mut self.prefix.entries);
            for e in entries.into_values() {
                self.release_entry(&e);
            }
        }
    }

    /// What the prefix cache did so far.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats
    }

    /// Records the token ids of the slots just appended to `seq` (`plain`: a causal pass
    /// wrote them at positions equal to their slots) and publishes the pages they complete.
    /// `salt` names anything else that shaped their keys and values (the adapters, 0 for the
    /// base model): pages match only under the same salt, and a sequence whose salt changes
    /// is no longer shared. Call it after the slots were written.
    pub fn publish(&mut self, seq: SeqId, tokens: &[u32], plain: bool, salt: u64) {
        let enabled = self.prefix.enabled;
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        if !plain
            || s.tokens.len() + tokens.len() != s.positions.len()
            || (!s.tokens.is_empty() && s.salt != salt)
        {
            s.unshareable = true;
        }
        s.salt = salt;
        if s.unshareable || !enabled {
            return;
        }
        s.tokens.extend_from_slice(tokens);
        self.prefix.tick += 1;
        let tick = self.prefix.tick;
        while (s.hashes.len() + 1) * PAGE_SIZE <= s.tokens.len() {
            let k = s.hashes.len();
            let parent = k.checked_sub(1).map_or(root(salt), |p| s.hashes[p]);
            let page_tokens = &s.tokens[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
            let h = chain(parent, page_tokens);
            s.hashes.push(h);
            let pages: Option<Vec<PageId>> = s
                .tables
                .iter()
                .map(|t| t.get(k).copied().flatten())
                .collect();
            match (self.prefix.entries.get_mut(&h), pages) {
                (Some(e), _) => e.last_used = tick,
                (None, Some(pages)) => {
                    for (g, &p) in pages.iter().enumerate() {
                        self.groups[g].pool.retain(p);
                    }
                    let entry = Entry {
                        parent,
                        tokens: page_tokens.to_vec(),
                        pages,
                        last_used: tick,
                    };
                    self.prefix.entries.insert(h, entry);
                }
                // A sliding-window page already released: nothing to publish.
                (None, None) => {}
            }
        }
    }

    /// Attaches to the empty sequence `seq` the cached pages that hold the longest prefix of
    /// `tokens` in whole pages, at most `max` tokens (positions are the slots, from 0).
    /// Returns how many tokens were attached; the caller runs the rest.
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32], max: usize, salt: u64) -> usize {
        let max = max.min(tokens.len());
        if !self.prefix.enabled {
            return 0;
        }
        match self.seqs.get(&seq) {
            Some(s) if s.positions.is_empty() && !s.unshareable => {}
            _ => return 0,
        }
        let hashes = self.cached_pages(tokens, max, salt);
        self.prefix.stats.queried_tokens += max as u64;
        self.prefix.tick += 1;
        let tick = self.prefix.tick;
        let Some(s) = self.seqs.get_mut(&seq) else {
            return 0;
        };
        for (k, &h) in hashes.iter().enumerate() {
            let Some(e) = self.prefix.entries.get_mut(&h) else {
                break;
            };
            e.last_used = tick;
            for (g, &p) in e.pages.iter().enumerate() {
                self.groups[g].pool.retain(p);
                s.tables[g].push(Some(p));
            }
            s.positions
                .extend((k * PAGE_SIZE) as u32..((k + 1) * PAGE_SIZE) as u32);
            s.tokens.extend_from_slice(&e.tokens);
            s.hashes.push(h);
        }
        let n = hashes.len() * PAGE_SIZE;
        s.max_pos = n.checked_sub(1).map(|p| p as u32);
        s.salt = salt;
        self.prefix.stats.hit_tokens += n as u64;
        n
    }

    /// How many tokens of `tokens` (at most `max`, in whole pages) [`KvCache::attach_prefix`]
    /// would attach now, changing nothing.
    pub fn cached_prefix_len(&self, tokens: &[u32], max: usize, salt: u64) -> usize {
        match self.prefix.enabled {
            true => self.cached_pages(tokens, max.min(tokens.len()), salt).len() * PAGE_SIZE,
            false => 0,
        }
    }

    /// Whether the pages `seq` completes from now on can be published (its slots so far were
    /// all written by causal passes at positions equal to their slots, or attached).
    pub fn is_shareable(&self, seq: SeqId) -> bool {
        self.prefix.enabled && self.seqs.get(&seq).is_some_and(|s| !s.unshareable)
    }

    /// The hashes of the cached pages that hold the longest whole-page prefix of
    /// `tokens[..max]`, in order.
    fn cached_pages(&self, tokens: &[u32], max: usize, salt: u64) -> Vec<u64> {
        let mut parent = root(salt);
        let mut hashes = Vec::new();
        while (hashes.len() + 1) * PAGE_SIZE <= max {
            let k = hashes.len();
            let page_tokens = &tokens[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
            let h = chain(parent, page_tokens);
            match self.prefix.entries.get(&h) {
                // The same parent and ids: not a hash collision.
                Some(e) if e.parent == parent && e.tokens == page_tokens => hashes.push(h),
                _ => break,
            }
            parent = h;
        }
        hashes
    }

    /// Whether only the cache holds `e`'s pages (so evicting it frees them).
    fn evictable_entry(&self, e: &Entry) -> bool {
        e.pages
            .iter()
            .enumerate()
            .all(|(g, &p)| self.groups[g].pool.refcount(p) == 1)
    }

    /// Cached pages per group that only the cache holds: free for the pool's purposes.
    pub(super) fn evictable(&self) -> usize {
        let entries = self.prefix.entries.values();
        entries.filter(|e| self.evictable_entry(e)).count()
    }

    /// Evicts least recently used entries that only the cache holds until every group has
    /// `needed[g]` free pages, or nothing more can go.
    pub(super) fn make_room(&mut self, needed: &[usize]) {
        let short = |kv: &KvCache| {
            kv.groups
                .iter()
                .zip(needed)
                .any(|(g, &n)| g.pool.n_free() < n)
        };
        while short(self) {
            let victim = self
                .prefix
                .entries
                .iter()
                .filter(|(_, e)| self.evictable_entry(e))
                .min_by_key(|(_, e)| e.last_used)
                .map(|(&h, _)| h);
            let Some(h) = victim else { return };
            if let Some(e) = self.prefix.entries.remove(&h) {
                self.release_entry(&e);
                self.prefix.stats.evictions += 1;
            }
        }
    }

    fn release_entry(&mut self, e: &Entry) {
        for (g, &p) in e.pages.iter().enumerate() {
            self.groups[g].pool.release(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{GroupSpec, KvLayout};
    use super::*;

    fn cache(pages: usize) -> KvCache {
        let layout = KvLayout {
            n_layers: 1,
            n_kv_heads: 1,
            head_dim: 2,
            groups: vec![GroupSpec {
                layers: vec![0],
                window: None,
            }],
            kv_type: super::super::KvType::F16,
        };
        let mut kv = KvCache::new(layout, pages * PAGE_SIZE).unwrap();
        kv.set_prefix_cache(true);
        kv
    }

    /// Appends and "writes" `tokens` causally to a new sequence.
    fn fill(kv: &mut KvCache, tokens: &[u32], plain: bool) -> SeqId {
        let s = kv.new_sequence();
        let positions: Vec<u32> = (0..tokens.len() as u32).collect();
        kv.append(s, &positions).unwrap();
        kv.publish(s, tokens, plain, 0);
        s
    }

    #[test]
    fn full_pages_are_published_attached_and_evicted_lru() {
        let mut kv = cache(4);
        let a: Vec<u32> = (0..70).collect();
        let s = fill(&mut kv, &a, true);
        assert!(kv.is_shareable(s));
        kv.free_sequence(s);
        // Two full pages stay cached but count as free.
        assert_eq!(kv.usage()[0].free, 4);
        // What would attach, asked without attaching (nor counting a query).
        assert_eq!(kv.cached_prefix_len(&a, 69, 0), 64);
        assert_eq!(kv.cached_prefix_len(&a, 63, 0), 32);
        assert_eq!(kv.cached_prefix_len(&a, 69, 7), 0, "another salt");
        assert_eq!(kv.prefix_stats().queried_tokens, 0);
        let t = kv.new_sequence();
        assert_eq!(kv.attach_prefix(t, &a, 69, 0), 64);
        assert_eq!(kv.len(t).unwrap(), 64);
        // A different second page: only the first attaches.
        let mut b = a.clone();
        b[40] = 999;
        let u = kv.new_sequence();
        assert_eq!(kv.attach_prefix(u, &b, 69, 0), 32);
        // The limit keeps whole pages below it.
        let v = kv.new_sequence();
        assert_eq!(kv.attach_prefix(v, &a, 63, 0), 32);
        for x in [t, u, v] {
            kv.free_sequence(x);
        }
        // Filling the pool evicts the cached pages, oldest first.
        let big: Vec<u32> = (1000..1000 + 4 * PAGE_SIZE as u32).collect();
        let w = fill(&mut kv, &big, false);
        assert!(!kv.is_shareable(w));
        assert_eq!(kv.prefix_stats().evictions, 2);
        assert_eq!(kv.usage()[0].free, 0);
        kv.free_sequence(w);
        let x = kv.new_sequence();
        assert_eq!(kv.attach_prefix(x, &a, 69, 0), 0, "evicted");
        assert_eq!(
            kv.attach_prefix(x, &big, 127, 0),
            0,
            "unshareable pages are not published"
        );
    }
}
