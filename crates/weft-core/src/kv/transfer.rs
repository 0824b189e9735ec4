//! Moving one sequence's keys and values out of the cache and back in: the KV half of a
//! session snapshot.
//!
//! An export copies the pages a sequence holds (every layer, keys and values in the cache's
//! type, keys turned from the cache's key pages into rows so a state reads like values and
//! outlives a change of the key layout) together with the slot positions; an import
//! allocates fresh pages for them in an empty sequence. Imported pages are never published to
//! the prefix cache: they may come from another machine whose kernels round differently, and
//! sharing them would break the cache's promise of bit-identical outputs.

use super::{head_page, KvCache, KvLayout, KvType, PageId, SeqId, Storage, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::kernels::attention as kernels;

/// One sequence's KV state, detached from any pool.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqState {
    /// The position of every slot.
    pub positions: Vec<u32>,
    /// How the keys and values are stored.
    pub kv_type: KvType,
    /// One entry per layer group of the layout, in order.
    pub groups: Vec<GroupState>,
}

/// One layer group's pages of a [`SeqState`].
#[derive(Debug, Clone, PartialEq)]
pub struct GroupState {
    /// For each page of the sequence's table: whether it is held (`false`: a sliding-window
    /// page already released).
    pub present: Vec<bool>,
    /// Per layer of the group: the keys of the present pages, one after the other, each
    /// `n_kv_heads × PAGE_SIZE` rows of `kv_type` (a KV head's rows together, slot by slot;
    /// [`super::KvLayout::page_bytes`] bytes a page).
    pub keys: Vec<Vec<u8>>,
    /// Per layer of the group: the values, laid out as `keys`.
    pub values: Vec<Vec<u8>>,
}

impl KvCache {
    /// Copies out the pages and positions of `seq`.
    pub fn export(&self, seq: SeqId) -> Result<SeqState> {
        let s = self.seq(seq)?;
        // A page of the state: each KV head's rows in turn.
        let (n, head) = (
            self.layout.page_bytes(),
            PAGE_SIZE * self.layout.row_bytes(),
        );
        let groups = self
            .groups
            .iter()
            .zip(&s.tables)
            .map(|(group, table)| {
                let n_pages = group.pool.n_pages();
                let copy = |store: &Storage, keys: bool| -> Vec<u8> {
                    let mut out = vec![0u8; table.iter().flatten().count() * n];
                    for (&page, o) in table.iter().flatten().zip(out.chunks_exact_mut(n)) {
                        for (h, o) in o.chunks_exact_mut(head).enumerate() {
                            let at = head_page(n_pages, page as usize, h, head);
                            to_rows(&self.layout, keys, &store[at], o);
                        }
                    }
                    out
                };
                GroupState {
                    present: table.iter().map(Option::is_some).collect(),
                    keys: group.keys.iter().map(|s| copy(s, true)).collect(),
                    values: group.values.iter().map(|s| copy(s, false)).collect(),
                }
            })
            .collect();
        Ok(SeqState {
            positions: s.positions.clone(),
            kv_type: self.layout.kv_type,
            groups,
        })
    }

