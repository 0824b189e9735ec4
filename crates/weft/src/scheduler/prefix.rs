//! Admission through the automatic prefix cache, and the passes that wait a step for another
//! pass's prompt pages rather than compute the same pages beside it.

use weft_core::kv::PAGE_SIZE;

use super::{Active, Shared};

impl Shared {
    /// Admission through the prefix cache: the first pass of a fresh context, causal at
    /// positions 0.., starts with the cached pages that hold its longest whole-page prefix
    /// (never past the first token whose logits the pass wants, and never its last token).
    /// The pass then runs only the rest; a failure rolls the attached tokens back with it.
    ///
    /// A fresh pass whose next whole page an older pass is still computing (the same prompt
    /// sent many times together: rollouts of one prompt, a request's `n` choices) sits out
    /// the step (`eligible` false) and looks again at the next one, once the older pass has
    /// published the page; it computed the same pages beside it. Outputs do not change:
    /// attached pages hold the same bits as computed ones.
    pub(super) fn attach_prefixes(&self, active: &mut [Active], eligible: &mut [bool]) {
        if !active
            .iter()
            .zip(eligible.iter())
            .any(|(a, &e)| e && !a.prefix_checked && a.fresh())
        {
            return;
        }
        let mut runner = self.runner();
        let sharing = runner.kv().prefix_cache_enabled();
        for i in 0..active.len() {
            if !eligible[i] || active[i].prefix_checked {
                continue;
            }
            let a = &active[i];
            if !a.fresh() || runner.kv().len(a.req.seq).map_or(true, |n| n != 0) {
                active[i].prefix_checked = true;
                continue;
            }
            let limit = a.prefix_limit();
            let older = active[..i].iter().zip(&eligible[..i]);
            if sharing
                && older
                    .into_iter()
                    .any(|(l, &e)| e && l.computes_page_of(a, limit))
            {
                eligible[i] = false;
                continue;
            }
            let a = &mut active[i];
            a.prefix_checked = true;
            a.done = match &a.req.adapters {
                Some(set) => runner.attach_prefix_with(a.req.seq, &a.req.tokens, limit, set),
                None => runner.attach_prefix(a.req.seq, &a.req.tokens, limit),
            };
        }
    }
}

impl Active {
    /// Whether the pass writes its tokens at positions 0, 1, … with causal attention (what
    /// the prefix cache holds pages of).
    fn plain(&self) -> bool {
        self.req.masks.is_none()
            && self
                .req
                .positions
                .iter()
                .enumerate()
                .all(|(k, &p)| p as usize == k)
    }

    /// A context's first pass, not started: one the prefix cache may give pages to.
    fn fresh(&self) -> bool {
        self.done == 0 && self.plain()
    }

    /// The most tokens the pass may take from the cache: never past the first token whose
    /// logits or hidden state it wants, never its last token, never past a vector input
    /// (pages past one are not a function of the ids).
    fn prefix_limit(&self) -> usize {
        let n = self.req.tokens.len();
        let first_out = self
            .wanted
            .first()
            .into_iter()
            .chain(self.wanted_hidden.first());
        let first_vector = self.req.embeds.iter().position(Option::is_some);
        first_out
            .copied()
            .chain(first_vector)
            .min()
            .unwrap_or(n)
            .min(n.saturating_sub(1))
    }

    /// Whether this (older, running) pass is computing the next whole page of its prompt and
    /// the fresh pass `f` could take that page from the cache once it is published: the same
    /// adapters and the same ids up to the page's end, within `f`'s `limit`.
    fn computes_page_of(&self, f: &Active, limit: usize) -> bool {
        let identity = |a: &Active| a.req.adapters.as_ref().map(|s| s.identity());
        let page_end = (self.done / PAGE_SIZE + 1) * PAGE_SIZE;
        let first_vector = self.req.embeds.iter().position(Option::is_some);
        let published = first_vector
            .unwrap_or(usize::MAX)
            .min(self.req.tokens.len());
        self.plain()
            && page_end <= limit.min(published)
            && identity(self) == identity(f)
            && self.req.tokens[..page_end] == f.req.tokens[..page_end]
    }
}
