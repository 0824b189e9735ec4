//! A set of token ids as a bitset over the vocabulary.

/// Which token ids are allowed: one bit per vocabulary entry.
///
/// ```
/// use weft::constraint::TokenMask;
/// let mut m = TokenMask::none(10);
/// m.allow(3);
/// m.allow(7);
/// let mut n = TokenMask::all(10);
/// n.forbid(7);
/// m.and_with(&n);
/// assert!(m.is_allowed(3) && !m.is_allowed(7));
/// assert_eq!(m.count(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u64>,
    len: usize,
}

impl TokenMask {
    /// Every id of a vocabulary of `len` allowed.
    pub fn all(len: usize) -> TokenMask {
        let mut m = TokenMask {
            words: vec![u64::MAX; len.div_ceil(64)],
            len,
        };
        m.clear_tail();
        m
    }

    /// No id allowed.
    pub fn none(len: usize) -> TokenMask {
        TokenMask {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    /// From 32-bit words, bit `i % 32` of word `i / 32` for id `i` (llguidance's layout).
    pub fn from_u32_words(words: &[u32], len: usize) -> TokenMask {
        let mut m = TokenMask::none(len);
        for (i, &w) in words.iter().enumerate() {
            if let Some(dst) = m.words.get_mut(i / 2) {
                *dst |= u64::from(w) << (32 * (i % 2));
            }
        }
        m.clear_tail();
        m
    }

    fn clear_tail(&mut self) {
        if !self.len.is_multiple_of(64) {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u64 << (self.len % 64)) - 1;
            }
        }
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allows `id` (ignored past the vocabulary).
    pub fn allow(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 64] |= 1 << (i % 64);
        }
    }

    /// Forbids `id`.
    pub fn forbid(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Whether `id` is allowed (`false` past the vocabulary).
    pub fn is_allowed(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 64] >> (i % 64) & 1 == 1
    }

    /// Keeps only ids allowed by both masks.
    pub fn and_with(&mut self, other: &TokenMask) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= b;
        }
        if other.words.len() < self.words.len() {
            self.words[other.words.len()..].fill(0);
        }
    }

    /// Number of allowed ids.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// One flag per id.
    pub fn to_bools(&self) -> Vec<bool> {
        (0..self.len as u32).map(|i| self.is_allowed(i)).collect()
    }
}
