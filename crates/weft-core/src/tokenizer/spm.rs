//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm` does it.
//!
//! Spaces become `▁`; the text is split into UTF-8 characters; the adjacent pair whose
//! concatenation is a token with the highest score is merged until no pair is a token (ties go
//! to the leftmost pair). A final piece that is not a token falls back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// SentencePiece's visible space, U+2581.
pub(crate) const SPACE: char = '\u{2581}';

/// A candidate merge of the symbols at `left` and `right`.
#[derive(Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text, to detect bigrams made stale by other merges.
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// The heap pops the highest score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Tokenizes one fragment of plain text (no special tokens), appending ids to `out`.
/// `text` must already have its spaces escaped to `▁`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
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
    let push = |queue: &mut BinaryHeap<Bigram>, syms: &[Symbol], l: usize| {
        let Some(r) = syms[l].next else { return };
        let (a, b) = (syms[l], syms[r]);
        let merged = &text[a.start..b.start + b.len];
        if let Some(id) = vocab.id(merged) {
            queue.push(Bigram {
                score: vocab.scores[id as usize],
                left: l,
                right: r,
                len: merged.len(),
            });
        }
    };
    for i in 0..symbols.len() {
        push(&mut queue, &symbols, i);
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
            push(&mut queue, &symbols, p);
        }
        push(&mut queue, &symbols, b.left);
    }
    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(s) = i.map(|i| symbols[i]) {
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            // Every merged piece is a token, so only single characters get here: spell them
            // as byte tokens, else as the byte itself, else as the unknown token.
            None => out.extend(piece.bytes().filter_map(|b| {
                vocab
                    .id(&format!("<0x{b:02X}>"))
                    .or_else(|| b.is_ascii().then(|| vocab.id(&char::from(b).to_string()))?)
                    .or(vocab.special.unk)
            })),
        }
        i = s.next;
    }
}

/// Replaces every space with `▁`.
pub(crate) fn escape_spaces(text: &str) -> String {
    text.replace(' ', "\u{2581}")
}
