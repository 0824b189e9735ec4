//! The encoding pipeline of a Hugging Face BPE `tokenizer.json`, step by step as the `tokenizers`
//! library runs it (checked against tokenizers 0.23.3):
//!
//! 1. Added tokens are cut out of the raw text, leftmost match first and the longest among
//!    those starting there (special ones only when special-token parsing is on; a special
//!    token's text left as plain text still hides any other added token inside it). `lstrip` /
//!    `rstrip` swallow the whitespace beside a match; `single_word` tokens only match whole.
//! 2. Each remaining piece is normalized; added tokens marked `normalized` are then cut out of
//!    the normalized text (matched in their normalized form).
//! 3. Each remaining piece is pre-tokenized into words by the pre-tokenizer steps, in order.
//! 4. The BPE model tokenizes each word ([`super::hf_bpe`]).
//!
//! Decoding goes token by token ([`Decoding`]), so streaming gives the same text.

use unicode_normalization::UnicodeNormalization;

use super::bpe::ByteMap;
use super::hf_bpe::BpeModel;
use super::pretokenize::PreTokenizer;
use super::vocab::Vocab;

/// One normalizer of a `Sequence`.
#[derive(Debug, Clone)]
pub(crate) enum Normalizer {
    /// Every occurrence of a literal string.
    Replace {
        pattern: String,
        content: String,
    },
    /// Prepends a string to non-empty text.
    Prepend(String),
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
    Lowercase,
    /// Trims whitespace at either end.
    Strip {
        left: bool,
        right: bool,
    },
}

impl Normalizer {
    pub fn apply(&self, text: String) -> String {
        match self {
            Self::Replace { pattern, content } if !pattern.is_empty() => {
                text.replace(pattern.as_str(), content)
            }
            Self::Replace { .. } => text,
            Self::Prepend(p) if !text.is_empty() => format!("{p}{text}"),
            Self::Prepend(_) => text,
            Self::Nfc => text.nfc().collect(),
            Self::Nfd => text.nfd().collect(),
            Self::Nfkc => text.nfkc().collect(),
            Self::Nfkd => text.nfkd().collect(),
            Self::Lowercase => text.chars().flat_map(char::to_lowercase).collect(),
            Self::Strip { left, right } => {
                let mut t = text.as_str();
                if *left {
                    t = t.trim_start();
                }
                if *right {
                    t = t.trim_end();
                }
                t.to_string()
            }
        }
    }
}

/// `text` through a chain of normalizers.
pub(crate) fn normalize(chain: &[Normalizer], text: &str) -> String {
    chain.iter().fold(text.to_string(), |s, n| n.apply(s))
}

/// How a split treats the matches (`SplitDelimiterBehavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behavior {
    Removed,
    Isolated,
    MergedWithPrevious,
    MergedWithNext,
    Contiguous,
}

/// When `Metaspace` prepends its replacement character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrependScheme {
    Always,
    /// Only to the piece at the very start of the input.
    First,
    Never,
}

/// One pre-tokenizer of a `Sequence`.
#[derive(Debug, Clone)]
pub(crate) enum PreStep {
    /// Optionally a space in front, optionally GPT-2's split, then bytes to GPT-2's characters.
    ByteLevel {
        add_prefix_space: bool,
        use_regex: bool,
    },
    /// A split on a literal string.
    Split {
        pattern: String,
        behavior: Behavior,
        invert: bool,
    },
    /// A split on one of the regexes weft implements by hand, matches isolated.
    Regex(PreTokenizer),
    /// Numbers apart from the rest: each digit alone, or runs of digits.
    Digits { individual: bool },
    /// Spaces to `replacement`, which is prepended per the scheme and optionally starts words.
    Metaspace {
        replacement: char,
        prepend: PrependScheme,
        split: bool,
    },
}

/// A piece of text being pre-tokenized; `first` when it starts at the start of the input.
struct Piece {
    text: String,
    first: bool,
}

/// `(start, end, is_match)` spans covering a text.
type Spans = Vec<(usize, usize, bool)>;

/// Non-overlapping occurrences of `pattern` and the text between them.
fn literal_spans(text: &str, pattern: &str) -> Spans {
    let mut spans = Vec::new();
    let mut at = 0;
    if !pattern.is_empty() {
        for (i, m) in text.match_indices(pattern) {
            if i > at {
                spans.push((at, i, false));
            }
            spans.push((i, i + m.len(), true));
            at = i + m.len();
        }
    }
    if at < text.len() || spans.is_empty() {
        spans.push((at, text.len(), false));
    }
    spans
}

