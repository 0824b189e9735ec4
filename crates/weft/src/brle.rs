//! Binary run-length encoding: the compact form of attention masks and logit masks.

/// A sequence of booleans stored as alternating run lengths, the first run being `false`
/// (it may be empty). `[2, 3, 1]` is `false false true true true false`.
///
/// Attention masks say which earlier tokens a token sees; logit masks say which token ids may
/// be sampled. Masks are mostly long runs (a prefix, a document, a few allowed ids), which
/// this form stores in a few numbers.
///
/// ```
/// use weft::Brle;
/// let m = Brle::from_bools(&[false, true, true, false]);
/// assert_eq!(m.runs(), &[1, 2, 1]);
/// assert_eq!(m.len(), 4);
/// assert!(m.get(2) && !m.get(3));
/// assert_eq!(Brle::all(3, true).to_bools(), vec![true; 3]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Brle {
    runs: Vec<u32>,
}

impl Brle {
    /// From run lengths, alternating `false`, `true`, `false`… starting with `false`.
    pub fn from_runs(runs: Vec<u32>) -> Brle {
        Brle { runs }
    }

    /// From one boolean per element.
    pub fn from_bools(bits: &[bool]) -> Brle {
        let mut runs = Vec::new();
        let (mut current, mut n) = (false, 0u32);
        for &b in bits {
            if b != current {
                runs.push(n);
                current = b;
                n = 0;
            }
            n += 1;
        }
        runs.push(n);
        Brle { runs }
    }

    /// `n` copies of `value`.
    pub fn all(n: usize, value: bool) -> Brle {
        let n = n as u32;
        Brle {
            runs: if value { vec![0, n] } else { vec![n] },
        }
    }

    /// Only the listed indices set, out of `n`.
    pub fn only(n: usize, indices: &[u32]) -> Brle {
        let mut bits = vec![false; n];
        for &i in indices {
            if let Some(b) = bits.get_mut(i as usize) {
                *b = true;
            }
        }
        Brle::from_bools(&bits)
    }

    /// The run lengths.
    pub fn runs(&self) -> &[u32] {
        &self.runs
    }

    /// Number of elements (saturating at `usize::MAX`).
    pub fn len(&self) -> usize {
        self.runs
            .iter()
            .fold(0usize, |n, &r| n.saturating_add(r as usize))
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` (`false` past the end).
    pub fn get(&self, i: usize) -> bool {
        let mut start = 0usize;
        for (k, &r) in self.runs.iter().enumerate() {
            start += r as usize;
            if i < start {
                return k % 2 == 1;
            }
        }
        false
    }

    /// One boolean per element.
    pub fn to_bools(&self) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.len());
        for (k, &r) in self.runs.iter().enumerate() {
            out.extend(std::iter::repeat_n(k % 2 == 1, r as usize));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for bits in [
            vec![],
            vec![true],
            vec![false],
            vec![true, true, false, true],
            vec![false, false, true],
        ] {
            let m = Brle::from_bools(&bits);
            assert_eq!(m.to_bools(), bits);
            assert_eq!(m.len(), bits.len());
            for (i, &b) in bits.iter().enumerate() {
                assert_eq!(m.get(i), b);
            }
        }
        assert_eq!(Brle::from_bools(&[true, true, false]).runs(), &[0, 2, 1]);
        assert_eq!(
            Brle::only(5, &[1, 3, 9]).to_bools(),
            [false, true, false, true, false]
        );
        assert_eq!(Brle::all(0, true).len(), 0);
    }
}
