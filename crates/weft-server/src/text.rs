//! The text of one choice as it grows token by token: what may be shown yet (never a prefix
//! of a stop string), where a stop string cuts it, and the log-probability entry of each
//! token, whose bytes concatenate to exactly the text shown (and whose strings do, but for
//! the pieces of characters split over tokens, named `bytes:\xNN...` as OpenAI names them).

use weft::tokenizer::Utf8Buffer;
use weft::{StopStrings, Tokenizer};

/// The log-probability of one generated token and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's share of the output text (cut where a stop string starts), or for a piece
    /// of a character its [`token_name`] (`bytes:\xf0\x9f`).
    pub token: String,
    /// The characters of the token's share of the output text (`text_offset` steps, which
    /// count characters as OpenAI's and vLLM's do): a character split over tokens counts at
    /// the token that completes it.
    pub text_chars: usize,
    /// The token's own bytes (cut as its text is, where a stop string starts).
    pub bytes: Vec<u8>,
    /// NaN for an echoed prompt's first token, which nothing predicted (`null` in JSON).
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first: (text, bytes, logprob).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// One token's place in the text: the text `start..end` became whole with it; its bytes are
/// that text but for the first `pre` bytes (pieces of a character earlier tokens began),
/// followed by `post` bytes of a character a later token completes.
#[derive(Debug, Clone)]
struct Entry {
    start: usize,
    end: usize,
    pre: usize,
    post: usize,
    logprob: Option<TokenLogprob>,
}

impl Entry {
    /// Whether the token is whole in the text up to `visible`: its text is, and so is the
    /// character its trailing piece begins.
    fn whole(&self, visible: usize) -> bool {
        self.end < visible || (self.end == visible && self.post == 0)
    }
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
        self.push_rendered(tok, id, logprob, false);
    }

    /// Appends a token, its control tokens' text shown when `render_special` is set (an
    /// echoed prompt's `<|im_start|>`).
    fn push_rendered(
        &mut self,
        tok: &Tokenizer,
        id: u32,
        logprob: Option<TokenLogprob>,
        render_special: bool,
    ) {
        let start = self.text.len();
        let pre = self.bytes.pending_mut().len();
        if tok
            .append_piece(id, render_special, self.bytes.pending_mut())
            .is_ok()
        {
            self.text.push_str(&self.bytes.take_complete());
        }
        self.entries.push(Entry {
            start,
            end: self.text.len(),
            pre: pre.min(self.text.len() - start),
            post: self.bytes.pending_mut().len(),
            logprob,
        });
    }

    /// Where the first stop string starts, if the text has one (the generator stops on the
    /// same rule: [`StopStrings::find`]).
    fn cut(&self) -> Option<usize> {
        self.stops.find(&self.text).map(|(i, _)| i)
    }

    /// New text that is safe to show while generation goes on. With log-probabilities, text
    /// goes out with the tokens it belongs to: a token only part of whose text is safe (a
    /// stop string may begin in it) holds all of it back, so that every delta's text is its
    /// entries' text, as OpenAI's chunks are.
    pub fn delta(&mut self) -> Delta {
        let mut visible = match self.cut() {
            Some(c) => c,
            None => self.text.len() - self.stops.held_back(&self.text),
        };
        if self.entries.iter().any(|e| e.logprob.is_some()) {
            if let Some(e) = self.entries[self.sent_entries..]
                .iter()
                .find(|e| !e.whole(visible))
            {
                visible = visible.min(e.start);
            }
        }
        self.emit(visible, None)
    }

    /// The rest of the text once generation has ended: cut before a stop string, with an
    /// incomplete trailing character shown as U+FFFD.
    pub fn finish(&mut self) -> Delta {
        let (end, cut) = match self.cut() {
            Some(c) => (c, true),
            None => {
                let tail = self.bytes.finish();
                self.text.push_str(&tail);
                if let Some(last) = self.entries.last_mut() {
                    last.end = self.text.len();
                }
                (self.text.len(), false)
            }
        };
        self.emit(end, Some(cut))
    }

    /// Hands out the text up to `visible` and the entries of the tokens it holds; `ended`
    /// once generation has ended, saying whether a stop string cut the text there.
    fn emit(&mut self, visible: usize, ended: Option<bool>) -> Delta {
        let visible = visible.max(self.sent);
        let text = self.text[self.sent..visible].to_string();
        self.sent = visible;
        let mut logprobs = Vec::new();
        while let Some(e) = self.entries.get(self.sent_entries) {
            let whole = e.whole(visible);
            // Once generation has ended, everything, or where a stop string cut the text,
            // the tokens that begin before the cut.
            let shown = match ended {
                None => whole,
                Some(false) => true,
                Some(true) => whole || e.start < visible,
            };
            if !shown {
                break;
            }
            if let Some(lp) = &e.logprob {
                let mut lp = lp.clone();
                let share = &self.text[e.start.min(visible)..e.end.min(visible)];
                lp.text_chars = share.chars().count();
                if whole || ended == Some(false) {
                    // A token that is text on its own is its share of the text; a piece of a
                    // character keeps its `bytes:` name.
                    if std::str::from_utf8(&lp.bytes).is_ok() {
                        lp.token = share.to_string();
                    }
                } else {
                    // Cut by a stop string (at a character): its bytes up to the cut, named
                    // by them.
                    let keep = if e.end <= visible {
                        lp.bytes.len().saturating_sub(e.post)
                    } else {
                        (visible - e.start).saturating_sub(e.pre)
                    };
                    lp.bytes.truncate(keep);
                    lp.token = token_name(&lp.bytes);
                }
                logprobs.push(lp);
            }
            self.sent_entries += 1;
        }
        Delta { text, logprobs }
    }
}

