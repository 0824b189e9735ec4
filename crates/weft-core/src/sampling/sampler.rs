//! Choosing the next token: greedy, temperature, top-k, top-p and min-p sampling.

use super::{by_rank, clean, greedy, keep_top_sorted, max_logit, weight, Rng, SamplerError};

/// The id of the largest logit: the lowest id on ties, NaN read as `-inf`, 0 for an empty or
/// all-NaN row.
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes the compiler vectorizes — the largest value in 8 lanes, then the first index
    // holding it — instead of one compare-and-branch per logit (Gemma's rows are 262,144
    // long, one per sequence per step). NaN is never the max; all -inf or NaN gives 0.
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = logits.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v);
        }
    }
    let m = lanes
        .iter()
        .chain(chunks.remainder())
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == m).unwrap_or(0) as u32
}

/// Draws a token from `softmax(logits / temperature)`; greedy ([`argmax`], no random number
/// drawn) when `temperature` is 0, negative or NaN. Otherwise draws exactly one
/// [`Rng::next_f32`] `u` and returns the first id (in id order) at which the cumulative weight
/// reaches `u` times the total. Same as [`Sampler::Temperature`].
pub fn sample_temperature(logits: &[f32], temperature: f32, rng: &mut Rng) -> u32 {
    if greedy(temperature) || logits.is_empty() {
        return argmax(logits);
    }
    draw_linear(logits, temperature, rng.next_f32())
}

/// Inverse-CDF draw over the whole row in id order, `u` in `[0, 1)`.
fn draw_linear(logits: &[f32], t: f32, u: f32) -> u32 {
    let m = max_logit(logits);
    if !m.is_finite() {
        return argmax(logits); // no finite logit, or a +inf one: nothing to weigh
    }
    let w = |l: f32| f64::from(weight((clean(l) - m) / t));
    let total: f64 = logits.iter().map(|&l| w(l)).sum();
    pick(
        logits.iter().enumerate().map(|(i, &l)| (i as u32, w(l))),
        total,
        u,
    )
    .unwrap_or_else(|| argmax(logits))
}

/// The first item at which the running weight reaches `u * total`, skipping zero weights;
/// the last positive one if rounding leaves the target unreached; None if all are zero.
fn pick(items: impl Iterator<Item = (u32, f64)>, total: f64, u: f32) -> Option<u32> {
    let mut target = f64::from(u) * total;
    let mut last = None;
    for (id, w) in items.filter(|&(_, w)| w > 0.0) {
        if target <= w {
            return Some(id);
        }
        target -= w;
        last = Some(id);
    }
    last
}

/// How the next token is chosen from a logits row.
///
/// Every variant but [`Sampler::Argmax`] works on `softmax(logits / temperature)` and is greedy
/// at temperature 0. The filters run in llama.cpp's chain order: top-k keeps the `k` most likely
/// tokens (all when `k` ≥ vocabulary); top-p then keeps the smallest most-likely-first prefix
/// whose mass (renormalized after top-k) reaches `p`; min-p keeps tokens with probability ≥ `p`
/// × the top probability. The token is then drawn from the kept tokens, renormalized. At least
/// one token is always kept; ties go to the lower id; NaN logits count as `-inf`, and a `+inf`
/// logit is chosen outright.
///
/// All filters see the probabilities *at the temperature*, as Hugging Face's warpers do.
/// llama.cpp's default chain applies its temperature after top-p and min-p, so for a
/// temperature other than 1 those two keep different sets there (top-k does not depend on it).
///
/// Determinism: a non-greedy sample draws exactly one [`Rng::next_f32`], a greedy one none, so
/// the same seed and logits give the same tokens.
///
/// ```
/// use weft_core::sampling::{Rng, SampleScratch, Sampler};
///
/// let logits = [1.0f32, 3.0, 2.0, -1.0];
/// let sampler = Sampler::TopK { k: 2, temperature: 0.8 };
/// sampler.validate(logits.len())?;
/// let mut rng = Rng::new(42);
/// let id = sampler.sample(&logits, &mut rng);
/// assert!(id == 1 || id == 2); // only the two largest logits can be drawn
///
/// // A reusable scratch avoids an allocation per token in a generation loop.
/// let mut scratch = SampleScratch::new();
/// let top_p = Sampler::TopP { p: 0.9, temperature: 0.7 };
/// for _ in 0..4 {
///     assert!(top_p.sample_with(&logits, &mut rng, &mut scratch) < 4);
/// }
/// assert_eq!(Sampler::Argmax.sample(&logits, &mut rng), 1);
/// # Ok::<(), weft_core::sampling::SamplerError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Sampler {
    /// Always the most likely token.
    Argmax,
    /// Plain sampling from the softmax at `temperature` (see [`sample_temperature`]).
    Temperature {
        /// Softmax temperature, ≥ 0 (0 = greedy).
        temperature: f32,
    },
    /// Sampling among the `k` most likely tokens.
    TopK {
        /// How many of the most likely tokens to keep, ≥ 1.
        k: usize,
        /// Softmax temperature, ≥ 0 (0 = greedy).
        temperature: f32,
    },
    /// Nucleus sampling: the smallest set of most likely tokens with mass ≥ `p`.
    TopP {
        /// Probability mass to keep, in `(0, 1]` (1 = everything).
        p: f32,
        /// Softmax temperature, ≥ 0 (0 = greedy).
        temperature: f32,
    },
    /// Sampling among tokens with probability ≥ `p` × the top token's probability.
    MinP {
        /// Fraction of the top probability a token needs, in `[0, 1]` (0 = everything).
        p: f32,
        /// Softmax temperature, ≥ 0 (0 = greedy).
        temperature: f32,
    },
    /// Top-k, then top-p over the `k` survivors renormalized.
    TopKTopP {
        /// How many of the most likely tokens to keep, ≥ 1.
        k: usize,
        /// Probability mass to keep among them, in `(0, 1]`.
        p: f32,
        /// Softmax temperature, ≥ 0 (0 = greedy).
        temperature: f32,
    },
    /// The whole chain: top-k, then top-p, then min-p, each off at its neutral value (what an
    /// OpenAI-style request with `top_k`, `top_p` and `min_p` asks for).
    Chain {
        /// How many of the most likely tokens to keep, ≥ 1 (≥ vocabulary: off).
        k: usize,
        /// Probability mass to keep, in `(0, 1]` (1: off).
        p: f32,
        /// Fraction of the top probability a token needs, in `[0, 1]` (0: off).
        min_p: f32,
        /// Softmax temperature, ≥ 0 (0 = greedy).
        temperature: f32,
    },
}

