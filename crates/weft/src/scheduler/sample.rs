//! Answering finished passes: their samplers and probes run on the rows of logits they asked
//! for, on the runner's thread pool.

use std::sync::OnceLock;

use weft_core::runner::ModelRunner;
use weft_core::sampling::{apply_logit_bias, Rng, SampleScratch, Sampler};

use super::{Active, PassRequest, PassResult};
use crate::constraint::TokenMask;
use crate::error::{Error, Result};
use crate::probe::ProbeKind;

/// The rows of the last forward, per chosen range: `(pass, index, row)` — logits rows of
/// each pass's `wanted` indices, or (`hidden`) hidden-state rows of its `wanted_hidden` ones.
fn rows_of<'r>(
    runner: &'r ModelRunner,
    active: &[Active],
    chosen: &[(usize, usize, usize)],
    hidden: bool,
) -> Vec<(usize, usize, &'r [f32])> {
    let (all, width) = if hidden {
        (runner.last_hidden(), runner.info().n_embd)
    } else {
        (runner.last_logits(), runner.info().vocab_size)
    };
    let mut rows = Vec::new();
    let mut row = 0;
    for &(i, a, b) in chosen {
        let wanted = if hidden {
            &active[i].wanted_hidden
        } else {
            &active[i].wanted
        };
        for &t in wanted.iter().filter(|&&t| t >= a && t < b) {
            rows.push((i, t, &all[row * width..(row + 1) * width]));
            row += 1;
        }
    }
    rows
}

/// After a successful forward: advances the chosen passes, saves the rows a pass that is not
/// finished will need, and computes the outcome of the passes that are — on the runner's
/// thread pool, since with a large vocabulary sampling sixteen rows is not free.
pub(super) fn advance(
    runner: &ModelRunner,
    active: &mut [Active],
    chosen: &[(usize, usize, usize)],
) {
    let rows = rows_of(runner, active, chosen, false);
    let hidden_rows = rows_of(runner, active, chosen, true);
    let mut finished = Vec::new();
    for &(i, _, b) in chosen {
        let a = &mut active[i];
        a.done = b;
        if b < a.req.tokens.len() {
            let mine = rows.iter().filter(|r| r.0 == i);
            a.saved.extend(mine.map(|&(_, t, row)| (t, row.to_vec())));
            let mine = hidden_rows.iter().filter(|r| r.0 == i);
            a.saved_hidden
                .extend(mine.map(|&(_, t, row)| (t, row.to_vec())));
        } else {
            finished.push(i);
        }
    }
    let results: Vec<OnceLock<Result<PassResult>>> =
        finished.iter().map(|_| OnceLock::new()).collect();
    let done: &[Active] = active;
    let work = |ti: usize, nt: usize| {
        let mut scratch = Scratch::default();
        for j in (ti..finished.len()).step_by(nt) {
            let i = finished[j];
            let row = |t: usize| -> &[f32] { find_row(&rows, &done[i].saved, i, t) };
            let hidden =
                |t: usize| -> &[f32] { find_row(&hidden_rows, &done[i].saved_hidden, i, t) };
            let _ = results[j].set(outcome(&done[i].req, row, hidden, &mut scratch));
        }
    };
    if finished.len() > 1 {
        runner.pool().run(&work);
    } else {
        work(0, 1);
    }
    for (i, r) in finished.into_iter().zip(results) {
        active[i].outcome = r.into_inner();
    }
}

/// Row `t` of pass `i`: from this step's rows, or saved from an earlier step.
fn find_row<'a>(
    rows: &[(usize, usize, &'a [f32])],
    saved: &'a [(usize, Vec<f32>)],
    i: usize,
    t: usize,
) -> &'a [f32] {
    rows.iter()
        .find(|r| r.0 == i && r.1 == t)
        .map(|r| r.2)
        .or_else(|| saved.iter().find(|s| s.0 == t).map(|s| s.1.as_slice()))
        .unwrap_or(&[])
}

/// Samples and probes a finished pass, given its logits and hidden-state rows by index.
fn outcome<'r>(
    req: &PassRequest,
    row: impl Fn(usize) -> &'r [f32],
    hidden: impl Fn(usize) -> &'r [f32],
    scratch: &mut Scratch,
) -> Result<PassResult> {
    let mut rng = req.rng.clone();
    let mut tokens = Vec::with_capacity(req.samplers.len());
    for s in &req.samplers {
        let ids = s
            .indices
            .iter()
            .enumerate()
            .map(|(k, &t)| {
                let mask = s.masks.get(k).and_then(Option::as_ref);
                sample_row(req, t, row(t), &s.sampler, mask, &mut rng, scratch)
            })
            .collect::<Result<Vec<_>>>()?;
        tokens.push(ids);
    }
    let probes = req
        .probes
        .iter()
        .map(|(t, p)| match p {
            ProbeKind::Hidden => p.compute(hidden(*t)),
            _ => p.compute(row(*t)),
        })
        .collect();
    Ok(PassResult {
        tokens,
        probes,
        rng,
    })
}

/// Reusable buffers of one sampling worker.
#[derive(Default)]
struct Scratch {
    logits: Vec<f32>,
    sampler: SampleScratch,
}

/// Samples one token from `logits` (after the pass's token `t`) after the pass's bias,
/// penalties and logit masks.
fn sample_row(
    req: &PassRequest,
    t: usize,
    logits: &[f32],
    sampler: &Sampler,
    mask: Option<&TokenMask>,
    rng: &mut Rng,
    scratch: &mut Scratch,
) -> Result<u32> {
    // NaN logits come from broken weights (a corrupt file, a NaN scale) and would make every
    // sampler answer some fixed token, silently. One vectorized read of a row already in cache:
    // about 3 µs for SmolLM2's 49,152 logits, against milliseconds for the pass.
    if logits.iter().fold(false, |nan, l| nan | l.is_nan()) {
        return Err(Error::NanLogits);
    }
    let plain = req.bias.is_empty()
        && req.penalties.is_none()
        && req.logit_mask.is_none()
        && mask.is_none();
    if plain {
        return Ok(sampler.sample_with(logits, rng, &mut scratch.sampler));
    }
    let buf = &mut scratch.logits;
    buf.clear();
    buf.extend_from_slice(logits);
    apply_logit_bias(buf, &req.bias);
    if let Some((p, history)) = &req.penalties {
        // Only the tokens up to this one count (a speculative check samples after each draft
        // token and must not see the ones after it).
        let base = history.len() - req.tokens.len();
        p.apply(buf, &history[..base + t + 1]);
    }
    let mut masked = false;
    for allowed in [req.logit_mask.as_ref(), mask].into_iter().flatten() {
        masked = true;
        let mut any = false;
        for (id, l) in buf.iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            } else if *l > f32::NEG_INFINITY {
                any = true;
            }
        }
        if !any {
            return Err(Error::NothingAllowed);
        }
    }
    // Biases of -inf on every token leave nothing to sample, as a mask allowing none does (the
    // sampler would have answered token 0). A mask's pass above has already checked what it
    // left: the whole row is read again only when none ran.
    if !masked && !buf.iter().any(|&l| l > f32::NEG_INFINITY) {
        return Err(Error::NothingAllowed);
    }
    Ok(sampler.sample_with(buf, rng, &mut scratch.sampler))
}