/// Each char matching `f` as a match of its own, and the runs between them.
fn char_spans(text: &str, f: impl Fn(char) -> bool) -> Spans {
    let mut spans: Spans = Vec::new();
    for (i, c) in text.char_indices() {
        let end = i + c.len_utf8();
        match spans.last_mut() {
            Some(last) if !f(c) && !last.2 => last.1 = end,
            _ => spans.push((i, end, f(c))),
        }
    }
    spans
}

/// The pieces a split keeps, as the library's `NormalizedString::split` makes them.
fn apply_behavior(spans: Spans, behavior: Behavior, invert: bool) -> Vec<(usize, usize)> {
    let spans = spans.into_iter().map(|(a, b, m)| (a, b, m != invert));
    // (start, end, remove)
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    let mut prev = false;
    match behavior {
        Behavior::Isolated => out = spans.map(|(a, b, _)| (a, b, false)).collect(),
        Behavior::Removed => out = spans.collect(),
        Behavior::Contiguous => {
            for (a, b, m) in spans {
                match out.last_mut() {
                    Some(last) if m == prev => last.1 = b,
                    _ => out.push((a, b, false)),
                }
                prev = m;
            }
        }
        Behavior::MergedWithPrevious => {
            for (a, b, m) in spans {
                match out.last_mut() {
                    Some(last) if m && !prev => last.1 = b,
                    _ => out.push((a, b, false)),
                }
                prev = m;
            }
        }
        Behavior::MergedWithNext => {
            let spans: Vec<_> = spans.collect();
            for &(a, b, m) in spans.iter().rev() {
                match out.last_mut() {
                    Some(last) if m && !prev => last.0 = a,
                    _ => out.push((a, b, false)),
                }
                prev = m;
            }
            out.reverse();
        }
    }
    out.into_iter()
        .filter(|&(a, b, remove)| !remove && a < b)
        .map(|(a, b, _)| (a, b))
        .collect()
}

impl PreStep {
    fn apply(&self, piece: Piece, bytes: &ByteMap, out: &mut Vec<Piece>) {
        let Piece { mut text, first } = piece;
        let ranges = match self {
            Self::ByteLevel {
                add_prefix_space,
                use_regex,
            } => {
                if *add_prefix_space && !text.starts_with(' ') {
                    text.insert(0, ' ');
                }
                let words = if *use_regex {
                    PreTokenizer::Gpt2.split(&text)
                } else {
                    vec![text.as_str()]
                };
                for (i, w) in words.into_iter().enumerate() {
                    out.push(Piece {
                        text: bytes.encode(w.as_bytes()),
                        first: first && i == 0,
                    });
                }
                return;
            }
            Self::Regex(pre) => {
                for (i, w) in pre.split(&text).into_iter().enumerate() {
                    out.push(Piece {
                        text: w.to_string(),
                        first: first && i == 0,
                    });
                }
                return;
            }
            Self::Split {
                pattern,
                behavior,
                invert,
            } => apply_behavior(literal_spans(&text, pattern), *behavior, *invert),
            Self::Digits { individual } => {
                let behavior = if *individual {
                    Behavior::Isolated
                } else {
                    Behavior::Contiguous
                };
                apply_behavior(char_spans(&text, char::is_numeric), behavior, false)
            }
            Self::Metaspace {
                replacement,
                prepend,
                split,
            } => {
                text = text.replace(' ', replacement.encode_utf8(&mut [0; 4]));
                let add = match prepend {
                    PrependScheme::Always => true,
                    PrependScheme::First => first,
                    PrependScheme::Never => false,
                };
                if add && !text.starts_with(*replacement) {
                    text.insert(0, *replacement);
                }
                if !*split {
                    out.push(Piece { text, first });
                    return;
                }
                let spans = char_spans(&text, |c| c == *replacement);
                apply_behavior(spans, Behavior::MergedWithNext, false)
            }
        };
        for (a, b) in ranges {
            out.push(Piece {
                text: text[a..b].to_string(),
                first: first && a == 0,
            });
        }
    }
}

/// An added token's matching rules.
#[derive(Debug, Clone)]
pub(crate) struct AddedToken {
    pub id: u32,
    pub special: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    pub single_word: bool,
}

/// A node of [`AddedSet`]'s trie: children (byte, node) sorted by byte, and the token ending
/// here.
type TrieNode = (Vec<(u8, u32)>, Option<AddedToken>);

/// A byte trie of added-token texts, for leftmost-longest matching.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddedSet {
    nodes: Vec<TrieNode>,
}

