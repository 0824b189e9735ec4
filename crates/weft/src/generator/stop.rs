//! Stop strings: where one ends a growing text, and how much of the text's end must be held
//! back from a stream because it may still become one. The generator and the HTTP server
//! share these rules, so a streamed text and a collected one always agree. [`StopRules`] holds
//! every rule that ends a generation.

use super::StopReason;

/// A set of stop strings (empty strings are ignored).
///
/// ```
/// let stops = weft::StopStrings::new(["\n\n", "END"]);
/// assert_eq!(stops.find("one\n\ntwo END"), Some((3, "\n\n")));
/// // "EN" may be the start of "END": a stream holds it back until it is clear.
/// assert_eq!(stops.held_back("text EN"), 2);
/// assert_eq!(stops.held_back("text"), 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings(Vec<String>);

impl StopStrings {
    /// The non-empty strings of `strings`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(strings: I) -> StopStrings {
        let mut s = StopStrings::default();
        for x in strings {
            s.push(x.into());
        }
        s
    }

    /// Adds a stop string (an empty one is ignored).
    pub fn push(&mut self, s: String) {
        if !s.is_empty() {
            self.0.push(s);
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The strings.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The earliest stop string in `text`: where it starts, and which it is.
    pub fn find<'s>(&'s self, text: &str) -> Option<(usize, &'s str)> {
        self.0
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|i| (i, s.as_str())))
            .min_by_key(|&(i, _)| i)
    }

    /// Bytes at the end of `text` that could be the beginning of a stop string.
    pub fn held_back(&self, text: &str) -> usize {
        let mut hold = 0;
        for s in &self.0 {
            for (i, _) in s
                .char_indices()
                .skip(1)
                .take_while(|&(i, _)| i <= text.len())
            {
                if text.ends_with(&s[..i]) {
                    hold = hold.max(i);
                }
            }
        }
        hold
    }
}

/// When a generation stops: a token budget, the ids that end it, id sequences and strings.
/// One set of rules serves the [`Generator`](crate::Generator) builder, the engine's defaults
/// ([`GenerationDefaults`](crate::GenerationDefaults)) and the HTTP server.
///
/// The model's end-of-turn set (its EOS and end-of-turn markers) always stops generation
/// unless [`StopRules::ignore_eos`] is set; `stop_tokens` adds ids to it.
///
/// ```
/// use weft::StopRules;
/// // Exactly 64 tokens, whatever the model emits (seed 002's `generate(64)`).
/// let exact = StopRules::new().max_tokens(64).ignore_eos();
/// assert_eq!(exact.max_tokens, 64);
/// // A chat reply: stop at a blank line too, but never before 4 tokens.
/// let reply = StopRules::new().stop_string("\n\n").min_tokens(4);
/// assert!(reply.stop_strings.find("a\n\nb").is_some());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StopRules {
    /// Most tokens to generate (default 256).
    pub max_tokens: usize,
    /// Until this many tokens were generated, the stop ids cannot be sampled (default 0).
    /// Stop strings and sequences still apply.
    pub min_tokens: usize,
    /// Do not stop on the model's end-of-turn set (default `false`): those tokens are then
    /// ordinary output.
    pub ignore_eos: bool,
    /// Ids that also end generation (not part of the output).
    pub stop_tokens: Vec<u32>,
    /// Stop when the output ends with one of these id sequences (kept in the output).
    pub stop_sequences: Vec<Vec<u32>>,
    /// Stop when the output text contains one of these; text collectors cut before it.
    pub stop_strings: StopStrings,
}

impl Default for StopRules {
    fn default() -> Self {
        StopRules {
            max_tokens: 256,
            min_tokens: 0,
            ignore_eos: false,
            stop_tokens: Vec::new(),
            stop_sequences: Vec::new(),
            stop_strings: StopStrings::default(),
        }
    }
}

impl StopRules {
    /// The defaults: 256 tokens, the model's end-of-turn set, nothing else.
    pub fn new() -> StopRules {
        StopRules::default()
    }

    /// Sets `max_tokens`.
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = n;
        self
    }

    /// Sets `min_tokens`.
    pub fn min_tokens(mut self, n: usize) -> Self {
        self.min_tokens = n;
        self
    }

    /// Runs past the model's end-of-turn set.
    pub fn ignore_eos(mut self) -> Self {
        self.ignore_eos = true;
        self
    }

    /// Adds stop ids.
    pub fn stop_tokens(mut self, ids: &[u32]) -> Self {
        for &t in ids {
            if !self.stop_tokens.contains(&t) {
                self.stop_tokens.push(t);
            }
        }
        self
    }

    /// Adds a stop sequence of ids (an empty one is ignored).
    pub fn stop_sequence(mut self, ids: &[u32]) -> Self {
        if !ids.is_empty() {
            self.stop_sequences.push(ids.to_vec());
        }
        self
    }

    /// Adds a stop string (an empty one is ignored).
    pub fn stop_string(mut self, s: &str) -> Self {
        self.stop_strings.push(s.to_string());
        self
    }

    /// Whether `t` ends generation, given the model's end-of-turn set `eos`.
    pub fn is_stop_token(&self, t: u32, eos: &[u32]) -> bool {
        self.stop_tokens.contains(&t) || (!self.ignore_eos && eos.contains(&t))
    }

    /// The ids that cannot be sampled after `generated` tokens: every stop id while fewer
    /// than `min_tokens` were generated, none afterwards.
    pub fn banned(&self, generated: usize, eos: &[u32]) -> Vec<u32> {
        if generated >= self.min_tokens {
            return Vec::new();
        }
        let eos = eos.iter().filter(|_| !self.ignore_eos);
        self.stop_tokens.iter().chain(eos).copied().collect()
    }

    /// The rule, other than a stop id, that ends generation after the last of `generated`
    /// (whose text is `text`): a stop sequence, a stop string, then `max_tokens`.
    pub fn check(&self, generated: &[u32], text: &str) -> Option<StopReason> {
        if let Some(s) = self.stop_sequences.iter().find(|s| generated.ends_with(s)) {
            return Some(StopReason::StopSequence(s.clone()));
        }
        if let Some((_, s)) = self.stop_strings.find(text) {
            return Some(StopReason::StopString(s.to_string()));
        }
        (generated.len() >= self.max_tokens).then_some(StopReason::MaxTokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_in_order() {
        let r = StopRules::new()
            .max_tokens(3)
            .stop_tokens(&[7, 7])
            .stop_sequence(&[1, 2])
            .stop_string("ab")
            .min_tokens(2);
        assert_eq!(r.stop_tokens, vec![7]);
        assert!(r.is_stop_token(7, &[9]) && r.is_stop_token(9, &[9]));
        assert!(!r.clone().ignore_eos().is_stop_token(9, &[9]));
        let mut banned = r.banned(1, &[9]);
        banned.sort_unstable();
        assert_eq!(banned, vec![7, 9]);
        assert!(r.banned(2, &[9]).is_empty());
        assert_eq!(
            r.check(&[1, 2], "xab"),
            Some(StopReason::StopSequence(vec![1, 2]))
        );
        assert_eq!(
            r.check(&[2], "xab"),
            Some(StopReason::StopString("ab".into()))
        );
        assert_eq!(r.check(&[0, 0, 0], "x"), Some(StopReason::MaxTokens));
        assert_eq!(r.check(&[0, 0], "x"), None);
    }
}
