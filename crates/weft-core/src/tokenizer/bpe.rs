//! Byte-level BPE (GPT-2 style), as llama.cpp's `llm_tokenizer_bpe` applies it.
//!
//! Each pre-tokenized word is mapped byte by byte to printable characters (GPT-2's
//! `bytes_to_unicode`), split into those characters, and the adjacent pair with the lowest merge
//! rank is merged until no pair is in the merge table (ties go to the leftmost pair).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::pretokenize::PreTokenizer;
use super::vocab::Vocab;

/// GPT-2's reversible map from bytes to printable characters, and its inverse.
#[derive(Debug, Clone)]
pub(crate) struct ByteMap {
    to_char: [char; 256],
    to_byte: HashMap<char, u8>,
}

impl ByteMap {
    pub(crate) fn new() -> ByteMap {
        // Printable Latin-1 bytes map to themselves; the rest (controls, space, …) are
        // shifted to U+0100 and up, in byte order.
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut to_char = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            to_char[b as usize] = if printable(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        let to_byte = to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        ByteMap { to_char, to_byte }
    }

    /// Encodes raw bytes as byte-level text.
    pub(crate) fn encode(&self, bytes: &[u8]) -> String {
        bytes.iter().map(|&b| self.to_char[b as usize]).collect()
    }

    /// Decodes byte-level text back to bytes; characters outside the map are kept as UTF-8.
    pub(crate) fn decode_into(&self, text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match self.to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
    }
}

/// The merge table and pre-tokenizer of a BPE vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    /// `"left right"` → rank (its line number in `tokenizer.ggml.merges`).
    ranks: HashMap<String, u32>,
    pre: PreTokenizer,
    pub(crate) bytes: ByteMap,
}

/// A candidate merge of the symbols at `left` and `right`.
#[derive(Debug, PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    /// Byte length of the merged text, to detect bigrams made stale by other merges.
    len: usize,
}

impl Ord for Bigram {
    /// The heap pops the lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A run of the word's text, linked to its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Bpe {
    pub(crate) fn new(merges: &[String], pre: PreTokenizer) -> Bpe {
        let ranks = merges
            .iter()
            .enumerate()
            .map(|(i, m)| (m.clone(), i as u32))
            .collect();
        Bpe {
            ranks,
            pre,
            bytes: ByteMap::new(),
        }
    }

    /// Tokenizes plain text (no special tokens) and appends the ids to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut key = String::new();
        for word in self.pre.split(text) {
            let word = self.bytes.encode(word.as_bytes());
            self.encode_word(vocab, &word, &mut key, out);
        }
    }

    fn rank(&self, word: &str, a: &Symbol, b: &Symbol, key: &mut String) -> Option<u32> {
        key.clear();
        key.push_str(&word[a.start..a.start + a.len]);
        key.push(' ');
        key.push_str(&word[b.start..b.start + b.len]);
        self.ranks.get(key.as_str()).copied()
    }

    fn encode_word(&self, vocab: &Vocab, word: &str, key: &mut String, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        for (i, (start, c)) in word.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = None;
        }
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Bigram>, syms: &[Symbol], l: usize, key: &mut String| {
            let Some(r) = syms[l].next else { return };
            if let Some(rank) = self.rank(word, &syms[l], &syms[r], key) {
                queue.push(Bigram {
                    rank,
                    left: l,
                    right: r,
                    len: syms[l].len + syms[r].len,
                });
            }
        };
        for i in 0..symbols.len() {
            push(&mut queue, &symbols, i, key);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Skip bigrams whose symbols have changed since they were queued.
            if l.len == 0 || r.len == 0 || l.next != Some(b.right) || l.len + r.len != b.len {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.left].next = r.next;
            symbols[b.right].len = 0;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                push(&mut queue, &symbols, p, key);
            }
            push(&mut queue, &symbols, b.left, key);
        }
        let mut i = (!symbols.is_empty()).then_some(0);
        while let Some(s) = i.map(|i| symbols[i]) {
            let text = &word[s.start..s.start + s.len];
            match vocab.id(text) {
                Some(id) => out.push(id),
                // A symbol with no token: llama.cpp looks each of its bytes up alone, so
                // only single-byte (ASCII) characters can still be found.
                None => out.extend(
                    text.char_indices()
                        .filter(|(_, c)| c.is_ascii())
                        .filter_map(|(j, _)| vocab.id(&text[j..j + 1])),
                ),
            }
            i = s.next;
        }
    }
}
