//! The bookkeeping of beam search without a model: which candidates continue, which finish,
//! and when the search is over — Hugging Face transformers' `_beam_search` (v5:
//! `GenerationMixin._get_top_k_continuations`, `_get_running_beams_for_next_iteration`,
//! `_update_finished_beams`, `_check_early_stop_heuristic` and
//! `_beam_search_has_unfinished_sequences` in `generation/utils.py`) for one prompt.
//!
//! Hugging Face keeps `num_beams` running slots from the first step (copies of the prompt
//! scored −1e9) and pads the finished set with −1e9 placeholders; this keeps only real beams.
//! The two agree whenever each step has at least `K` finite candidates (any unrestricted
//! vocabulary); with fewer (a vocabulary restricted below `K` tokens), Hugging Face would
//! continue −1e9-scored copies where this keeps fewer beams.

use crate::error::{Error, Result};

use super::{BeamHypothesis, BeamSearchConfig, EarlyStopping};

/// A running beam: the whole sequence (prompt first) and its summed log-probability.
#[derive(Debug, Clone)]
struct Running {
    tokens: Vec<u32>,
    sum_logprobs: f32,
}

/// One candidate continuation of a step: its running beam, token and summed log-probability.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    beam: usize,
    token: u32,
    sum_logprobs: f32,
}

/// Beam search as a state machine fed with each step's log-probabilities: the pure
/// bookkeeping that [`beam_search`](super::beam_search) drives with a model, usable with any
/// other scorer.
///
/// Each step, report for every running beam (in [`BeamScorer::running`] order) its
/// candidates as `(token, log-probability)` pairs — at least the
/// [`BeamScorer::candidates_per_beam`] most likely tokens of the log-softmax over the whole
/// vocabulary, or every allowed token when the vocabulary is restricted (masked tokens simply
/// left out, not renormalised) — then read the new running beams.
///
/// ```
/// use weft::beam::{BeamScorer, BeamSearchConfig};
/// # fn main() -> weft::Result<()> {
/// let config = BeamSearchConfig::new(2).max_new_tokens(3).eos_token_id(0);
/// let mut scorer = BeamScorer::new(&[7], &config)?;
/// while !scorer.is_done() {
///     // A toy model: token 1 is likely, EOS (0) less so, token 2 rarely.
///     let steps: Vec<Vec<(u32, f32)>> = scorer
///         .running()
///         .map(|_seq| vec![(1, -0.2), (0, -1.8), (2, -3.0)])
///         .collect();
///     scorer.step(&steps)?;
/// }
/// let best = scorer.finish();
/// assert_eq!(best[0].tokens, [7, 1, 1, 1]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct BeamScorer {
    num_beams: usize,
    /// Hugging Face's `beams_to_keep`: `max(2, 1 + n_eos) · num_beams` candidates a step.
    beams_to_keep: usize,
    num_return_sequences: usize,
    length_penalty: f32,
    early_stopping: EarlyStopping,
    eos: Vec<u32>,
    prompt_len: usize,
    /// Prompt plus `max_new_tokens`.
    max_len: usize,
    /// Length of the running sequences.
    cur_len: usize,
    running: Vec<Running>,
    /// At most `num_beams` hypotheses, best first.
    finished: Vec<BeamHypothesis>,
    /// Hugging Face's `is_early_stop_heuristic_unsatisfied`: a running beam may still beat
    /// the worst finished hypothesis. Once false, it stays false.
    improvable: bool,
    done: bool,
}

