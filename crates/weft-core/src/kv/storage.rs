//! The bytes of one layer's keys (or values): zero-filled, mapped lazily, and aligned to a
//! memory page.
//!
//! The alignment is for attention's speed, not its results. The allocator returns a large block
//! 16 bytes past a memory page (its header), so rows sat 16 bytes past the cache lines: a
//! 128-byte key row of SmolLM2 touched three lines instead of two, half the kernels' 32-byte
//! loads were split across lines, and each head's 4 KiB page spanned two memory pages. Aligned,
//! SmolLM2's decode at depth 4,096 ran a median 1.7% faster over 9 alternating pairs (noisy:
//! -7% to +16%), Gemma 3's the same. (Aligning the interleaved weights likewise made SmolLM2's
//! tg128 4–8% slower over 3 pairs, and 64 bytes past a page no better: they stay as they are.)
//!
//! An anonymous memory map (memmap2's `map_anon`) would give the same alignment and lazy zeros
//! without this type, but SmolLM2's decode at depth 4,096 ran 3–5% slower on it in 5 of 6
//! alternating pairs (why, not found), so the allocator's block stays.

use std::ops::{Deref, DerefMut};

/// Alignment of the start of the storage: a memory page (and so a cache line).
const ALIGN: usize = 4096;

/// `len` zero bytes starting at a multiple of [`ALIGN`].
#[derive(Debug)]
pub(super) struct Storage {
    /// The allocation: `len + ALIGN - 1` bytes (none when `len` is 0).
    buf: Vec<u8>,
    /// Where the aligned bytes start in `buf`.
    start: usize,
    len: usize,
}

impl Storage {
    /// `len` zero bytes, or `None` when they cannot be allocated. Zeroed by the allocator
    /// (calloc / a fresh mmap), so the OS maps a page of storage only when it is first written;
    /// writing the zeros ourselves would touch it all.
    pub(super) fn zeroed(len: usize) -> Option<Storage> {
        if len == 0 {
            return Some(Storage {
                buf: Vec::new(),
                start: 0,
                len: 0,
            });
        }
        let size = len.checked_add(ALIGN - 1)?;
        let layout = std::alloc::Layout::array::<u8>(size).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` was allocated by the global allocator with the layout of `size` bytes
        // (what a `Vec<u8>` of capacity `size` uses), and zeroed, so length and capacity `size`
        // describe initialized memory.
        let buf = unsafe { Vec::from_raw_parts(ptr, size, size) };
        let start = ptr.align_offset(ALIGN);
        (start < ALIGN).then_some(Storage { buf, start, len })
    }
}

impl Deref for Storage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl DerefMut for Storage {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zero() {
        for len in [0, 1, 100, 1 << 20] {
            let mut s = Storage::zeroed(len).unwrap();
            assert_eq!(s.len(), len);
            assert!(s.iter().all(|&b| b == 0));
            if len > 0 {
                assert_eq!(s.as_ptr() as usize % ALIGN, 0);
                s[len - 1] = 7;
                assert_eq!(s[len - 1], 7);
            }
        }
    }
}