/// How a token is named in log-probabilities: its text, or, for a piece of a character (bytes
/// that are not UTF-8 on their own), `bytes:` and its bytes as `\xNN` escapes, as OpenAI names
/// them: distinct pieces get distinct names (keys of the legacy `top_logprobs` maps).
pub fn token_name(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut name = String::from("bytes:");
            for b in bytes {
                name.push_str(&format!("\\x{b:02x}"));
            }
            name
        }
    }
}

/// Token `id`'s [`token_name`] and bytes (a control token's text rendered).
fn named_piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let mut b = Vec::new();
    let _ = tok.append_piece(id, true, &mut b);
    (token_name(&b), b)
}

/// What a prompt-scoring pass found where token `i + 1` of a prompt was predicted: its
/// log-probability and the most likely tokens there with theirs.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptScore {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// An echoed prompt's text and log-probability entries (`echo` with `logprobs`): the first
/// token has no log-probability (NaN) and no alternatives, token `i` gets `scores[i - 1]`.
/// `added_bos`: the first token is a BOS weft added to a text prompt, not part of its text.
pub fn prompt_logprobs(
    tok: &Tokenizer,
    prompt: &[u32],
    scores: &[PromptScore],
    added_bos: bool,
) -> Delta {
    // The prompt as it was given: its control tokens are text (as the echo without
    // log-probabilities shows them), but for a BOS the text did not hold.
    let mut text = TextTracker::new(Vec::new());
    for (i, &id) in prompt.iter().enumerate() {
        let (token, bytes) = named_piece(tok, id);
        let score = i.checked_sub(1).and_then(|j| scores.get(j));
        let entry = TokenLogprob {
            token,
            text_chars: 0,
            bytes,
            logprob: score.map_or(f32::NAN, |s| s.logprob),
            top: score.map_or_else(Vec::new, |s| {
                s.top
                    .iter()
                    .map(|&(t, lp)| {
                        let (name, bytes) = named_piece(tok, t);
                        (name, bytes, lp)
                    })
                    .collect()
            }),
        };
        let render = !(i == 0 && added_bos);
        text.push_rendered(tok, id, Some(entry), render);
    }
    text.finish()
}