/// Reusable working memory for [`Sampler::sample_with`]: keep one per generation loop (or per
/// thread) so sampling a 262144-entry vocabulary does not allocate per token.
#[derive(Clone, Debug, Default)]
pub struct SampleScratch {
    /// `(id, logit)` candidates of the current sample.
    cand: Vec<(u32, f32)>,
}

impl SampleScratch {
    /// An empty scratch; it grows to the candidate count of the largest sample it serves.
    pub fn new() -> SampleScratch {
        SampleScratch::default()
    }
}

impl Sampler {
    /// The sampler for the knobs every front end exposes (llama.cpp's `--temp --top-k
    /// --top-p --min-p`, OpenAI's `temperature` and `top_p`), each range checked here once so
    /// the CLI, the server and library users refuse the same values: temperature finite and
    /// ≥ 0 (0 is greedy: [`Sampler::Argmax`]), top-p in `(0, 1]`, min-p in `[0, 1]`. A `top_k`
    /// of 0 is off, as in llama.cpp; filters not given are off.
    ///
    /// ```
    /// use weft_core::sampling::{Sampler, SamplerError};
    /// assert_eq!(Sampler::from_params(0.0, None, None, None, 100)?, Sampler::Argmax);
    /// assert_eq!(
    ///     Sampler::from_params(0.7, None, None, None, 100)?,
    ///     Sampler::Temperature { temperature: 0.7 }
    /// );
    /// assert!(matches!(
    ///     Sampler::from_params(-1.0, None, None, None, 100),
    ///     Err(SamplerError::Temperature { .. })
    /// ));
    /// assert!(Sampler::from_params(0.0, None, Some(1.5), None, 100).is_err());
    /// # Ok::<(), SamplerError>(())
    /// ```
    pub fn from_params(
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        min_p: Option<f32>,
        vocab: usize,
    ) -> Result<Sampler, SamplerError> {
        let top_k = top_k.filter(|&k| k > 0);
        let chain = Sampler::Chain {
            k: top_k.unwrap_or(vocab).max(1),
            p: top_p.unwrap_or(1.0),
            min_p: min_p.unwrap_or(0.0),
            temperature,
        };
        chain.validate(vocab)?;
        Ok(if greedy(temperature) {
            Sampler::Argmax
        } else if top_k.is_none() && top_p.is_none() && min_p.is_none() {
            Sampler::Temperature { temperature }
        } else {
            chain
        })
    }

    /// The sampling temperature (0 for [`Sampler::Argmax`]).
    pub fn temperature(&self) -> f32 {
        match *self {
            Sampler::Argmax => 0.0,
            Sampler::Temperature { temperature }
            | Sampler::TopK { temperature, .. }
            | Sampler::TopP { temperature, .. }
            | Sampler::MinP { temperature, .. }
            | Sampler::TopKTopP { temperature, .. }
            | Sampler::Chain { temperature, .. } => temperature,
        }
    }