impl BeamScorer {
    /// A search from `prompt` (not empty) under `config`. Without a model, EOS ids come only
    /// from [`BeamSearchConfig::eos_token_ids`] (unset means none).
    pub fn new(prompt: &[u32], config: &BeamSearchConfig) -> Result<BeamScorer> {
        config.validate()?;
        if prompt.is_empty() {
            return Err(Error::EmptyPass);
        }
        let eos = config.eos.clone().unwrap_or_default();
        Ok(BeamScorer {
            num_beams: config.num_beams,
            beams_to_keep: 2.max(1 + eos.len()) * config.num_beams,
            num_return_sequences: config.num_return_sequences,
            length_penalty: config.length_penalty,
            // Hugging Face decodes greedily with one beam: a hypothesis that ends is the
            // result, which is `True` here (`Never` could otherwise continue past an EOS).
            early_stopping: if config.num_beams == 1 {
                EarlyStopping::True
            } else {
                config.early_stopping
            },
            eos,
            prompt_len: prompt.len(),
            max_len: prompt.len().saturating_add(config.max_new_tokens),
            cur_len: prompt.len(),
            running: vec![Running {
                tokens: prompt.to_vec(),
                sum_logprobs: 0.0,
            }],
            finished: Vec::new(),
            improvable: true,
            done: false,
        })
    }

    /// Whether the search is over (then [`BeamScorer::finish`] gives the result).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The running beams' sequences (prompt first), best first: what the next step scores.
    /// At most `num_beams`; one before the first step.
    pub fn running(&self) -> impl ExactSizeIterator<Item = &[u32]> {
        self.running.iter().map(|r| r.tokens.as_slice())
    }

    /// How many of its most likely tokens each running beam must report to a step:
    /// `max(2, 1 + number of EOS ids) · num_beams` (Hugging Face's `beams_to_keep`), enough for
    /// `num_beams` beams to continue even if the best candidates all end.
    pub fn candidates_per_beam(&self) -> usize {
        self.beams_to_keep
    }

    /// Tokens generated so far by the running beams.
    pub fn generated_len(&self) -> usize {
        self.cur_len - self.prompt_len
    }

    /// One step: `candidates[i]` holds `(token, log-probability)` pairs for the `i`-th
    /// running beam. Keeps the `K` best continuations over all beams by summed
    /// log-probability (ties: earlier beam, then lower id); those among the first
    /// `num_beams` that end (an EOS id, or the length limit) become hypotheses scored
    /// `sum / generated_len^length_penalty`, and the best `num_beams` that do not end keep
    /// running. Returns, for each new running beam, the index of the beam it extends (its
    /// new token is the last of its sequence). Non-finite log-probabilities are left out.
    pub fn step(&mut self, candidates: &[Vec<(u32, f32)>]) -> Result<Vec<usize>> {
        if self.done {
            return Err(Error::BeamSearch {
                reason: "step after the search ended".into(),
            });
        }
        if candidates.len() != self.running.len() {
            return Err(Error::BeamSearch {
                reason: format!(
                    "{} candidate lists for {} running beams",
                    candidates.len(),
                    self.running.len()
                ),
            });
        }
        let top = self.top_candidates(candidates);
        let new_len = self.cur_len + 1;
        let at_max = new_len >= self.max_len;
        let ends: Vec<bool> = top
            .iter()
            .map(|c| at_max || self.eos.contains(&c.token))
            .collect();

        // The best `num_beams` that do not end continue.
        let next: Vec<Candidate> = top
            .iter()
            .zip(&ends)
            .filter(|(_, &end)| !end)
            .take(self.num_beams)
            .map(|(c, _)| *c)
            .collect();

        // Of the first `num_beams`, those that end are hypotheses — unless the finished set
        // is closed (`early_stopping` true and full, or no running beam can improve it).
        let full = self.finished.len() == self.num_beams;
        let closed = (full && self.early_stopping == EarlyStopping::True) || !self.improvable;
        if !closed {
            let generated = new_len - self.prompt_len;
            let ended = top.iter().zip(&ends).take(self.num_beams);
            for (c, _) in ended.filter(|(_, &end)| end) {
                let mut tokens = self.running[c.beam].tokens.clone();
                tokens.push(c.token);
                self.add_finished(BeamHypothesis {
                    tokens,
                    prompt_len: self.prompt_len,
                    score: self.normalise(c.sum_logprobs, generated),
                    sum_logprobs: c.sum_logprobs,
                });
            }
        }

        let parents = next.iter().map(|c| c.beam).collect();
        self.running = next
            .iter()
            .map(|c| {
                let mut tokens = self.running[c.beam].tokens.clone();
                tokens.push(c.token);
                Running {
                    tokens,
                    sum_logprobs: c.sum_logprobs,
                }
            })
            .collect();
        self.cur_len = new_len;
        self.improvable = self.improvable && self.can_improve();
        let full = self.finished.len() == self.num_beams;
        self.done = !self.improvable
            || (full && self.early_stopping == EarlyStopping::True)
            || self.running.is_empty();
        Ok(parents)
    }