/// A piece of a text split on added tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Text(usize, usize),
    Token(u32),
}

/// `\w` of the library's `single_word` check (the `regex` crate's: Alphabetic, Nd, marks,
/// connector punctuation, joiners).
fn is_word_char(c: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory as G};
    c.is_alphabetic()
        || matches!(c, '\u{200C}' | '\u{200D}')
        || matches!(
            get_general_category(c),
            G::DecimalNumber
                | G::NonspacingMark
                | G::SpacingMark
                | G::EnclosingMark
                | G::ConnectorPunctuation
        )
}

impl AddedSet {
    pub fn insert(&mut self, text: &str, token: AddedToken) {
        if text.is_empty() {
            return;
        }
        if self.nodes.is_empty() {
            self.nodes.push(Default::default());
        }
        let mut node = 0usize;
        for b in text.bytes() {
            node = match self.nodes[node].0.binary_search_by_key(&b, |e| e.0) {
                Ok(i) => self.nodes[node].0[i].1 as usize,
                Err(i) => {
                    let child = self.nodes.len();
                    self.nodes[node].0.insert(i, (b, child as u32));
                    self.nodes.push(Default::default());
                    child
                }
            };
        }
        // As in the library, the last token given a text wins.
        self.nodes[node].1 = Some(token);
    }

    /// The longest token starting at `at`: its end and rules.
    fn longest_at(&self, text: &[u8], at: usize) -> Option<(usize, &AddedToken)> {
        let mut node = 0usize;
        let mut best = None;
        for (i, b) in text[at..].iter().enumerate() {
            let children = &self.nodes[node].0;
            match children.binary_search_by_key(b, |e| e.0) {
                Ok(j) => node = children[j].1 as usize,
                Err(_) => break,
            }
            if let Some(t) = &self.nodes[node].1 {
                best = Some((at + i + 1, t));
            }
        }
        best
    }

    /// Splits `text` on the tokens (`AddedVocabulary::find_matches`).
    fn split(&self, text: &str, parse_special: bool) -> Vec<Cut> {
        let mut cuts = Vec::new();
        let mut done = 0;
        if !self.nodes.is_empty() {
            let bytes = text.as_bytes();
            let mut at = 0;
            while at < bytes.len() {
                let Some((end, tok)) = self.longest_at(bytes, at) else {
                    at += 1;
                    continue;
                };
                let (start, mut stop) = (at, end);
                at = end;
                if tok.special && !parse_special {
                    continue;
                }
                if tok.single_word {
                    let before = text[..start].chars().next_back().is_some_and(is_word_char);
                    let after = text[stop..].chars().next().is_some_and(is_word_char);
                    if before || after {
                        continue;
                    }
                }
                let mut start = start;
                if tok.lstrip {
                    let trimmed = text[..start].trim_end_matches(char::is_whitespace).len();
                    start = trimmed.max(done);
                }
                if tok.rstrip {
                    stop = text.len() - text[stop..].trim_start_matches(char::is_whitespace).len();
                }
                if done < start {
                    cuts.push(Cut::Text(done, start));
                }
                cuts.push(Cut::Token(tok.id));
                done = stop;
            }
        }
        if done < text.len() {
            cuts.push(Cut::Text(done, text.len()));
        }
        cuts
    }
}

/// How token texts become bytes (the `decoder`), token by token.
#[derive(Debug, Clone, Default)]
pub(crate) struct Decoding {
    /// GPT-2's characters back to bytes.
    pub byte_level: bool,
    /// `<0xXX>` tokens are that byte.
    pub byte_fallback: bool,
    /// Literal replacements, in order (`"▁"` → `" "`).
    pub replace: Vec<(String, String)>,
    /// Up to this many of this char are stripped from the start of a decoded text.
    pub strip_start: Option<(char, usize)>,
}

impl Decoding {
    /// Appends the bytes of an ordinary token's text.
    pub fn append(&self, bytes: &ByteMap, text: &str, out: &mut Vec<u8>) {
        // The library's ByteFallback: exactly `<0xXX>`.
        if self.byte_fallback && text.len() == 6 {
            if let Some(b) = super::parse_byte_token(text) {
                out.push(b);
                return;
            }
        }
        let mut text = std::borrow::Cow::Borrowed(text);
        for (from, to) in &self.replace {
            if text.contains(from.as_str()) {
                text = text.replace(from.as_str(), to).into();
            }
        }
        if self.byte_level {
            bytes.decode_into(&text, out);
        } else {
            out.extend_from_slice(text.as_bytes());
        }
    }
}

