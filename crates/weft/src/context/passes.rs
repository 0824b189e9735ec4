//! A context's bookkeeping around its passes: what a submitted pass changed (to undo it if
//! it fails), the marks a generator goes back to when a step's future is dropped, the step a
//! dropped generator leaves behind, and running the last token again for its logits.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use weft_core::models::SlotMask;
use weft_core::sampling::Rng;

use super::*;

/// Where a generator's step started, left here when the step's future was dropped while its
/// pass was in flight and then the generator went too: the context's next operation goes
/// back there, the step's inputs pending again, so tokens the step only tried (unchecked
/// drafts) do not stay. Shared, so the generator can leave it as it is dropped.
pub(crate) type AbandonSlot = Arc<Mutex<Option<(Mark, Vec<u32>)>>>;

/// What a submitted pass changed in its context, kept to undo it if the pass fails.
#[derive(Debug, Clone)]
pub(crate) struct PassRecord {
    pub(super) len: usize,
    pub(super) pending: Vec<u32>,
    pub(super) pending_bias: BTreeMap<usize, Vec<f32>>,
    pub(super) custom_attention: bool,
    pub(super) last_row: Option<(usize, Vec<f32>)>,
}

/// A context's state between passes (run length, pending tokens, input vectors, bias rows):
/// a generator keeps one to go back to when a step's future is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(super) len: usize,
    pub(super) pending: Vec<u32>,
    pub(super) embeds: BTreeMap<usize, Arc<[f32]>>,
    pub(super) pending_bias: BTreeMap<usize, Vec<f32>>,
}

impl Context {
    /// After an `execute` future was dropped: waits until the scheduler has answered the
    /// orphaned pass and drops the tokens it recorded but the cache does not hold (the pass
    /// failed); then goes back to where a step abandoned with its generator started.
    pub(crate) fn settle(&mut self) {
        self.settle_pass();
        let abandoned = self.abandoned_step().take();
        if let Some((mark, input)) = abandoned {
            // Nothing to report to: a failed truncation (the engine stopped) leaves the tokens.
            let _ = self.rewind_to(mark);
            self.pending.extend(input);
        }
    }