    /// The best `num_return_sequences` hypotheses, by normalised score, best first. Fewer only
    /// when fewer finished (a vocabulary restricted below `num_beams` continuations).
    pub fn finish(mut self) -> Vec<BeamHypothesis> {
        self.finished.truncate(self.num_return_sequences);
        self.finished
    }

    /// The `K` best candidates over all beams, by summed log-probability, best first (ties:
    /// the earlier beam, then the lower id, as Hugging Face's flat `beam · vocab + id` index).
    fn top_candidates(&self, candidates: &[Vec<(u32, f32)>]) -> Vec<Candidate> {
        let mut all: Vec<Candidate> = Vec::new();
        for (beam, (list, run)) in candidates.iter().zip(&self.running).enumerate() {
            for &(token, lp) in list {
                let sum_logprobs = run.sum_logprobs + lp;
                if sum_logprobs.is_finite() {
                    all.push(Candidate {
                        beam,
                        token,
                        sum_logprobs,
                    });
                }
            }
        }
        // A token reported twice for one beam counts once, at its best score: grouped by
        // (beam, token), best first, the first of each group kept.
        all.sort_by(|a, b| {
            (a.beam, a.token)
                .cmp(&(b.beam, b.token))
                .then(b.sum_logprobs.total_cmp(&a.sum_logprobs))
        });
        all.dedup_by(|a, b| a.beam == b.beam && a.token == b.token);
        all.sort_by(|a, b| {
            b.sum_logprobs
                .total_cmp(&a.sum_logprobs)
                .then(a.beam.cmp(&b.beam))
                .then(a.token.cmp(&b.token))
        });
        all.truncate(self.beams_to_keep);
        all
    }

    /// `sum / len^length_penalty`, in f32 as Hugging Face computes it.
    fn normalise(&self, sum_logprobs: f32, len: usize) -> f32 {
        sum_logprobs / (len as f64).powf(f64::from(self.length_penalty)) as f32
    }

    /// Inserts a hypothesis, keeping the `num_beams` best (ties: the earlier one first).
    fn add_finished(&mut self, h: BeamHypothesis) {
        let at = self.finished.partition_point(|f| f.score >= h.score);
        if at < self.num_beams {
            self.finished.insert(at, h);
            self.finished.truncate(self.num_beams);
        }
    }

    /// Hugging Face's early-stop heuristic after a step: can the best running beam still beat
    /// the worst finished hypothesis? Always while the finished set is not full. The best
    /// running beam is judged at its current generated length, or — with `early_stopping`
    /// never and a positive length penalty — at the longest it may grow.
    fn can_improve(&self) -> bool {
        if self.finished.len() < self.num_beams {
            return true;
        }
        let Some(best) = self.running.first() else {
            return false;
        };
        let len = if self.early_stopping == EarlyStopping::Never && self.length_penalty > 0.0 {
            self.max_len - self.prompt_len
        } else {
            self.cur_len - self.prompt_len
        };
        let worst = self.finished.last().map_or(f32::NEG_INFINITY, |h| h.score);
        self.normalise(best.sum_logprobs, len) > worst
    }
}
