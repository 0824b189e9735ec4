//! BERT-style tokenization: text → normalized text → words → WordPiece ids.
//!
//! Follows Hugging Face `tokenizers` (checked against 0.23.3) for a tokenizer.json whose
//! normalizer is `BertNormalizer`, pre-tokenizer `BertPreTokenizer` and model `WordPiece`:
//!
//! 1. [`BertNormalizer::normalize`]: drop control chars, NUL and U+FFFD and map whitespace to
//!    ' ' (`clean_text`); put spaces around CJK ideographs (`handle_chinese_chars`); NFD and drop
//!    nonspacing marks (`strip_accents`, which defaults to `lowercase`); lowercase char by char.
//! 2. [`bert_pre_tokenize`]: split on whitespace; every punctuation char is a word of its own.
//! 3. [`WordPiece::encode_word`]: greedy longest-match-first, continuation pieces carry `##`.
//!
//! Special tokens (`[CLS]`, `[SEP]`) and truncation are the caller's job, and so is HF's
//! matching of special-token strings in the raw text (HF encodes an input `"[SEP]"` as 102).
//!
//! HF classifies chars with the `unicode_categories` 0.1.1 crate, whose tables are Unicode 8.0:
//! chars that became Cf, P* or Mn later are plain letters to HF (not removed, not split, not
//! stripped). `NEWER_THAN_UNICODE_8` reproduces that on top of `unicode-general-category`.
//! (HF's NFD is Unicode 9, ours newer: the few newer decompositions and combining classes only
//! touch post-2016 scripts, absent from BERT vocabularies, whose words are `[UNK]` either way.)

use std::collections::HashMap;
use unicode_general_category::{get_general_category, GeneralCategory as Gc};
use unicode_normalization::UnicodeNormalization;

/// BertNormalizer options, as in tokenizer.json's "normalizer" object.
#[derive(Debug, Clone)]
pub struct BertNormalizer {
    pub clean_text: bool,
    pub handle_chinese_chars: bool,
    pub strip_accents: Option<bool>,
    pub lowercase: bool,
}

impl BertNormalizer {
    /// The normalized text. `strip_accents: None` follows `lowercase`, as in HF.
    pub fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + text.len() / 4);
        for c in text.chars() {
            let mut c = c;
            if self.clean_text {
                if c == '\0' || c == '\u{FFFD}' || is_control(c) {
                    continue;
                }
                if c.is_whitespace() {
                    c = ' ';
                }
            }
            if self.handle_chinese_chars && is_chinese_char(c) {
                out.extend([' ', c, ' ']);
            } else {
                out.push(c);
            }
        }
        if self.strip_accents.unwrap_or(self.lowercase) {
            out = out.nfd().filter(|&c| !is_nonspacing_mark(c)).collect();
        }
        if self.lowercase {
            // Char by char like HF (no final-sigma rule: "ΣΑΣ" → "σασ", not "σας").
            out = out.chars().flat_map(char::to_lowercase).collect();
        }
        out
    }
}

/// BertPreTokenizer: split on whitespace (dropped), and every punctuation char is its own piece.
pub fn bert_pre_tokenize(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut word_start = None;
    for (i, c) in text.char_indices() {
        let space = c.is_whitespace();
        if space || is_bert_punc(c) {
            if let Some(s) = word_start.take() {
                pieces.push(&text[s..i]);
            }
            if !space {
                pieces.push(&text[i..i + c.len_utf8()]);
            }
        } else if word_start.is_none() {
            word_start = Some(i);
        }
    }
    if let Some(s) = word_start {
        pieces.push(&text[s..]);
    }
    pieces
}

/// The WordPiece model: a vocabulary and the greedy longest-match-first split of a word.
#[derive(Debug, Clone)]
pub struct WordPiece {
    vocab: HashMap<String, u32>,
    unk_id: u32,
    continuing_subword_prefix: String,
    max_input_chars_per_word: usize,
    /// Bytes of the longest vocabulary entry: no longer piece can match, so the search for
    /// one starts there (HF starts at the word's end: the same pieces, but a long word with a
    /// file's large `max_input_chars_per_word` then took cubic time).
    longest_entry: usize,
}

impl WordPiece {
    /// `None` if `unk_token` is not in `vocab`.
    pub fn new(
        vocab: HashMap<String, u32>,
        unk_token: &str,
        continuing_subword_prefix: String,
        max_input_chars_per_word: usize,
    ) -> Option<WordPiece> {
        let unk_id = *vocab.get(unk_token)?;
        let longest_entry = vocab.keys().map(String::len).max().unwrap_or(0);
        Some(WordPiece {
            longest_entry,
            vocab,
            unk_id,
            continuing_subword_prefix,
            max_input_chars_per_word,
        })
    }

