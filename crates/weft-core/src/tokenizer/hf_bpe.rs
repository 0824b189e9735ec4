//! The BPE model of a Hugging Face `tokenizer.json`, as the `tokenizers` library runs it
//! (`models::bpe`, checked against tokenizers 0.23.3).
//!
//! A word is cut into characters (the first without, the others with the
//! `continuing_subword_prefix`; the last with the `end_of_word_suffix`); a character that is not
//! in the vocabulary becomes its `<0xXX>` byte tokens (`byte_fallback`) or the unknown token
//! (consecutive ones fused into one with `fuse_unk`), and is dropped when there is neither. Then
//! the adjacent pair with the lowest merge rank is merged until no pair has a merge, ties going
//! to the leftmost pair. With `ignore_merges`, a word that is itself a token is that token.
//!
//! Unlike llama.cpp's byte-level BPE ([`super::bpe`]), merges work on token ids and unknown
//! characters are resolved before merging, as in the library.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::vocab::Vocab;

/// The BPE model: merges and the rules for characters outside the vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct BpeModel {
    /// (left id, right id) → (rank, id of the merged token).
    pub merges: HashMap<(u32, u32), (u32, u32)>,
    pub unk: Option<u32>,
    pub fuse_unk: bool,
    /// `<0xXX>` token of each byte, when the model falls back to bytes.
    pub byte_ids: Option<Box<[Option<u32>; 256]>>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub ignore_merges: bool,
    /// Added tokens that are not in the model's own vocabulary: the model never looks them up.
    pub added_only: HashSet<u32>,
}

/// A candidate merge of the symbol at `pos` with the next one.
#[derive(Debug, PartialEq, Eq)]
struct Merge {
    pos: usize,
    rank: u32,
    new_id: u32,
}

impl Ord for Merge {
    /// The heap pops the lowest rank first, then the leftmost position.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    live: bool,
}

impl BpeModel {
    /// The id of `text` in the model's vocabulary.
    fn lookup(&self, vocab: &Vocab, text: &str) -> Option<u32> {
        vocab.id(text).filter(|id| !self.added_only.contains(id))
    }

    /// Tokenizes one pre-tokenized word, appending its ids to `out`.
    pub fn tokenize(&self, vocab: &Vocab, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(id) = self.lookup(vocab, word) {
                out.push(id);
                return;
            }
        }
        let mut ids: Vec<u32> = Vec::with_capacity(word.len());
        let mut unk: Option<u32> = None;
        let mut piece = String::new();
        let mut chars = word.chars().peekable();
        let mut first = true;
        while let Some(c) = chars.next() {
            piece.clear();
            if !first {
                piece.push_str(self.prefix.as_deref().unwrap_or_default());
            }
            first = false;
            piece.push(c);
            if chars.peek().is_none() {
                piece.push_str(self.suffix.as_deref().unwrap_or_default());
            }
            if let Some(id) = self.lookup(vocab, &piece) {
                ids.extend(unk.take());
                ids.push(id);
                continue;
            }
            if let Some(bytes) = &self.byte_ids {
                let spelled: Option<Vec<u32>> = piece.bytes().map(|b| bytes[b as usize]).collect();
                if let Some(spelled) = spelled {
                    // As the library does, a pending unknown token waits behind these bytes.
                    ids.extend(spelled);
                    continue;
                }
            }
            if let Some(unk_id) = self.unk {
                if unk.is_some() && !self.fuse_unk {
                    ids.extend(unk.take());
                }
                unk = Some(unk_id);
            }
        }
        ids.extend(unk);
        self.merge_all(ids, out);
    }

    fn merge_all(&self, ids: Vec<u32>, out: &mut Vec<u32>) {
        let n = ids.len();
        let mut syms: Vec<Symbol> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
                live: true,
            })
            .collect();
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Merge>, syms: &[Symbol], pos: usize| {
            let Some(next) = syms[pos].next else { return };
            if let Some(&(rank, new_id)) = self.merges.get(&(syms[pos].id, syms[next].id)) {
                queue.push(Merge { pos, rank, new_id });
            }
        };
        for pos in 0..n {
            push(&mut queue, &syms, pos);
        }
        while let Some(top) = queue.pop() {
            let sym = syms[top.pos];
            let Some(next) = sym.next.filter(|_| sym.live) else {
                continue;
            };
            // Skip merges made stale by an earlier one.
            let pair = (sym.id, syms[next].id);
            if self.merges.get(&pair).map(|m| m.1) != Some(top.new_id) {
                continue;
            }
            let right = syms[next];
            syms[top.pos].id = top.new_id;
            syms[top.pos].next = right.next;
            syms[next].live = false;
            if let Some(after) = right.next {
                syms[after].prev = Some(top.pos);
            }
            if let Some(prev) = sym.prev {
                push(&mut queue, &syms, prev);
            }
            push(&mut queue, &syms, top.pos);
        }
        out.extend(syms.iter().filter(|s| s.live).map(|s| s.id));
    }
}
