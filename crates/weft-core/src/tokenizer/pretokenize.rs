//! Pre-tokenizers of byte-level BPE vocabularies: split text into words before merging.
//!
//! llama.cpp implements the common split regexes by hand rather than with a regex engine (the
//! `(?!\S)` look-ahead and its own Unicode tables make engines disagree at the edges). These are
//! the same state machines, written from the regexes they implement, so our words match its
//! words exactly. Each splitter works on one piece of text and returns the piece boundaries.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Which split rules a vocabulary uses (`tokenizer.ggml.pre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Every digit alone (`\p{N}`), then GPT-2 on the rest (SmolLM, StarCoder, Refact…).
    DigitsThenGpt2,
    /// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, as llama.cpp maps them.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        Some(match name {
            "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => Self::DigitsThenGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => {
                Self::Llama3
            }
            _ => return None,
        })
    }

    /// Splits `text` into words; every byte of `text` lands in exactly one word.
    pub fn split(self, text: &str) -> Vec<&str> {
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let mut bounds = Vec::new(); // char-index end of each word
        match self {
            Self::Gpt2 => gpt2(&chars, 0, chars.len(), &mut bounds),
            Self::Llama3 => llama3(&chars, 0, chars.len(), &mut bounds),
            Self::DigitsThenGpt2 => {
                // `\p{N}` keeps matches and the text between them as separate pieces.
                let mut start = 0;
                for (i, &(_, c)) in chars.iter().enumerate() {
                    if class(c) == Class::Number {
                        gpt2(&chars, start, i, &mut bounds);
                        bounds.push(i + 1);
                        start = i + 1;
                    }
                }
                gpt2(&chars, start, chars.len(), &mut bounds);
            }
        }
        let byte_at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
        let mut words = Vec::with_capacity(bounds.len());
        let mut prev = 0;
        for end in bounds {
            words.push(&text[byte_at(prev)..byte_at(end)]);
            prev = end;
        }
        words
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Whitespace,
    Other,
    /// Past the end of the piece being split.
    End,
}