    /// Appends the ids of one pre-tokenized word: at each position the longest vocabulary entry
    /// (prefixed with `##` past the first piece). A word longer than `max_input_chars_per_word`
    /// chars, or with a position where nothing matches, is a single `[UNK]`.
    pub fn encode_word(&self, word: &str, out: &mut Vec<u32>) {
        if word.chars().count() > self.max_input_chars_per_word {
            out.push(self.unk_id);
            return;
        }
        let first = out.len();
        let mut key = String::new();
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len().min(start + self.longest_entry);
            while !word.is_char_boundary(end) {
                end -= 1;
            }
            let id = loop {
                let piece = &word[start..end];
                let found = if start == 0 {
                    self.vocab.get(piece)
                } else {
                    key.clear();
                    key.push_str(&self.continuing_subword_prefix);
                    key.push_str(piece);
                    self.vocab.get(key.as_str())
                };
                if let Some(&id) = found {
                    break Some(id);
                }
                // Drop the last char (none left: no entry is as short as one char here).
                match piece.chars().next_back() {
                    Some(c) if end - c.len_utf8() > start => end -= c.len_utf8(),
                    _ => break None,
                }
            };
            match id {
                Some(id) => out.push(id),
                None => {
                    out.truncate(first);
                    out.push(self.unk_id);
                    return;
                }
            }
            start = end;
        }
    }
}

/// HF's CJK ideograph blocks (note the gap at U+2B820..U+2B91F, kept for parity).
fn is_chinese_char(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// Removed by `clean_text`: categories Cc, Cf, Co (as of Unicode 8), except \t \n \r.
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r')
        && matches!(
            get_general_category(c),
            Gc::Control | Gc::Format | Gc::PrivateUse
        )
        && !newer_than_unicode_8(c)
}

/// HF's `is_bert_punc`: ASCII punctuation (which includes symbols like `$+<=>^|~`) or P*.
fn is_bert_punc(c: char) -> bool {
    use Gc::*;
    c.is_ascii_punctuation()
        || matches!(c, '\u{166D}' | '\u{111C9}') // P* in Unicode 8, recategorised since
        || (matches!(
            get_general_category(c),
            ConnectorPunctuation | DashPunctuation | OpenPunctuation | ClosePunctuation
                | InitialPunctuation | FinalPunctuation | OtherPunctuation
        ) && !newer_than_unicode_8(c))
}

/// Mn (as of Unicode 8): what `strip_accents` drops after NFD.
fn is_nonspacing_mark(c: char) -> bool {
    matches!(c, '\u{1734}' | '\u{1171E}') // Mn in Unicode 8, recategorised since
        || (get_general_category(c) == Gc::NonspacingMark && !newer_than_unicode_8(c))
}

fn newer_than_unicode_8(c: char) -> bool {
    // In a range iff an odd number of bounds is below `c`, or `c` is the next bound.
    let (c, table) = (c as u32, NEWER_THAN_UNICODE_8);
    let below = table.partition_point(|&b| b < c);
    below % 2 == 1 || table.get(below) == Some(&c)
}

