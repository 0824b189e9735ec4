//! One step of a generator: a forward pass over the next input (and a speculative draft),
//! constraint masks, samplers, and folding the chosen tokens back into the loop.

use crate::constraint::TokenMask;
use crate::error::{Error, Result};
use crate::forward::Forward;
use crate::output::ForwardOutput;
use crate::probe::{Probe, ProbeHandle, ProbeKind};

use super::{allows_only, constraint_mask, Generator};

/// One step of a [`Generator`]: add probes, optionally drop the automatic sampler, then
/// [`Step::execute`].
pub struct Step<'g, 'c> {
    pub(super) gen: &'g mut Generator<'c>,
    pub(super) auto: bool,
    pub(super) probes: Vec<(usize, ProbeKind)>,
}

/// What a step returned.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// The token the generator's sampler chose (`None` after `clear_sampler`); with
    /// speculative decoding, the last of the tokens the step accepted.
    pub token: Option<u32>,
    /// Every token the step accepted (one, or more with speculative decoding), including a
    /// stop token or stop id that ended the generation — which [`super::Generator::tokens`]
    /// leaves out. To stream text, use [`super::Generator::next_text`].
    pub accepted: Vec<u32>,
    /// The pass's outputs: read probes with their handles.
    pub output: ForwardOutput,
    /// The tokens the generator's constraints allow at the sampled position (`None` without
    /// constraints): the set a step whose sampler was cleared picks from, since probes
    /// report the unconstrained distribution.
    pub allowed: Option<TokenMask>,
}

impl std::ops::Deref for StepOutput {
    type Target = ForwardOutput;
    fn deref(&self) -> &ForwardOutput {
        &self.output
    }
}

impl Step<'_, '_> {
    /// Drops the automatic sampler: the step runs without choosing a token; pick one from a
    /// probe and hand it to [`Generator::accept`]. (No speculation on such a step.) What the
    /// automatic sampler applied is then the caller's to apply: the constraints' allowed set
    /// ([`StepOutput::allowed`]; `accept` refuses a token outside it), penalties, logit bias
    /// and the `min_tokens` ban on stop tokens.
    pub fn clear_sampler(&mut self) {
        self.auto = false;
    }

    /// Adds a probe for this step only (`index` 0: the position the step samples from).
    pub fn probe<P: Probe>(&mut self, index: usize, probe: P) -> ProbeHandle<P> {
        self.probes.push((index, probe.kind()));
        ProbeHandle::new(self.gen.each_step.len() + self.probes.len() - 1)
    }

    /// Runs the step. With the automatic sampler on, the sampled token (and any confirmed
    /// draft tokens before it) are accepted.
    pub async fn execute(self) -> Result<StepOutput> {
        let gen = self.gen;
        let input = std::mem::take(&mut gen.next_input);
        gen.restart = Some(super::Restart::new(gen.ctx, input.clone()));
        let result = run(gen, &input, self.auto, &self.probes).await;
        if let Some(mut r) = gen.restart.take() {
            r.take();
        }
        if result.is_err() {
            gen.next_input = input;
        }
        result
    }
}

/// One step: constraint masks, a draft, one pass, then the draft settled against what the
/// sampler chose.
async fn run(
    gen: &mut Generator<'_>,
    input: &[u32],
    auto: bool,
    step_probes: &[(usize, ProbeKind)],
) -> Result<StepOutput> {
    let vocab = gen.ctx.engine().info().vocab_size;
    let mut masks = Vec::new();
    if !gen.constraints.is_empty() {
        let mask = constraint_mask(&mut gen.constraints, &gen.generated, vocab)?
            .ok_or(Error::NothingAllowed)?;
        if mask.count() == 0 {
            return Err(Error::NothingAllowed);
        }
        masks.push(mask);
    }
    let allowed = masks.first().cloned();
    // `min_tokens` bans the stop ids, except where the constraints allow nothing else: the
    // step then bans none, and drafts nothing (its draft positions would lose the ban).
    let (bias, lifted) = match gen.step_bias(allowed.as_ref()) {
        Some(bias) => (bias, false),
        None => (gen.bias.clone(), true),
    };
    let draft = if auto && !lifted {
        draft(gen, input, &mut masks)?
    } else {
        Vec::new()
    };
    let horizon = gen
        .horizon
        .unwrap_or_else(|| gen.stop.max_tokens.saturating_sub(gen.generated.len() + 1));
    let mut fwd: Forward<'_> = gen.ctx.forward();
    fwd.input(input);
    let last = fwd.len() - 1;
    fwd.input(&draft);
    for (i, p) in gen.each_step.iter().chain(step_probes) {
        // Step probes count from the sampled position: say so, not the pass's own index.
        if *i > draft.len() {
            return Err(Error::Config(format!(
                "step probe at index {i}: a step's probes count from the position it samples \
                 (0), and this step has {} position(s) there",
                draft.len() + 1
            )));
        }
        fwd.probe_kind(last + i, p.clone());
    }
    let sampler = gen.sampler.clone();
    let indices: Vec<usize> = (last..=last + draft.len()).collect();
    let h = auto.then(|| {
        if masks.is_empty() {
            fwd.sample(&indices, sampler)
        } else {
            fwd.sample_masked(&indices, sampler, masks.into_iter().map(Some).collect())
        }
    });
    if let Some(p) = gen.penalties.clone() {
        fwd.penalties(p);
    }
    fwd.logit_bias(&bias)
        .horizon(horizon)
        .set_adapters(gen.adapters.clone());
    let output = fwd.execute().await?;
    let Some(chosen) = h.and_then(|h| output.tokens(h)).map(<[u32]>::to_vec) else {
        return Ok(StepOutput {
            token: None,
            accepted: Vec::new(),
            output,
            allowed,
        });
    };
    let accepted = settle_draft(gen, &draft, &chosen)?;
    Ok(StepOutput {
        token: accepted.last().copied(),
        accepted,
        output,
        allowed,
    })
}