/// `\p{L}`, `\p{N}`, `\s` or anything else, with llama.cpp's definitions (Unicode general
/// categories L* and N*, White_Space property).
fn class(c: char) -> Class {
    if c.is_whitespace() {
        return Class::Whitespace;
    }
    match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => Class::Letter,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

/// A view of `chars[start..end]` that answers "past the end" outside it.
struct Piece<'a> {
    chars: &'a [(usize, char)],
    start: usize,
    end: usize,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.start <= pos && pos < self.end).then(|| self.chars[pos].1)
    }

    fn class(&self, pos: usize) -> Class {
        self.cpt(pos).map_or(Class::End, class)
    }

    fn is_other(&self, pos: usize) -> bool {
        self.class(pos) == Class::Other
    }

    /// Counts the whitespace run at `pos`.
    fn whitespace_run(&self, pos: usize) -> usize {
        (pos..self.end)
            .take_while(|&p| self.class(p) == Class::Whitespace)
            .count()
    }

    /// The contraction (`'s`, `'re`, …) at `pos`, if any: its length in chars.
    fn contraction(&self, pos: usize, ignore_case: bool) -> Option<usize> {
        if self.cpt(pos) != Some('\'') {
            return None;
        }
        let lower = |p| {
            self.cpt(p).map(|c: char| {
                if ignore_case {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
        };
        match (lower(pos + 1), lower(pos + 2)) {
            (Some('s' | 't' | 'm' | 'd'), _) => Some(2),
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => Some(3),
            _ => None,
        }
    }
}

/// GPT-2's split of `chars[start..end]`, pushing each word's end (a char index) to `out`.
fn gpt2(chars: &[(usize, char)], start: usize, end: usize, out: &mut Vec<usize>) {
    let p = Piece { chars, start, end };
    let mut pos = start;
    while pos < end {
        if let Some(n) = p.contraction(pos, false) {
            pos += n;
            out.push(pos);
            continue;
        }
        // An optional single ASCII space joins the word that follows it.
        let lead_space = p.cpt(pos) == Some(' ');
        let next = if lead_space { pos + 1 } else { pos };
        match p.class(next) {
            // ` ?\p{L}+` and ` ?\p{N}+`
            cls @ (Class::Letter | Class::Number) => {
                pos = next;
                while p.class(pos) == cls {
                    pos += 1;
                }
                out.push(pos);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+`
            Class::Other => {
                pos = next;
                while p.is_other(pos) {
                    pos += 1;
                }
                out.push(pos);
                continue;
            }
            Class::Whitespace | Class::End => {}
        }
        pos = whitespace(&p, pos, out);
    }
}

/// `\s+(?!\S)|\s+` at `pos` (and a lone char when nothing matches); returns the new position.
fn whitespace(p: &Piece, pos: usize, out: &mut Vec<usize>) -> usize {
    let n = p.whitespace_run(pos);
    let end = if n > 1 && p.cpt(pos + n).is_some() {
        // Leave the last space to prefix the word that follows.
        pos + n - 1
    } else if n > 0 {
        pos + n
    } else {
        pos + 1
    };
    out.push(end);
    end
}

/// Llama 3's split of `chars[start..end]`.
fn llama3(chars: &[(usize, char)], start: usize, end: usize, out: &mut Vec<usize>) {
    let p = Piece { chars, start, end };
    let is_newline = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let mut pos = start;
    while pos < end {
        if let Some(n) = p.contraction(pos, true) {
            pos += n;
            out.push(pos);
            continue;
        }
        let cls = p.class(pos);
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !is_newline(p.cpt(pos))
            && cls != Class::Number
            && (cls == Class::Letter || p.class(pos + 1) == Class::Letter)
        {
            pos += 1;
            while p.class(pos) == Class::Letter {
                pos += 1;
            }
            out.push(pos);
            continue;
        }
        // `\p{N}{1,3}`
        if cls == Class::Number {
            let mut run = 0;
            while p.class(pos) == Class::Number {
                pos += 1;
                run += 1;
                if run == 3 {
                    out.push(pos);
                    run = 0;
                }
            }
            if run > 0 {
                out.push(pos);
            }
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let next = if p.cpt(pos) == Some(' ') {
            pos + 1
        } else {
            pos
        };
        if p.is_other(next) {
            pos = next;
            while p.is_other(pos) {
                pos += 1;
            }
            while is_newline(p.cpt(pos)) {
                pos += 1;
            }
            out.push(pos);
            continue;
        }
        // `\s*[\r\n]+`: a whitespace run containing a newline ends after its last newline.
        let n = p.whitespace_run(pos);
        if let Some(last_nl) = (pos..pos + n).rev().find(|&q| is_newline(p.cpt(q))) {
            pos = last_nl + 1;
            out.push(pos);
            continue;
        }
        pos = whitespace(&p, pos, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_keeps_one_space_for_the_next_word() {
        let words = PreTokenizer::Gpt2.split("Hello   world's  ok\n\n  x");
        assert_eq!(
            words,
            ["Hello", "  ", " world", "'s", " ", " ok", "\n\n ", " x"]
        );
    }

    #[test]
    fn digits_are_split_one_by_one() {
        let words = PreTokenizer::DigitsThenGpt2.split(" 1234 ab12");
        assert_eq!(words, [" ", "1", "2", "3", "4", " ab", "1", "2"]);
    }

    #[test]
    fn llama3_groups_digits_by_three_and_newlines() {
        let words = PreTokenizer::Llama3.split("12345 I'M fine.\n\nok");
        assert_eq!(words, ["123", "45", " I", "'M", " fine", ".\n\n", "ok"]);
    }

    #[test]
    fn split_covers_every_byte() {
        let text = "émoji 🙂🚀👩\u{200d}💻 and ∑∫√ \t\r\n end  ";
        for pre in [
            PreTokenizer::Gpt2,
            PreTokenizer::DigitsThenGpt2,
            PreTokenizer::Llama3,
        ] {
            assert_eq!(pre.split(text).concat(), text);
        }
    }
}
