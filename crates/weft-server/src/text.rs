//! The text of one choice as it grows token by token: what may be shown yet (never a prefix
//! of a stop string), where a stop string cuts it, and the log-probability entry of each
//! token, whose strings concatenate to exactly the text shown.

use weft::tokenizer::Utf8Buffer;
use weft::{StopStrings, Tokenizer};

/// The log-probability of one generated token and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's share of the output text (empty for a token that is part of a character
    /// a later token completes; cut where a stop string starts).
    pub token: String,
    /// The token's own bytes.
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first: (text, bytes, logprob).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// One token's place in the text.
#[derive(Debug, Clone)]
struct Entry {
    start: usize,
    end: usize,
    logprob: Option<TokenLogprob>,
}

/// The growing text of one choice.
#[derive(Debug)]
pub struct TextTracker {
    stops: StopStrings,
    text: String,
    bytes: Utf8Buffer,
    entries: Vec<Entry>,
    /// Bytes of `text` and entries already handed out.
    sent: usize,
    sent_entries: usize,
}

/// What became visible since the last call.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Delta {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

impl TextTracker {
    pub fn new(stops: Vec<String>) -> TextTracker {
        TextTracker {
            stops: StopStrings::new(stops),
            text: String::new(),
            bytes: Utf8Buffer::default(),
            entries: Vec::new(),
            sent: 0,
            sent_entries: 0,
        }
    }

    /// Appends a generated token (control tokens add no text).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, logprob: Option<TokenLogprob>) {
        let start = self.text.len();
        if tok
            .append_piece(id, false, self.bytes.pending_mut())
            .is_ok()
        {
            self.text.push_str(&self.bytes.take_complete());
        }
        self.entries.push(Entry {
            start,
            end: self.text.len(),
            logprob,
        });
    }

    /// Where the first stop string starts, if the text has one (the generator stops on the
    /// same rule: [`StopStrings::find`]).
    fn cut(&self) -> Option<usize> {
        self.stops.find(&self.text).map(|(i, _)| i)
    }

    /// New text that is safe to show while generation goes on.
    pub fn delta(&mut self) -> Delta {
        let visible = match self.cut() {
            Some(c) => c,
            None => self.text.len() - self.stops.held_back(&self.text),
        };
        self.emit(visible, false)
    }

    /// The rest of the text once generation has ended: cut before a stop string, with an
    /// incomplete trailing character shown as U+FFFD.
    pub fn finish(&mut self) -> Delta {
        let end = match self.cut() {
            Some(c) => c,
            None => {
                let tail = self.bytes.finish();
                self.text.push_str(&tail);
                if let Some(last) = self.entries.last_mut() {
                    last.end = self.text.len();
                }
                self.text.len()
            }
        };
        self.emit(end, true)
    }

    fn emit(&mut self, visible: usize, last: bool) -> Delta {
        let visible = visible.max(self.sent);
        let text = self.text[self.sent..visible].to_string();
        self.sent = visible;
        let mut logprobs = Vec::new();
        while let Some(e) = self.entries.get(self.sent_entries) {
            let whole = e.end <= visible;
            let straddles = last && e.start < visible;
            if !(whole || straddles) {
                break;
            }
            if let Some(lp) = &e.logprob {
                let mut lp = lp.clone();
                lp.token = self.text[e.start..e.end.min(visible)].to_string();
                logprobs.push(lp);
            }
            self.sent_entries += 1;
        }
        Delta { text, logprobs }
    }
}