/// The speculator's draft after `input`, cut where a constraint forbids it; `masks` (the
/// mask after the accepted tokens) gains the mask after each kept draft token.
fn draft(
    gen: &mut Generator<'_>,
    input: &[u32],
    masks: &mut Vec<crate::constraint::TokenMask>,
) -> Result<Vec<u32>> {
    let Some(spec) = gen.speculator.as_mut() else {
        return Ok(Vec::new());
    };
    let vocab = gen.ctx.engine().info().vocab_size;
    let ctx_room = gen
        .ctx
        .engine()
        .n_ctx()
        .saturating_sub(gen.ctx.len() + gen.ctx.pending().len() + input.len());
    // A rejected draft is rolled back out of the cache, which keeps one sliding window of
    // slack behind the window itself: a draft longer than that could not be undone.
    let rewind_room = gen.ctx.engine().smallest_window().unwrap_or(usize::MAX);
    let mut room = gen
        .stop
        .max_tokens
        .saturating_sub(gen.generated.len() + 1)
        .min(ctx_room)
        .min(rewind_room);
    // The step's bias bans the stop ids at every position while fewer than `min_tokens` were
    // generated before it: the draft stays inside that window, where the ban is right.
    let (done, min) = (gen.generated.len(), gen.stop.min_tokens);
    if done < min {
        room = room.min(min - done - 1);
    }
    let mut draft = Vec::new();
    if room > 0 {
        let mut history = gen.ctx.history();
        history.extend_from_slice(input);
        draft = spec.draft(&history, gen.draft_len.min(room));
        // A draft is a guess: one too long (a speculator's own) is cut, and so is one that
        // names an id past the vocabulary, there.
        draft.truncate(gen.draft_len.min(room));
        if let Some(bad) = draft.iter().position(|&d| d as usize >= vocab) {
            draft.truncate(bad);
        }
    }
    if masks.is_empty() {
        return Ok(draft);
    }
    let banned = gen.stop.banned(gen.generated.len(), &gen.eos);
    let mut accepted = gen.generated.clone();
    let mut keep = 0;
    for &d in &draft {
        if !masks[keep].is_allowed(d) {
            break;
        }
        accepted.push(d);
        // A token that completes a constraint ends the generation: it is sampled at its own
        // position, as without a drafter, not drafted with a position after it (whose mask may
        // allow only an end of sequence that the bias bans).
        let terminal = gen
            .constraints
            .iter_mut()
            .any(|c| c.is_terminal(&accepted).unwrap_or(false));
        if terminal {
            break;
        }
        match constraint_mask(&mut gen.constraints, &accepted, vocab)? {
            // A mask that allows only the stop ids `min_tokens` bans: the step sampling there
            // lifts the ban (see `step_bias`), which a draft position, under the step's bias,
            // cannot. `d` is sampled at its own position instead.
            Some(m) if allows_only(&m, &banned) => break,
            Some(m) if m.count() > 0 => masks.push(m),
            _ => {
                keep += 1;
                break;
            }
        }
        keep += 1;
    }
    draft.truncate(keep.min(masks.len().saturating_sub(1)));
    masks.truncate(draft.len() + 1);
    Ok(draft)
}

/// Keeps the draft's prefix the samplers agree with, then the sampler's own next token, and
/// folds them into the generator; returns the tokens accepted before a stop rule.
///
/// With a deterministic draft this is exactly speculative rejection sampling: draft token `d`
/// is kept with probability p(d), and otherwise the token is drawn from p without `d`.
fn settle_draft(gen: &mut Generator<'_>, draft: &[u32], chosen: &[u32]) -> Result<Vec<u32>> {
    let m = draft.iter().zip(chosen).take_while(|(d, c)| d == c).count();
    let mut accepted = draft[..m].to_vec();
    accepted.extend(chosen.get(m));
    if let Some(spec) = gen.speculator.as_mut() {
        if !draft.is_empty() {
            spec.accepted(draft.len(), m);
        }
    }
    gen.drafted += draft.len();
    gen.draft_accepted += m;
    // The pass wrote every draft token into the cache: drop the rejected ones (before the
    // generator's state changes, so a failure leaves it consistent), then any confirmed ones
    // past a stop.
    if draft.len() > m {
        let n = gen.ctx.len() - (draft.len() - m);
        gen.ctx.truncate_keep_pending(n)?;
    }
    let taken = gen.accept_run(&accepted, m);
    if taken < m {
        let n = gen.ctx.len() - (m - taken);
        gen.ctx.truncate_keep_pending(n)?;
    }
    if gen.is_done() && (1..=m).contains(&taken) {
        // The stop fell on a draft token the pass ran: it leaves the cache for the pending
        // buffer, where a generation without drafts leaves its last token.
        gen.ctx.unrun_last()?;
    }
    accepted.truncate(taken);
    Ok(accepted)
}