    /// Whether sampling is greedy (argmax, no random number drawn): temperature 0.
    pub fn is_greedy(&self) -> bool {
        greedy(self.temperature())
    }

    /// Checks the parameters for a vocabulary of `vocab` tokens: temperature finite and ≥ 0,
    /// top-p in `(0, 1]`, min-p in `[0, 1]`, `k` ≥ 1 (a `k` past the vocabulary is fine: it
    /// keeps everything), and a non-empty vocabulary.
    pub fn validate(&self, vocab: usize) -> Result<(), SamplerError> {
        if vocab == 0 {
            return Err(SamplerError::EmptyVocabulary);
        }
        let temperature = self.temperature();
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(SamplerError::Temperature { temperature });
        }
        match *self {
            Sampler::TopK { k: 0, .. }
            | Sampler::TopKTopP { k: 0, .. }
            | Sampler::Chain { k: 0, .. } => Err(SamplerError::TopK),
            Sampler::TopP { p, .. } | Sampler::TopKTopP { p, .. } | Sampler::Chain { p, .. }
                if !(p > 0.0 && p <= 1.0) =>
            {
                Err(SamplerError::TopP { p })
            }
            Sampler::MinP { p, .. } | Sampler::Chain { min_p: p, .. }
                if !(0.0..=1.0).contains(&p) =>
            {
                Err(SamplerError::MinP { p })
            }
            _ => Ok(()),
        }
    }

    /// Chooses a token from `logits` (left untouched), allocating fresh working memory; see
    /// [`Sampler::sample_with`] to reuse it across calls. The result is the same either way.
    pub fn sample(&self, logits: &[f32], rng: &mut Rng) -> u32 {
        self.sample_with(logits, rng, &mut SampleScratch::new())
    }

    /// Chooses a token from `logits` (left untouched) with reusable working memory.
    ///
    /// Never panics, whatever the parameters: unvalidated values are read leniently (`k` = 0
    /// as 1, a top-p ≥ 1 or NaN as off, a min-p ≤ 0 or NaN as off). An empty row gives 0.
    pub fn sample_with(&self, logits: &[f32], rng: &mut Rng, scratch: &mut SampleScratch) -> u32 {
        let t = self.temperature();
        if greedy(t) || logits.is_empty() {
            return argmax(logits);
        }
        let u = rng.next_f32();
        let n = logits.len();
        let (k, p, min_p) = match *self {
            Sampler::Argmax | Sampler::Temperature { .. } => (n, 1.0, 0.0),
            Sampler::TopK { k, .. } => (k, 1.0, 0.0),
            Sampler::TopP { p, .. } => (n, p, 0.0),
            Sampler::MinP { p, .. } => (n, 1.0, p),
            Sampler::TopKTopP { k, p, .. } => (k, p, 0.0),
            Sampler::Chain { k, p, min_p, .. } => (k, p, min_p),
        };
        let k = k.clamp(1, n);
        let (top_k, top_p, use_min_p) = (k < n, p < 1.0, min_p > 0.0);
        if !(top_k || top_p || use_min_p) {
            return draw_linear(logits, t, u);
        }
        let m = max_logit(logits);
        if !m.is_finite() {
            return argmax(logits); // a +inf logit wins outright
        }
        let row = Row { logits, m, t };
        let kept = row.filter(k, p, min_p, &mut scratch.cand);
        let total = kept.iter().map(|c| row.w(c.1)).sum();
        let items = kept.iter().map(|&(id, l)| (id, row.w(l)));
        pick(items, total, u).unwrap_or_else(|| argmax(logits))
    }
}

/// A logits row with finite maximum `m`, sampled at temperature `t` > 0. Candidates are
/// `(id, logit)` pairs with NaN logits read as `-inf`, ranked by [`by_rank`].
struct Row<'a> {
    logits: &'a [f32],
    m: f32,
    t: f32,
}