/// Inclusive ranges (start, end pairs) of the chars that `unicode-general-category` 1.1
/// (Unicode 16) puts in Cf, P* or Mn but HF's `unicode_categories` 0.1.1 does not: found by
/// comparing the two crates over every char.
const NEWER_THAN_UNICODE_8: &[u32] = &[
    0x61D, 0x61D, 0x7FD, 0x7FD, 0x890, 0x891, 0x897, 0x89F, 0x8CA, 0x8E2, 0x9FD, 0x9FE, 0xA76,
    0xA76, 0xAFA, 0xAFF, 0xB55, 0xB55, 0xC04, 0xC04, 0xC3C, 0xC3C, 0xC77, 0xC77, 0xC84, 0xC84,
    0xD00, 0xD00, 0xD3B, 0xD3C, 0xD81, 0xD81, 0xEBA, 0xEBA, 0xECE, 0xECE, 0x180F, 0x180F, 0x1885,
    0x1886, 0x1ABF, 0x1ACE, 0x1B4E, 0x1B4F, 0x1B7D, 0x1B7F, 0x1DF6, 0x1DFB, 0x2E43, 0x2E4F, 0x2E52,
    0x2E5D, 0xA82C, 0xA82C, 0xA8C5, 0xA8C5, 0xA8FF, 0xA8FF, 0xA9BD, 0xA9BD, 0x10D24, 0x10D27,
    0x10D69, 0x10D6E, 0x10EAB, 0x10EAD, 0x10EFC, 0x10EFF, 0x10F46, 0x10F50, 0x10F55, 0x10F59,
    0x10F82, 0x10F89, 0x11070, 0x11070, 0x11073, 0x11074, 0x110C2, 0x110C2, 0x110CD, 0x110CD,
    0x111C9, 0x111C9, 0x111CF, 0x111CF, 0x1123E, 0x1123E, 0x11241, 0x11241, 0x1133B, 0x1133B,
    0x113BB, 0x113C0, 0x113CE, 0x113CE, 0x113D0, 0x113D0, 0x113D2, 0x113D2, 0x113D4, 0x113D5,
    0x113D7, 0x113D8, 0x113E1, 0x113E2, 0x11438, 0x1143F, 0x11442, 0x11444, 0x11446, 0x11446,
    0x1144B, 0x1144F, 0x1145A, 0x1145B, 0x1145D, 0x1145E, 0x11660, 0x1166C, 0x116B9, 0x116B9,
    0x1182F, 0x11837, 0x11839, 0x1183B, 0x1193B, 0x1193C, 0x1193E, 0x1193E, 0x11943, 0x11946,
    0x119D4, 0x119D7, 0x119DA, 0x119DB, 0x119E0, 0x119E0, 0x119E2, 0x119E2, 0x11A01, 0x11A0A,
    0x11A33, 0x11A38, 0x11A3B, 0x11A47, 0x11A51, 0x11A56, 0x11A59, 0x11A5B, 0x11A8A, 0x11A96,
    0x11A98, 0x11A9C, 0x11A9E, 0x11AA2, 0x11B00, 0x11B09, 0x11BE1, 0x11BE1, 0x11C30, 0x11C36,
    0x11C38, 0x11C3D, 0x11C3F, 0x11C3F, 0x11C41, 0x11C45, 0x11C70, 0x11C71, 0x11C92, 0x11CA7,
    0x11CAA, 0x11CB0, 0x11CB2, 0x11CB3, 0x11CB5, 0x11CB6, 0x11D31, 0x11D36, 0x11D3A, 0x11D3A,
    0x11D3C, 0x11D3D, 0x11D3F, 0x11D45, 0x11D47, 0x11D47, 0x11D90, 0x11D91, 0x11D95, 0x11D95,
    0x11D97, 0x11D97, 0x11EF3, 0x11EF4, 0x11EF7, 0x11EF8, 0x11F00, 0x11F01, 0x11F36, 0x11F3A,
    0x11F40, 0x11F40, 0x11F42, 0x11F4F, 0x11F5A, 0x11F5A, 0x11FFF, 0x11FFF, 0x12FF1, 0x12FF2,
    0x13430, 0x13440, 0x13447, 0x13455, 0x1611E, 0x16129, 0x1612D, 0x1612F, 0x16D6D, 0x16D6F,
    0x16E97, 0x16E9A, 0x16F4F, 0x16F4F, 0x16FE2, 0x16FE2, 0x16FE4, 0x16FE4, 0x1CF00, 0x1CF2D,
    0x1CF30, 0x1CF46, 0x1E000, 0x1E006, 0x1E008, 0x1E018, 0x1E01B, 0x1E021, 0x1E023, 0x1E024,
    0x1E026, 0x1E02A, 0x1E08F, 0x1E08F, 0x1E130, 0x1E136, 0x1E2AE, 0x1E2AE, 0x1E2EC, 0x1E2EF,
    0x1E4EC, 0x1E4EF, 0x1E5EE, 0x1E5EF, 0x1E5FF, 0x1E5FF, 0x1E944, 0x1E94A, 0x1E95E, 0x1E95F,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn bert() -> BertNormalizer {
        BertNormalizer {
            clean_text: true,
            handle_chinese_chars: true,
            strip_accents: None,
            lowercase: true,
        }
    }

    fn model() -> WordPiece {
        let words = ["[UNK]", "un", "##aff", "##able", "a", "##b", "é", "##é"];
        let vocab = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.to_string(), i as u32))
            .collect();
        WordPiece::new(vocab, "[UNK]", "##".into(), 9).expect("[UNK] is in the vocab")
    }

    fn encode(wp: &WordPiece, word: &str) -> Vec<u32> {
        let mut out = vec![99];
        wp.encode_word(word, &mut out);
        out
    }

    #[test]
    fn normalizer() {
        let n = bert();
        assert_eq!(
            n.normalize("Café NAÏVE\tx\u{0}y\u{FFFD}\u{7}z\u{A0}!"),
            "cafe naive xyz !"
        );
        assert_eq!(n.normalize("ab中文c"), "ab 中  文 c");
        assert_eq!(n.normalize("x\u{2B820}y"), "x\u{2B820}y"); // HF's CJK gap
        assert_eq!(n.normalize("ΣΑΣ İ ẞ"), "σασ i ß");
        // Cc, Cf and Co are dropped. Unicode 8 tables: a later Cf is kept, a later Mn is not
        // stripped, and U+1734 (Mc now, Mn then) is.
        assert_eq!(n.normalize("\u{200B}\u{AD}\u{E001}\u{85}"), "");
        assert_eq!(n.normalize("\u{890}a\u{1DF6}\u{1734}"), "\u{890}a\u{1DF6}");
        let keep = BertNormalizer {
            strip_accents: Some(false),
            ..bert()
        };
        assert_eq!(keep.normalize("Él"), "él");
        let raw = BertNormalizer {
            clean_text: false,
            handle_chinese_chars: false,
            ..keep
        };
        assert_eq!(raw.normalize("A\t\u{0}中"), "a\t\u{0}中");
    }

    #[test]
    fn pre_tokenizer() {
        let pieces = bert_pre_tokenize("  Hey friend!  How are\tyou?!? a-b $5 «x» ");
        let want = [
            "Hey", "friend", "!", "How", "are", "you", "?", "!", "?", "a", "-", "b", "$", "5",
        ];
        assert_eq!(pieces[..14], want);
        assert_eq!(pieces[14..], ["«", "x", "»"]);
        assert!(bert_pre_tokenize(" \n ").is_empty());
        assert_eq!(
            bert_pre_tokenize("foo\u{2E43}bar\u{166D}"),
            ["foo\u{2E43}bar", "\u{166D}"]
        );
    }

    #[test]
    fn wordpiece() {
        let wp = model();
        assert_eq!(encode(&wp, "unaffable"), [99, 1, 2, 3]);
        assert_eq!(encode(&wp, "abbbbbbbb"), [99, 4, 5, 5, 5, 5, 5, 5, 5, 5]); // 9 chars: the limit
        assert_eq!(encode(&wp, "abbbbbbbbb"), [99, 0]); // 10 chars
        assert_eq!(encode(&wp, "b"), [99, 0]); // "##b" only continues a word
        assert_eq!(encode(&wp, "unx"), [99, 0]); // no partial output before [UNK]
        assert_eq!(encode(&wp, &"é".repeat(9)), [99, 6, 7, 7, 7, 7, 7, 7, 7, 7]); // 18 bytes
        assert_eq!(encode(&wp, &"é".repeat(10)), [99, 0]);
        assert_eq!(encode(&wp, ""), [99]);
        assert!(WordPiece::new(HashMap::new(), "[UNK]", "##".into(), 100).is_none());
    }

    /// A file may raise `max_input_chars_per_word` far past HF's 100: a long word then splits
    /// as HF splits it (pieces no longer than the longest entry are all that can match).
    #[test]
    fn a_long_word_under_a_large_limit_splits_into_its_pieces() {
        let mut wp = model();
        wp.max_input_chars_per_word = usize::MAX;
        let mut want = vec![99, 4];
        want.resize(2 + 20_000, 5);
        assert_eq!(encode(&wp, &format!("a{}", "b".repeat(20_000))), want);
        assert_eq!(
            encode(&wp, &"é".repeat(5_000)),
            [&[99, 6][..], &[7; 4_999]].concat()
        );
        assert_eq!(encode(&wp, &format!("{}x", "é".repeat(5_000))), [99, 0]);
    }

    #[test]
    fn exception_table() {
        // Sorted, disjoint, non-adjacent inclusive ranges (what the binary search relies on).
        assert!(NEWER_THAN_UNICODE_8
            .windows(2)
            .enumerate()
            .all(|(i, w)| match i % 2 {
                0 => w[0] <= w[1],
                _ => w[0] + 1 < w[1],
            }));
        let hit = |c| newer_than_unicode_8(char::from_u32(c).unwrap_or('a'));
        assert!(hit(0x61D) && hit(0x8CA) && hit(0x8D0) && hit(0x8E2) && hit(0x1E95F));
        assert!(!hit(0x61C) && !hit(0x8E3) && !hit(0x41) && !hit(0x1E960) && !hit(0x10FFFF));
        // The table is relative to this Unicode version: regenerate it if this changes.
        assert_eq!(unicode_general_category::UNICODE_VERSION, (16, 0, 0));
    }
}