/// The log-probability entry of token `id` from its step's logits: log-softmax of the raw
/// model output (before temperature, penalties and masks, as OpenAI and vLLM report them),
/// `-inf` clamped to -9999.
pub fn logprob_entry(tok: &Tokenizer, logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .sum::<f64>();
    let lse = f64::from(max) + sum.ln();
    let lp = |l: f32| {
        let v = (f64::from(l) - lse) as f32;
        if v.is_finite() {
            v.max(-9999.0)
        } else {
            -9999.0
        }
    };
    let piece = |id: u32| {
        let mut b = Vec::new();
        let _ = tok.append_piece(id, true, &mut b);
        (String::from_utf8_lossy(&b).into_owned(), b)
    };
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() == top && best.last().is_some_and(|b| l <= b.1) {
                continue;
            }
            let at = best.partition_point(|b| b.1 >= l);
            best.insert(at, (i as u32, l));
            best.truncate(top);
        }
    }
    let (_, bytes) = piece(id);
    TokenLogprob {
        token: String::new(),
        bytes,
        logprob: logits.get(id as usize).map_or(-9999.0, |&l| lp(l)),
        top: best
            .into_iter()
            .map(|(i, l)| {
                let (t, b) = piece(i);
                (t, b, lp(l))
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let hub = weft_hub::Hub::from_env().expect("WEFT_HOME or HOME must be set");
        let path = hub
            .resolve("smollm2-135m", &mut weft_hub::NoProgress)
            .expect("fetch smollm2-135m");
        Tokenizer::from_gguf(&weft::GgufFile::open(&path).expect("open")).expect("tokenizer")
    }

    /// Feeds `text` token by token; returns the streamed deltas, the final text and the
    /// concatenated logprob tokens.
    fn stream(tok: &Tokenizer, text: &str, stops: &[&str]) -> (Vec<String>, String, String) {
        let ids = tok.encode(text, false, false);
        let mut t = TextTracker::new(stops.iter().map(|s| s.to_string()).collect());
        let (mut deltas, mut lp) = (Vec::new(), String::new());
        let logits = vec![0.0f32; tok.vocab_size()];
        for &id in &ids {
            t.push(tok, id, Some(logprob_entry(tok, &logits, id, 2)));
            let d = t.delta();
            lp.extend(d.logprobs.iter().map(|l| l.token.clone()));
            deltas.push(d.text);
            if t.cut().is_some() {
                break;
            }
        }
        let d = t.finish();
        lp.extend(d.logprobs.iter().map(|l| l.token.clone()));
        deltas.push(d.text);
        let all = deltas.concat();
        (deltas, all, lp)
    }

    #[test]
    fn stop_strings_cut_the_text_and_are_never_streamed() {
        let tok = tokenizer();
        let text = "The quick brown fox jumps over the lazy dog.";
        // "own f" starts inside the token " brown" and ends inside " fox".
        let (deltas, all, lp) = stream(&tok, text, &["own f"]);
        assert_eq!(all, "The quick br");
        assert_eq!(lp, all, "logprob tokens concatenate to the content");
        let mut seen = String::new();
        for d in &deltas {
            seen.push_str(d);
            assert!(!seen.contains("own f"));
        }
        // No stop: everything, and the logprob tokens still match.
        let (_, all, lp) = stream(&tok, text, &[]);
        assert_eq!(all, text);
        assert_eq!(lp, text);
    }

    #[test]
    fn multibyte_characters_split_over_tokens_stay_whole() {
        let tok = tokenizer();
        let text = "Emoji: 🦀🦀 and accents: déjà vu";
        let (deltas, all, lp) = stream(&tok, text, &["vu"]);
        assert_eq!(all, "Emoji: 🦀🦀 and accents: déjà ");
        assert_eq!(lp, all);
        assert!(deltas.iter().all(|d| !d.contains('\u{fffd}')));
    }

    #[test]
    fn logprobs_are_a_log_softmax_with_sorted_alternatives() {
        let tok = tokenizer();
        let mut logits = vec![f32::NEG_INFINITY; tok.vocab_size()];
        logits[10] = 2.0;
        logits[11] = 1.0;
        logits[12] = 0.0;
        let e = logprob_entry(&tok, &logits, 11, 3);
        let z = (2f64.exp() + 1f64.exp() + 1.0).ln();
        assert!((f64::from(e.logprob) - (1.0 - z)).abs() < 1e-5);
        let lps: Vec<f32> = e.top.iter().map(|t| t.2).collect();
        assert_eq!(lps.len(), 3);
        assert!(lps.windows(2).all(|w| w[0] >= w[1]));
        let banned = logprob_entry(&tok, &logits, 13, 0);
        assert_eq!(banned.logprob, -9999.0, "-inf is clamped");
    }
}