impl Row<'_> {
    /// The scaled logit `(l - m) / t` (≤ 0).
    fn s(&self, l: f32) -> f32 {
        (clean(l) - self.m) / self.t
    }

    /// The unnormalized probability `exp((l - m) / t)`, in `[0, 1]`.
    fn w(&self, l: f32) -> f64 {
        f64::from(weight(self.s(l)))
    }

    /// Fills `cand` with every token whose scaled logit is ≥ `cut`.
    fn gather(&self, cut: f32, cand: &mut Vec<(u32, f32)>) {
        cand.clear();
        for (i, &l) in self.logits.iter().enumerate() {
            if self.s(l) >= cut {
                cand.push((i as u32, clean(l)));
            }
        }
    }

    /// Top-p without top-k: fills `cand` with a superset of the nucleus and returns the weight
    /// of the whole row. One pass sums the weight of the row and the weight above each of a
    /// ladder of cuts on the scaled logit; the candidates are the tokens above the highest cut
    /// whose weight reaches `p` (all tokens if none does). Every token above a cut is more
    /// likely than every token below it, so the nucleus is among them.
    fn nucleus_candidates(&self, p: f32, cand: &mut Vec<(u32, f32)>) -> f64 {
        const CUTS: [f32; 10] = [
            -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0, -16.0, -20.0, -24.0,
        ];
        let (mut all, mut above) = (0.0f64, [0.0f64; CUTS.len()]);
        for &l in self.logits {
            let s = self.s(l);
            let w = f64::from(weight(s));
            all += w;
            // Branch-free, independent sums: about the cost of the exp alone.
            for (a, &c) in above.iter_mut().zip(&CUTS) {
                *a += if s >= c { w } else { 0.0 };
            }
        }
        let target = f64::from(p) * all;
        let cut = CUTS.iter().zip(above).find(|&(_, a)| a >= target);
        self.gather(cut.map_or(f32::NEG_INFINITY, |(&c, _)| c), cand);
        all
    }

    /// Fills `cand` with the `k` best tokens, sorted, in one streaming pass: candidates are
    /// buffered, and each time the buffer fills it is cut back to its best `k` by selection,
    /// whose worst then bars every later token that does not beat it. O(vocabulary) for small k.
    fn top_k(&self, k: usize, cand: &mut Vec<(u32, f32)>) {
        let k = k.max(1);
        cand.clear();
        let cap = 2 * k + 1024;
        let mut bar = f32::NEG_INFINITY;
        let mut full = false;
        for (i, &l) in self.logits.iter().enumerate() {
            let l = clean(l);
            // Later ids lose ties, so a token must beat the bar strictly.
            if full && l <= bar {
                continue;
            }
            cand.push((i as u32, l));
            if cand.len() == cap {
                keep_top_sorted(cand, k);
                (bar, full) = (cand[k - 1].1, true);
            }
        }
        keep_top_sorted(cand, k);
    }

    /// Top-p: orders `cand` best first only as far as needed and cuts it to the smallest prefix
    /// whose weight reaches `p` × `total` (the candidates' own weight when None); all of it if
    /// rounding never gets there. Chunks of growing size are selected then sorted, so a small
    /// nucleus costs a few linear passes, not a sort of every candidate.
    fn nucleus(&self, p: f32, total: Option<f64>, cand: &mut Vec<(u32, f32)>) {
        let z = total.unwrap_or_else(|| cand.iter().map(|c| self.w(c.1)).sum());
        let target = f64::from(p) * z;
        let (mut cum, mut done, mut chunk) = (0.0, 0, 64);
        while done < cand.len() {
            let (len, end) = (cand.len(), (done + chunk).min(cand.len()));
            if end < len {
                cand[done..].select_nth_unstable_by(end - done - 1, by_rank);
            }
            cand[done..end].sort_unstable_by(by_rank);
            let hit = cand[done..end].iter().position(|c| {
                cum += self.w(c.1);
                cum >= target
            });
            if let Some(i) = hit {
                cand.truncate(done + i + 1);
                return;
            }
            (done, chunk) = (end, chunk * 8);
        }
    }

    /// Applies top-k (`k` < vocabulary), then top-p (`p` < 1), then min-p (`min_p` > 0),
    /// leaving the kept candidates in `cand` (at least one).
    fn filter<'c>(
        &self,
        k: usize,
        p: f32,
        min_p: f32,
        cand: &'c mut Vec<(u32, f32)>,
    ) -> &'c [(u32, f32)] {
        let (top_k, top_p) = (k < self.logits.len(), p < 1.0);
        let mut total = None;
        if top_k {
            self.top_k(k, cand);
        } else if top_p {
            total = Some(self.nucleus_candidates(p, cand));
        } else {
            // Min-p alone: exactly the tokens with weight >= min_p (test below), with a margin.
            let cut = if min_p > 0.0 {
                min_p.ln() - 1e-3
            } else {
                f32::NEG_INFINITY
            };
            self.gather(cut, cand);
        }
        if top_p {
            self.nucleus(p, total, cand);
        }
        if min_p > 0.0 {
            // The top token has weight exp(0) = 1, so "p >= min_p * p_max" is "weight >= min_p".
            let top = cand.iter().copied().min_by(by_rank);
            cand.retain(|c| weight(self.s(c.1)) >= min_p);
            if let (true, Some(top)) = (cand.is_empty(), top) {
                cand.push(top); // only when min_p > 1 (unvalidated): keep the most likely token
            }
        }
        cand
    }
}

#[cfg(test)]
mod tests;
