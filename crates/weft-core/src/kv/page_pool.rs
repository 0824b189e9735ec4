//! A pool of fixed-size KV pages with reference counts.
//!
//! Pages are plain ids into the storage a [`super::KvCache`] group owns. A page may be shared by
//! several sequences (after a fork); it returns to the free pages when its last holder lets go.
//!
//! The lowest free page is handed out first, so a sequence's pages lie in ascending order
//! through memory whenever the free pages allow, whatever order earlier sequences released
//! theirs in. Attention streams a sequence's pages in order, and on an AMD EPYC Zen 5 it read
//! them far slower in descending order: with a last-in first-out free list, every second
//! `weft bench` repetition got the previous one's pages back reversed, and SmolLM2's decode at
//! depth 4,096 alternated between 231–239 and 168–179 tokens/s.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Index of a page in its pool.
pub type PageId = u32;

/// Free pages and reference counts of one group's pages.
#[derive(Debug, Clone)]
pub struct PagePool {
    refcounts: Vec<u32>,
    /// The free pages, lowest on top.
    free: BinaryHeap<Reverse<PageId>>,
}

impl PagePool {
    /// A pool of `n_pages` free pages; `None` when page ids cannot number them or their
    /// bookkeeping cannot be allocated.
    pub fn new(n_pages: usize) -> Option<PagePool> {
        let last = PageId::try_from(n_pages.checked_sub(1)?).ok()?;
        let mut refcounts = Vec::new();
        refcounts.try_reserve_exact(n_pages).ok()?;
        refcounts.resize(n_pages, 0);
        let mut free = Vec::new();
        free.try_reserve_exact(n_pages).ok()?;
        // Ascending ids are already a min-heap of `Reverse` ids.
        free.extend((0..=last).map(Reverse));
        Some(PagePool {
            refcounts,
            free: BinaryHeap::from(free),
        })
    }

    /// Total number of pages.
    pub fn n_pages(&self) -> usize {
        self.refcounts.len()
    }

    /// Number of free pages.
    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Takes the lowest free page (reference count 1), or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<PageId> {
        let Reverse(page) = self.free.pop()?;
        self.refcounts[page as usize] = 1;
        Some(page)
    }

    /// Adds a holder to an allocated page. Precondition: `page` is allocated.
    pub fn retain(&mut self, page: PageId) {
        // A broken invariant stops here rather than hand one page to two contexts (checked in
        // every build: it is one comparison per page).
        assert!(self.refcounts[page as usize] > 0, "retain of a free page");
        self.refcounts[page as usize] += 1;
    }

    /// Drops one holder of `page`; the page is freed when none is left.
    /// Precondition: `page` is allocated.
    pub fn release(&mut self, page: PageId) {
        let rc = &mut self.refcounts[page as usize];
        assert!(*rc > 0, "release of a free page");
        *rc = rc.saturating_sub(1);
        if *rc == 0 {
            self.free.push(Reverse(page));
        }
    }

    /// Number of holders of `page` (0 when free).
    pub fn refcount(&self, page: PageId) -> u32 {
        self.refcounts[page as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_retain_release() {
        let mut pool = PagePool::new(2).unwrap();
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pool.allocate(), None);
        pool.retain(a);
        pool.release(a);
        assert_eq!(pool.n_free(), 0);
        pool.release(a);
        assert_eq!(pool.n_free(), 1);
        assert_eq!(pool.allocate(), Some(a));
        pool.release(a);
        pool.release(b);
        assert_eq!(pool.n_free(), 2);
    }

    /// More pages than ids can number (or none) is no pool, not a wrapped or empty one.
    #[test]
    fn page_ids_bound_the_pool() {
        assert!(PagePool::new(0).is_none());
        assert!(PagePool::new(PageId::MAX as usize + 2).is_none());
    }

    /// Pages come back lowest first, whatever order they were released in.
    #[test]
    fn lowest_free_page_first() {
        let mut pool = PagePool::new(8).unwrap();
        let pages: Vec<PageId> = (0..6).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(pages, [0, 1, 2, 3, 4, 5]);
        for &p in pages.iter().rev() {
            pool.release(p);
        }
        let again: Vec<PageId> = (0..8).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(again, [0, 1, 2, 3, 4, 5, 6, 7]);
        for p in [5, 2, 7] {
            pool.release(p);
        }
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.allocate(), Some(5));
    }
}