/// The whole pipeline of a BPE `tokenizer.json`.
#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    /// Added tokens matched in the raw text, and those matched after normalization.
    pub raw_added: AddedSet,
    pub normalized_added: AddedSet,
    pub normalizers: Vec<Normalizer>,
    pub pre: Vec<PreStep>,
    pub model: BpeModel,
    pub decoding: Decoding,
    pub bytes: ByteMap,
}

impl Pipeline {
    fn normalize(&self, text: &str) -> String {
        normalize(&self.normalizers, text)
    }

    /// Tokenizes `text` (no post-processing), appending ids to `out`.
    pub fn encode(&self, vocab: &Vocab, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        for cut in self.raw_added.split(text, parse_special) {
            let (a, b) = match cut {
                Cut::Token(id) => {
                    out.push(id);
                    continue;
                }
                Cut::Text(a, b) => (a, b),
            };
            let normalized = self.normalize(&text[a..b]);
            for sub in self.normalized_added.split(&normalized, parse_special) {
                let (c, d) = match sub {
                    Cut::Token(id) => {
                        out.push(id);
                        continue;
                    }
                    Cut::Text(c, d) => (c, d),
                };
                let mut pieces = vec![Piece {
                    text: normalized[c..d].to_string(),
                    first: a == 0 && c == 0,
                }];
                for step in &self.pre {
                    let mut next = Vec::with_capacity(pieces.len() * 2);
                    for p in pieces {
                        step.apply(p, &self.bytes, &mut next);
                    }
                    pieces = next;
                }
                for p in &pieces {
                    self.model.tokenize(vocab, &p.text, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split<'a>(text: &'a str, pattern: &str, behavior: Behavior, invert: bool) -> Vec<&'a str> {
        apply_behavior(literal_spans(text, pattern), behavior, invert)
            .into_iter()
            .map(|(a, b)| &text[a..b])
            .collect()
    }

    /// Expectations: `tokenizers.pre_tokenizers.Split(" ", behavior)` 0.23.3.
    #[test]
    fn split_behaviors_follow_the_library() {
        let t = "a  b c";
        assert_eq!(split(t, " ", Behavior::Removed, false), ["a", "b", "c"]);
        assert_eq!(
            split(t, " ", Behavior::Isolated, false),
            ["a", " ", " ", "b", " ", "c"]
        );
        assert_eq!(
            split(t, " ", Behavior::MergedWithPrevious, false),
            ["a ", " ", "b ", "c"]
        );
        assert_eq!(
            split(t, " ", Behavior::MergedWithNext, false),
            ["a", " ", " b", " c"]
        );
        assert_eq!(
            split(t, " ", Behavior::Contiguous, false),
            ["a", "  ", "b", " ", "c"]
        );
        assert_eq!(split(t, " ", Behavior::Removed, true), [" ", " ", " "]);
        assert_eq!(
            split("", " ", Behavior::Isolated, false),
            Vec::<&str>::new()
        );
    }

    fn pre(step: PreStep, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let piece = Piece {
            text: text.to_string(),
            first: true,
        };
        step.apply(piece, &ByteMap::new(), &mut out);
        out.into_iter().map(|p| p.text).collect()
    }

    /// Expectations: `Metaspace(prepend_scheme="first")` and `Digits(False)`, tokenizers 0.23.3.
    #[test]
    fn metaspace_and_digits_follow_the_library() {
        let meta = PreStep::Metaspace {
            replacement: '\u{2581}',
            prepend: PrependScheme::First,
            split: true,
        };
        assert_eq!(pre(meta, "hello  world"), ["▁hello", "▁", "▁world"]);
        let digits = PreStep::Digits { individual: false };
        assert_eq!(pre(digits, "a12b3"), ["a", "12", "b", "3"]);
    }

    #[test]
    fn added_tokens_match_leftmost_longest() {
        let mut set = AddedSet::default();
        let tok = |id, special| AddedToken {
            id,
            special,
            lstrip: false,
            rstrip: false,
            single_word: false,
        };
        set.insert("ab", tok(1, false));
        set.insert("bcd", tok(2, false));
        set.insert("<s>", tok(3, true));
        assert_eq!(
            set.split("xabcd", true),
            [Cut::Text(0, 1), Cut::Token(1), Cut::Text(3, 5)]
        );
        // A special token left as text still hides the added tokens inside it.
        set.insert("s>ab", tok(4, false));
        assert_eq!(set.split("<s>ab", false), [Cut::Text(0, 3), Cut::Token(1)]);
        assert_eq!(set.split("<s>ab", true), [Cut::Token(3), Cut::Token(1)]);
    }
}
