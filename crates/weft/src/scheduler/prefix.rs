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
    /// A fresh pass whose next whole page (the first the cache does not hold) an older pass
    /// is computing in this step — the same prompt sent many times together: rollouts of one
    /// prompt, a request's `n` choices — sits out the step (`eligible` false, not yet
    /// checked) rather than compute the same page beside it, and looks again at the next
    /// step, when the page is published. Outputs do not change: attached pages hold the bits
    /// computed ones would.
    pub(super) fn attach_prefixes(&self, active: &mut [Active], eligible: &mut [bool]) {
        if !active
            .iter()
            .zip(eligible.iter())
            .any(|(a, &e)| e && !a.prefix_checked && a.fresh())
        {
            return;
        }
        let mut runner = self.runner();
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
            let kv = runner.kv();
            // Only an older pass that starts with the same page can be computing one of this
            // pass's: the cache (a walk of the prompt's page hashes, which attaching walks
            // again) is looked up only when there is one.
            let first_page = a.req.tokens.get(..PAGE_SIZE);
            let mut older = active[..i]
                .iter()
                .zip(&eligible[..i])
                .filter(|&(l, &e)| e && l.req.tokens.get(..PAGE_SIZE) == first_page)
                .peekable();
            let wait = older.peek().is_some() && {
                let cached = kv.cached_prefix_len(&a.req.tokens, limit, a.salt());
                older.any(|(l, _)| kv.is_shareable(l.req.seq) && l.computes_page(cached, a, limit))
            };
            if wait {
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

    /// The prefix-cache salt of the pages the pass writes (its adapters'; 0 for the base
    /// model, as a set of no-op adapters).
    fn salt(&self) -> u64 {
        self.req.adapters.as_ref().map_or(0, |s| s.identity())
    }

    /// Whether this (older, running) pass computes, now, the page that starts at `start` of
    /// the fresh pass `f` and that `f` could take from the cache once it is published: it has
    /// done less than the page's end, but not less than its start; it writes plain pages
    /// without vector inputs, with the same adapters; and it has the same ids up to the
    /// page's end, within `f`'s `limit`.
    fn computes_page(&self, start: usize, f: &Active, limit: usize) -> bool {
        let end = start + PAGE_SIZE;
        self.done / PAGE_SIZE * PAGE_SIZE == start
            && end <= limit.min(self.req.tokens.len())
            && self.plain()
            && self.req.embeds.iter().all(Option::is_none)
            && self.salt() == f.salt()
            && self.req.tokens[..end] == f.req.tokens[..end]
    }
}