    /// Fills the empty sequence `seq` with `state`'s pages and positions. The state is checked
    /// against this cache's layout first; on any error (a mismatch, not enough free pages)
    /// nothing changes and no page stays allocated.
    pub fn import(&mut self, seq: SeqId, state: &SeqState) -> Result<()> {
        let bad = |reason: String| Err(Error::BadKvState { reason });
        let s = self.seq(seq)?;
        if !s.positions.is_empty() {
            return bad(format!("sequence {} is not empty", seq.0));
        }
        if state.groups.len() != self.groups.len() {
            return bad(format!(
                "the state has {} layer groups, the model {}",
                state.groups.len(),
                self.groups.len()
            ));
        }
        if state.kv_type != self.layout.kv_type {
            return bad(format!(
                "the state stores its keys and values as {}, this cache as {}",
                state.kv_type, self.layout.kv_type
            ));
        }
        let n_slots = state.positions.len();
        let (n, head) = (
            self.layout.page_bytes(),
            PAGE_SIZE * self.layout.row_bytes(),
        );
        let mut needed = Vec::with_capacity(self.groups.len());
        for (g, (group, gs)) in self.groups.iter().zip(&state.groups).enumerate() {
            if gs.present.len() != n_slots.div_ceil(PAGE_SIZE) {
                return bad(format!(
                    "group {g}: {} pages for {n_slots} slots",
                    gs.present.len()
                ));
            }
            if group.window.is_none() && gs.present.iter().any(|p| !p) {
                return bad(format!("group {g} has full attention but misses pages"));
            }
            // A sliding-window group releases whole pages behind the window (see
            // `release_behind_window`), and keeps them released when the sequence is rewound
            // later: a missing page is fine if no query from the last slot's position on (the
            // last token run again, as a resumed generation does) sees any of its keys.
            if let Some(window) = group.window {
                let last = state.positions.last().map_or(0, |&p| u64::from(p));
                let released_ok = |i: usize| {
                    let slots = state.positions.get(i * PAGE_SIZE..(i + 1) * PAGE_SIZE);
                    slots.is_some_and(|s| s.iter().all(|&p| u64::from(p) + window as u64 <= last))
                };
                if let Some(i) = (0..gs.present.len()).find(|&i| !gs.present[i] && !released_ok(i))
                {
                    return bad(format!(
                        "group {g} misses page {i}, which its sliding window still reads"
                    ));
                }
            }
            let held = gs.present.iter().filter(|&&p| p).count();
            let layers = group.keys.len();
            let sizes_ok = gs.keys.len() == layers
                && gs.values.len() == layers
                && gs
                    .keys
                    .iter()
                    .chain(&gs.values)
                    .all(|v| v.len() == held * n);
            if !sizes_ok {
                return bad(format!("group {g}: page data does not match the layout"));
            }
            needed.push(held);
        }
        self.make_room(&needed);
        for (group, &need) in self.groups.iter().zip(&needed) {
            if need > group.pool.n_free() {
                return Err(Error::KvCacheFull {
                    needed_pages: need,
                    free_pages: group.pool.n_free(),
                });
            }
        }
        let mut tables: Vec<Vec<Option<PageId>>> = Vec::with_capacity(self.groups.len());
        for (group, gs) in self.groups.iter_mut().zip(&state.groups) {
            let mut table = Vec::with_capacity(gs.present.len());
            let mut k = 0;
            for &present in &gs.present {
                if !present {
                    table.push(None);
                    continue;
                }
                // Checked above: every group has `needed` free pages.
                let Some(page) = group.pool.allocate() else {
                    return Err(Error::KvCacheFull {
                        needed_pages: 1,
                        free_pages: 0,
                    });
                };
                let n_pages = group.pool.n_pages();
                for (h, at) in (k * n..(k + 1) * n).step_by(head).enumerate() {
                    let to = head_page(n_pages, page as usize, h, head);
                    for (store, src) in group.keys.iter_mut().zip(&gs.keys) {
                        from_rows(&self.layout, &src[at..at + head], &mut store[to.clone()]);
                    }
                    for (store, src) in group.values.iter_mut().zip(&gs.values) {
                        store[to.clone()].copy_from_slice(&src[at..at + head]);
                    }
                }
                table.push(Some(page));
                k += 1;
            }
            tables.push(table);
        }
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(Error::UnknownSequence { seq: seq.0 })?;
        s.tables = tables;
        s.positions = state.positions.clone();
        s.max_pos = s.positions.iter().copied().max();
        s.unshareable = true;
        Ok(())
    }
}

/// Copies one KV head's page of one layer to `rows`: values as they are, keys from the cache's
/// key page to rows.
fn to_rows(layout: &KvLayout, keys: bool, page: &[u8], rows: &mut [u8]) {
    match keys {
        true => kernels::key_page_to_rows(layout.kv_type, layout.head_dim, page, rows),
        false => rows.copy_from_slice(page),
    }
}

/// The inverse of [`to_rows`] for keys: one KV head's key rows to its key page.
fn from_rows(layout: &KvLayout, rows: &[u8], page: &mut [u8]) {
    kernels::key_rows_to_page(layout.kv_type, layout.head_dim, rows, page);
}

#[cfg(test)]
mod tests {
    use super::super::tests::layout;
    use super::*;

    fn cache(pages: usize) -> KvCache {
        KvCache::new(layout(Some(PAGE_SIZE)), pages * PAGE_SIZE).unwrap()
    }

