//! A pool of fixed-size KV pages with reference counts.
//!
//! Pages are plain ids into the storage a [`super::KvCache`] group owns. A page may be shared by
//! several sequences (after a fork); it returns to the free list when its last holder lets go.
//! Freed pages are reused last-in first-out so recently touched memory is reused first.

/// Index of a page in its pool.
pub type PageId = u32;

/// Free list and reference counts of one group's pages.
#[derive(Debug, Clone)]
pub struct PagePool {
    refcounts: Vec<u32>,
    free: Vec<PageId>,
}

impl PagePool {
    /// A pool of `n_pages` free pages.
    pub fn new(n_pages: usize) -> PagePool {
        PagePool {
            refcounts: vec![0; n_pages],
            // Pop from the end: page 0 is handed out first.
            free: (0..n_pages as PageId).rev().collect(),
        }
    }

    /// Total number of pages.
    pub fn n_pages(&self) -> usize {
        self.refcounts.len()
    }

    /// Number of free pages.
    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Takes a free page (reference count 1), or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<PageId> {
        let page = self.free.pop()?;
        self.refcounts[page as usize] = 1;
        Some(page)
    }

    /// Adds a holder to an allocated page. Precondition: `page` is allocated.
    pub fn retain(&mut self, page: PageId) {
        debug_assert!(self.refcounts[page as usize] > 0, "retain of a free page");
        self.refcounts[page as usize] += 1;
    }

    /// Drops one holder of `page`; the page is freed when none is left.
    /// Precondition: `page` is allocated.
    pub fn release(&mut self, page: PageId) {
        let rc = &mut self.refcounts[page as usize];
        debug_assert!(*rc > 0, "release of a free page");
        *rc = rc.saturating_sub(1);
        if *rc == 0 {
            self.free.push(page);
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
        let mut pool = PagePool::new(2);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pool.allocate(), None);
        pool.retain(a);
        pool.release(a);
        assert_eq!(pool.n_free(), 0);
        pool.release(a);
        assert_eq!(pool.n_free(), 1);
        // Last freed, first reused.
        assert_eq!(pool.allocate(), Some(a));
        pool.release(a);
        pool.release(b);
        assert_eq!(pool.n_free(), 2);
    }
}
