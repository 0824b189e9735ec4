//! Speculative decoding: a [`Speculator`] guesses the next few tokens, the generator checks
//! them all in one forward pass and keeps the ones the target model agrees with.

use crate::{Context, Sampler};

/// Drafts tokens for the positions after the sequence so far.
///
/// The generator calls [`Speculator::draft`] before each step, runs the sequence's next token
/// and the draft in one pass with a sampler after every position, keeps the draft's longest
/// prefix that matches what the samplers chose (plus the first token they chose after it),
/// and rolls the rest back out of the KV cache. [`Speculator::accepted`] reports the outcome.
pub trait Speculator: Send {
    /// Up to `max` tokens likely to follow `tokens` (the prompt and everything generated).
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32>;

    /// Of the last `drafted` tokens, the first `accepted` were kept; the rest were rolled
    /// back.
    fn accepted(&mut self, drafted: usize, accepted: usize) {
        let _ = (drafted, accepted);
    }
}

/// Prompt-lookup (n-gram) drafting: find the latest earlier occurrence of the sequence's last
/// `n` tokens (longest `n` first) and propose what followed it. Free to compute and very
/// effective when the output copies the input (rewriting code, quoting, extraction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramSpeculator {
    /// Longest suffix to match.
    pub max_ngram: usize,
    /// Shortest suffix to match.
    pub min_ngram: usize,
}

impl Default for NgramSpeculator {
    fn default() -> Self {
        NgramSpeculator {
            max_ngram: 4,
            min_ngram: 2,
        }
    }
}

impl Speculator for NgramSpeculator {
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let suffix = &tokens[len - n..];
            // Latest earlier occurrence whose continuation is known.
            if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
                let from = start + n;
                return tokens[from..from.saturating_add(max).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// Drafting with a smaller model: its own [`Context`] follows the sequence (rewound to the
/// part it shares with it, then filled with the rest) and greedily generates the draft, in
/// passes of its own run from inside the step ([`crate::block_on`] nests). The draft model
/// must share the target's vocabulary (e.g. SmolLM2-135M drafting for SmolLM2-1.7B); it may
/// run on its own [`crate::Engine`] or on the target's.
///
/// ```no_run
/// use weft::{DraftModel, Engine, Sampler};
/// let target = Engine::load("smollm2-135m")?;
/// let draft = Engine::load("smollm2-135m")?; // in practice a smaller sibling
/// let mut ctx = target.context();
/// ctx.fill("def fib(n):")?;
/// let g = ctx
///     .generate(Sampler::Argmax)
///     .max_tokens(64)
///     .speculator(DraftModel::new(draft.context()))
///     .draft_len(4);
/// let text = weft::block_on(g.collect_text())?;
/// # Ok::<(), weft::Error>(())
/// ```
pub struct DraftModel {
    ctx: Context,
}

impl DraftModel {
    /// Drafts with `ctx`'s model (an empty context, or one holding a prefix of what it will
    /// follow: only the part it does not share is computed).
    pub fn new(ctx: Context) -> Self {
        DraftModel { ctx }
    }

    /// The draft model's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn try_draft(&mut self, tokens: &[u32], max: usize) -> crate::Result<Vec<u32>> {
        // The last token is always filled, so the draft has a position to sample after.
        let common = self
            .ctx
            .rewind_to_shared(&tokens[..tokens.len().saturating_sub(1)])?;
        self.ctx.fill_tokens(&tokens[common..])?;
        let room = self.ctx.engine().n_ctx().saturating_sub(tokens.len());
        let g = self.ctx.generate(Sampler::Argmax).max_tokens(max.min(room));
        crate::block_on(g.collect_tokens())
    }
}

impl Speculator for DraftModel {
    /// The draft model's greedy continuation; none when its context cannot follow (a window
    /// it cannot rewind, a full cache): the target then goes on without a draft.
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        if tokens.is_empty() || max == 0 {
            return Vec::new();
        }
        self.try_draft(tokens, max).unwrap_or_else(|_| {
            // Start over next time rather than from a context left half-way.
            self.ctx = self.ctx.engine().context();
            Vec::new()
        })
    }
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel")
            .field("tokens", &self.ctx.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_latest_match() {
        let mut s = NgramSpeculator::default();
        // ... 1 2 3 4 5 ... 1 2 3 → 4 5 (longest match: 1 2 3).
        assert_eq!(s.draft(&[9, 1, 2, 3, 4, 5, 7, 1, 2, 3], 2), vec![4, 5]);
        // The latest occurrence wins.
        assert_eq!(s.draft(&[1, 2, 8, 1, 2, 9, 1, 2], 1), vec![9]);
        // No match, or too short: nothing.
        assert!(s.draft(&[1, 2, 3, 4], 4).is_empty());
        assert!(s.draft(&[1], 4).is_empty());
        // The continuation is cut at the end of the sequence.
        assert_eq!(s.draft(&[5, 6, 5, 6], 8), vec![5, 6]);
        // However many are asked for.
        assert_eq!(s.draft(&[5, 6, 5, 6], usize::MAX), vec![5, 6]);
    }
}