    #[test]
    fn export_import_round_trip_and_failed_import_leaks_nothing() {
        let mut kv = cache(16);
        let a = kv.new_sequence();
        let n = 6 * PAGE_SIZE + 5;
        kv.append(a, &(0..n as u32).collect::<Vec<_>>()).unwrap();
        for slot in 0..n {
            let x = slot as f32;
            for layer in 0..2 {
                kv.write(layer, a, slot, &[x, -x], &[x + 0.5, 1.0]).unwrap();
            }
        }
        kv.release_behind_window(a);
        let state = kv.export(a).unwrap();
        assert!(
            !state.groups[1].present[0],
            "released window page exported as absent"
        );
        let b = kv.new_sequence();
        kv.import(b, &state).unwrap();
        assert_eq!(kv.export(b).unwrap(), state);
        assert_eq!(kv.positions(b).unwrap(), kv.positions(a).unwrap());
        // The state holds keys as rows (slot 3: [3, -3] in f16); the import rebuilt the pages.
        let f16s = |x: &[f32]| -> Vec<u8> {
            x.iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect()
        };
        assert_eq!(state.groups[0].keys[0][12..16], f16s(&[3.0, -3.0]));
        for i in 0..n.div_ceil(PAGE_SIZE) {
            let (va, vb) = (kv.view(0, a).unwrap(), kv.view(0, b).unwrap());
            assert_eq!(va.page(i, 0), vb.page(i, 0), "page {i}");
        }

        // Too few free pages: an error, and the pool is as before.
        kv.free_sequence(a);
        let free: Vec<usize> = kv.usage().iter().map(|u| u.free).collect();
        let c = kv.new_sequence();
        kv.import(c, &state).unwrap();
        let d = kv.new_sequence();
        let e = kv.import(d, &state).unwrap_err();
        assert!(matches!(e, Error::KvCacheFull { .. }), "{e}");
        kv.free_sequence(c);
        kv.free_sequence(d);
        assert_eq!(kv.usage().iter().map(|u| u.free).collect::<Vec<_>>(), free);

        // A state that does not fit the layout is refused before anything is allocated.
        let mut wrong = state.clone();
        wrong.groups[0].keys[0].pop();
        let f = kv.new_sequence();
        assert!(matches!(
            kv.import(f, &wrong),
            Err(Error::BadKvState { .. })
        ));
        kv.free_sequence(f);
        // A window group missing a page its window still reads (the last one) is refused too.
        let mut hole = state.clone();
        let g = &mut hole.groups[1];
        let last = g.present.len() - 1;
        g.present[last] = false;
        let page = kv.layout.page_bytes();
        for v in g.keys.iter_mut().chain(g.values.iter_mut()) {
            v.truncate(v.len() - page);
        }
        let f = kv.new_sequence();
        let e = kv.import(f, &hole).unwrap_err();
        assert!(e.to_string().contains("sliding window still reads"), "{e}");
        kv.free_sequence(f);
        kv.free_sequence(b);
        assert!(kv.usage().iter().all(|u| u.free == u.total));
    }

    /// A sequence rewound after its window released pages keeps them released: its state
    /// imports as long as its last token's window (the one a resumed generation runs again)
    /// sees none of them. It was refused when the page lay less than two windows behind.
    #[test]
    fn a_state_rewound_after_its_window_released_pages_imports() {
        let mut kv = cache(16);
        let a = kv.new_sequence();
        let n = 8 * PAGE_SIZE;
        kv.append(a, &(0..n as u32).collect::<Vec<_>>()).unwrap();
        for slot in 0..n {
            for layer in 0..2 {
                kv.write(layer, a, slot, &[1.0, 2.0], &[3.0, 4.0]).unwrap();
            }
        }
        // Highest position 255, horizon 255 - 64 = 191: pages 0..=4 (positions below 160) go.
        kv.release_behind_window(a);
        // The smallest rewind the window allows: the last token, at 191, sees 160..=191.
        kv.truncate(a, 6 * PAGE_SIZE).unwrap();
        let state = kv.export(a).unwrap();
        assert!(!state.groups[1].present[4] && state.groups[1].present[5]);
        let b = kv.new_sequence();
        kv.import(b, &state).expect("a rewound state imports");
        assert_eq!(kv.export(b).unwrap(), state);
        kv.free_sequence(a);
        kv.free_sequence(b);
        assert!(kv.usage().iter().all(|u| u.free == u.total));
    }
}