    /// The step a generator abandoned here, if any (a poisoned lock still holds it).
    pub(super) fn abandoned_step(&self) -> MutexGuard<'_, Option<(Mark, Vec<u32>)>> {
        self.abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Context::settle`]'s first half: the dropped pass.
    fn settle_pass(&mut self) {
        let Some(record) = self.inflight.take() else {
            return;
        };
        let shared = &self.engine.inner.shared;
        shared.wait_idle(self.seq);
        let cached = shared.runner().kv().len(self.seq).unwrap_or(0);
        if cached < self.tokens.len() {
            if record.len == cached {
                // The pass failed and the runner rolled the sequence back: as an awaited
                // pass's failure does, its pending tokens (and bias rows) go back to the
                // buffer rather than being lost.
                self.undo(record);
            } else {
                self.tokens.truncate(cached);
                self.positions.truncate(cached);
                self.drop_rows_from(cached);
                self.embeds.retain(|&i, _| i < cached + self.pending.len());
            }
        }
    }

    /// Records a pass submitted to the scheduler: the pending tokens and `tokens`'s inputs
    /// become run tokens at `positions` (the pass's `tokens` start with the pending ones),
    /// with the pass's own input vectors by index in the pass. Until [`Context::pass_done`]
    /// or [`Context::pass_failed`], the context waits for the scheduler before touching the
    /// sequence again.
    pub(crate) fn begin_pass(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        vectors: BTreeMap<usize, Arc<[f32]>>,
        masks: Option<&[SlotMask]>,
    ) {
        let record = PassRecord {
            len: self.tokens.len(),
            pending: std::mem::take(&mut self.pending),
            pending_bias: std::mem::take(&mut self.pending_bias),
            custom_attention: self.custom_attention,
            last_row: self.last_row.clone(),
        };
        self.custom_attention |= masks.is_some();
        self.causal
            .extend(std::iter::repeat_n(masks.is_none(), tokens.len()));
        if let Some(last) = masks.and_then(<[SlotMask]>::last) {
            let row = (0..last.len())
                .map(|j| match last.allows(j) {
                    true => last.bias().and_then(|b| b.get(j)).copied().unwrap_or(0.0),
                    false => f32::NEG_INFINITY,
                })
                .collect();
            self.last_row = Some((record.len + tokens.len() - 1, row));
        }
        self.tokens.extend_from_slice(tokens);
        self.positions.extend_from_slice(positions);
        for (i, v) in vectors {
            self.embeds.insert(record.len + i, v);
        }
        self.inflight = Some(record);
    }

    /// The pass ran: the sampling state moves on to `rng`.
    pub(crate) fn pass_done(&mut self, rng: Rng) {
        self.inflight = None;
        self.rng = rng;
    }

    /// The pass failed and the runner rolled the sequence back: so does the context. A long
    /// pass on a sliding-window model runs in chunks and gives back pages behind its window
    /// after each, so the cache may be unable to go back to where the pass began: the context
    /// then keeps the tokens the cache holds, its pass's others pending again, so that the two
    /// agree (it forgot them while the cache kept them, and every later pass failed).
    pub(crate) fn pass_failed(&mut self) {
        let Some(r) = self.inflight.take() else {
            return;
        };
        let kv = self.engine.inner.shared.runner().kv().len(self.seq);
        let cached = kv.unwrap_or(r.len).min(self.tokens.len());
        if cached <= r.len {
            self.undo(r);
            return;
        }
        self.pending = self.tokens.split_off(cached);
        self.positions.truncate(cached);
        self.drop_rows_from(cached);
        self.pending_bias = r
            .pending_bias
            .into_iter()
            .filter(|(i, _)| *i >= cached)
            .collect();
    }

    /// Puts the context back where it was before the pass `r` recorded.
    pub(super) fn undo(&mut self, r: PassRecord) {
        self.tokens.truncate(r.len);
        self.positions.truncate(r.len);
        self.causal.truncate(r.len);
        self.last_row = r.last_row;
        self.embeds.retain(|&i, _| i < r.len + r.pending.len());
        self.pending = r.pending;
        self.pending_bias = r.pending_bias;
        self.custom_attention = r.custom_attention;
    }

    /// The slot a generator leaves an abandoned step in (see [`AbandonSlot`]).
    pub(crate) fn abandon_slot(&self) -> AbandonSlot {
        self.abandoned.clone()
    }

    /// The state to come back to with [`Context::rewind_to`].
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            len: self.tokens.len(),
            pending: self.pending.clone(),
            embeds: self.embeds.clone(),
            pending_bias: self.pending_bias.clone(),
        }
    }

    /// Goes back to `mark` after a pass whose future was dropped: waits for the scheduler,
    /// drops whatever ran since, and restores the pending buffer.
    pub(crate) fn rewind_to(&mut self, mark: Mark) -> Result<()> {
        self.settle();
        if self.tokens.len() > mark.len {
            self.truncate(mark.len)?;
        }
        self.pending = mark.pending;
        self.embeds = mark.embeds;
        self.pending_bias = mark.pending_bias;
        Ok(())
    }

    /// Forgets what the run tokens from index `n` on ran with (they are gone).
    pub(super) fn drop_rows_from(&mut self, n: usize) {
        self.causal.truncate(n);
        if self.last_row.as_ref().is_some_and(|(i, _)| *i >= n) {
            self.last_row = None;
        }
    }

    /// Drops run tokens past the first `n` but keeps the pending buffer (speculative
    /// rollback: the generator may have left its next input there).
    pub(crate) fn truncate_keep_pending(&mut self, n: usize) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let r = self.rewind(n, true);
        self.pending = pending;
        r
    }

    /// Moves the last run token back to the pending buffer (with its input vector and its
    /// attention row, if it had them), so the next pass computes its logits again, as they
    /// were. A token that cannot run again as it ran — at a position other than the one
    /// after the token before it, or under a mask this context no longer knows (it was
    /// truncated back to it, or resumed from a snapshot) — is [`Error::Config`]: its logits
    /// would not be the ones it gave.
    pub(crate) fn unrun_last(&mut self) -> Result<()> {
        let n = self.tokens.len();
        let last = *self.tokens.last().ok_or(Error::EmptyPass)?;
        let (own, after) = (
            self.positions[n - 1],
            n.checked_sub(2).map(|i| self.positions[i] + 1),
        );
        if own != after.unwrap_or(0) {
            return Err(Error::Config(format!(
                "the last token ran at position {own}, not at {} after the one before it: \
                 running it again to get its logits back would change them; give the \
                 generation its first input token instead",
                after.unwrap_or(0)
            )));
        }
        let row = match (self.causal.get(n - 1), &self.last_row) {
            (Some(true), _) => None,
            (_, Some((i, row))) if *i == n - 1 => Some(row.clone()),
            _ => {
                return Err(Error::Config(
                    "the last token ran under an attention mask or bias this context no \
                     longer holds: running it again to get its logits back would change them; \
                     give the generation its first input token instead"
                        .into(),
                ))
            }
        };
        let vector = self.embeds.get(&(n - 1)).cloned();
        let pending = std::mem::take(&mut self.pending);
        self.rewind(n - 1, true)?;
        self.pending.push(last);
        self.pending.extend(pending);
        if let Some(v) = vector {
            self.embeds.insert(n - 1, v);
        }
        if let Some(row) = row {
            self.pending_bias.insert(n - 1, row);
        }
        Ok(())
    }
}