/// A log-probability as the API reports it: `-inf` (and NaN) as -9999.
pub fn clamp_logprob(v: f32) -> f32 {
    if v.is_finite() {
        v.max(-9999.0)
    } else {
        -9999.0
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
    let lp = |l: f32| clamp_logprob((f64::from(l) - lse) as f32);
    let piece = |id: u32| named_piece(tok, id);
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
    let (token, bytes) = piece(id);
    TokenLogprob {
        token,
        text_chars: 0,
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
        let (deltas, all, lps) = stream_entries(tok, text, stops);
        let lp = lps.iter().map(|l| l.token.as_str()).collect();
        (deltas, all, lp)
    }

    /// As [`stream`], with the logprob entries.
    fn stream_entries(
        tok: &Tokenizer,
        text: &str,
        stops: &[&str],
    ) -> (Vec<String>, String, Vec<TokenLogprob>) {
        let ids = tok.encode(text, false, false);
        let mut t = TextTracker::new(stops.iter().map(|s| s.to_string()).collect());
        let (mut deltas, mut lp) = (Vec::new(), Vec::new());
        let logits = vec![0.0f32; tok.vocab_size()];
        for &id in &ids {
            t.push(tok, id, Some(logprob_entry(tok, &logits, id, 2)));
            let d = t.delta();
            lp.extend(d.logprobs);
            deltas.push(d.text);
            if t.cut().is_some() {
                break;
            }
        }
        let d = t.finish();
        lp.extend(d.logprobs);
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
        let (deltas, all, _) = stream_entries(&tok, text, &["vu"]);
        assert_eq!(all, "Emoji: 🦀🦀 and accents: déjà ");
        assert!(deltas.iter().all(|d| !d.contains('\u{fffd}')));
        // The entries' bytes make up the text, and so do their shares of it; a token that is
        // text on its own is named by it, a piece of a character by its bytes.
        let (_, all, lps) = stream_entries(&tok, text, &[]);
        let bytes: Vec<u8> = lps.iter().flat_map(|l| l.bytes.clone()).collect();
        assert_eq!(bytes, all.as_bytes());
        assert_eq!(
            lps.iter().map(|l| l.text_chars).sum::<usize>(),
            all.chars().count()
        );
        let mut pieces = 0;
        for l in &lps {
            match std::str::from_utf8(&l.bytes) {
                Ok(s) => assert_eq!(l.token, s),
                Err(_) => {
                    pieces += 1;
                    assert_eq!(l.token, token_name(&l.bytes));
                    assert!(l.token.starts_with("bytes:\\x"), "{}", l.token);
                }
            }
        }
        assert!(pieces >= 2, "the crabs are split over tokens: {lps:?}");
    }

    #[test]
    fn entries_match_the_text_a_stop_string_cuts() {
        let tok = tokenizer();
        let text = "Emoji: 🦀🦀 and the quick brown fox";
        // At a character split over tokens (none of its pieces is reported), inside a token
        // (its share is), at a token's start.
        for stop in ["🦀", "🦀 and", "uick", "own f", " fox"] {
            let (_, all, lps) = stream_entries(&tok, text, &[stop]);
            assert_eq!(all, &text[..text.find(stop).unwrap()]);
            let bytes: Vec<u8> = lps.iter().flat_map(|l| l.bytes.clone()).collect();
            assert_eq!(bytes, all.as_bytes(), "{stop:?}: {lps:?}");
            let chars: usize = lps.iter().map(|l| l.text_chars).sum();
            assert_eq!(chars, all.chars().count(), "{stop:?}");
        }
    }

    /// While generation goes on, every delta's text is its entries' text (a token a stop
    /// string may begin in is held back whole): a client that pairs a chunk's text with its
    /// log-probabilities, or counts `text_offset` by chunk, sees them agree.
    #[test]
    fn every_delta_carries_the_entries_of_its_text() {
        let tok = tokenizer();
        let text = "Emoji: 🦀🦀 and the quick brown fox jumps over the lazy dog";
        for stop in ["s X", "own f", "🦀 X", "n X", "e l"] {
            let ids = tok.encode(text, false, false);
            let mut t = TextTracker::new(vec![stop.to_string()]);
            let logits = vec![0.0f32; tok.vocab_size()];
            let mut all = String::new();
            for &id in &ids {
                t.push(&tok, id, Some(logprob_entry(&tok, &logits, id, 1)));
                let d = t.delta();
                let bytes: Vec<u8> = d.logprobs.iter().flat_map(|l| l.bytes.clone()).collect();
                assert_eq!(bytes, d.text.as_bytes(), "{stop:?}: {d:?}");
                let chars: usize = d.logprobs.iter().map(|l| l.text_chars).sum();
                assert_eq!(chars, d.text.chars().count(), "{stop:?}: {d:?}");
                all.push_str(&d.text);
            }
            all.push_str(&t.finish().text);
            let end = text.find(stop).unwrap_or(text.len());
            assert_eq!(all, &text[..end], "{stop:?}");
        }
    }

    /// An echoed prompt's control tokens are text, as the echo without log-probabilities
    /// shows them, and their entries are named by it.
    #[test]
    fn an_echoed_prompt_keeps_its_control_tokens() {
        let tok = tokenizer();
        let prompt = "<|im_start|>user\nhi<|im_end|>";
        let ids = tok.encode(prompt, false, true);
        let d = prompt_logprobs(&tok, &ids, &[], false);
        assert_eq!(d.text, prompt);
        let names: Vec<&str> = d.logprobs.iter().map(|l| l.token.as_str()).collect();
        assert_eq!(names.concat(), prompt);
        assert_eq!(names[0], "<|im_start|>");
    }

    #[test]
    fn pieces_of_characters_get_distinct_names() {
        let tok = tokenizer();
        // Three tokens that are no text on their own, the most likely at a step.
        let pieces: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| {
                let mut b = Vec::new();
                tok.append_piece(id, true, &mut b).is_ok()
                    && !b.is_empty()
                    && std::str::from_utf8(&b).is_err()
            })
            .take(3)
            .collect();
        assert_eq!(pieces.len(), 3);
        let mut logits = vec![0.0f32; tok.vocab_size()];
        for (i, &id) in pieces.iter().enumerate() {
            logits[id as usize] = 10.0 - i as f32;
        }
        let e = logprob_entry(&tok, &logits, pieces[0], 3);
        let names: Vec<&str> = e.top.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(
            names[0], e.token,
            "the chosen token is named as its alternative"
        );
        assert!(names.iter().all(|n| n.starts_with("bytes:")), "{names:?}");
        assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2]);
        assert_eq!(token_name(&[0xf0, 0x9f]), "bytes:\\xf0\\x9f");
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
