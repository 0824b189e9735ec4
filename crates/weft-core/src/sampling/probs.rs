//! Probability math over a logits row, for probes: log-probabilities, entropy and the top of
//! the distribution. Sums are accumulated in f64 after subtracting the row maximum, so rows with
//! large logits (or a 262144-entry vocabulary) lose no precision.
//!
//! A row with no finite logit (empty, or all NaN / `-inf`) has no distribution: log-probabilities,
//! probabilities and entropy come out NaN. `+inf` logits share all the probability equally.

use super::{clean, greedy, keep_top_sorted, max_logit, shift, weight};

/// The row maximum `m` and `ln Σ exp(l - m)` (the log partition function is `m + ` that).
fn log_partition(logits: &[f32]) -> (f32, f64) {
    let m = max_logit(logits);
    if m == f32::NEG_INFINITY {
        return (m, f64::NAN);
    }
    // exp in f32 (fast, 1e-7 relative error), accumulated in f64.
    let z: f64 = logits
        .iter()
        .map(|&l| f64::from(weight(shift(l, m) as f32)))
        .sum();
    (m, z.ln())
}

/// The natural-log softmax of `logits`, written to `out` (cleared first, same length):
/// `out[i] = l_i − m − ln Σ_j exp(l_j − m)` with `m` the row maximum.
pub fn log_softmax(logits: &[f32], out: &mut Vec<f32>) {
    out.clear();
    let (m, ln_z) = log_partition(logits);
    out.extend(logits.iter().map(|&l| (shift(l, m) - ln_z) as f32));
}

/// The natural-log probabilities of the tokens `ids` under `softmax(logits)`, without building
/// the whole log-softmax; NaN for an id past the end of the row.
pub fn logprobs_of(logits: &[f32], ids: &[u32]) -> Vec<f32> {
    let (m, ln_z) = log_partition(logits);
    let lp = |id: u32| {
        logits
            .get(id as usize)
            .map_or(f32::NAN, |&l| (shift(l, m) - ln_z) as f32)
    };
    ids.iter().map(|&id| lp(id)).collect()
}

/// The entropy of `softmax(logits)` in nats, `−Σ p ln p`. With `s_i = l_i − m` and
/// `Z = Σ e^{s_i}`, `ln p_i = s_i − ln Z`, so `H = ln Z − Σ e^{s_i} s_i / Z`: no probability is
/// ever formed or logged, and zero-probability tokens contribute exactly 0.
pub fn entropy(logits: &[f32]) -> f32 {
    let m = max_logit(logits);
    if m == f32::NEG_INFINITY {
        return f32::NAN;
    }
    let (mut z, mut zs) = (0.0f64, 0.0f64);
    for &l in logits {
        let s = shift(l, m);
        let w = f64::from(weight(s as f32));
        if w > 0.0 {
            z += w;
            zs += w * s;
        }
    }
    (z.ln() - zs / z).max(0.0) as f32
}

/// The `k` most likely tokens of `softmax(logits / temperature)` and their probabilities, most
/// likely first (ties: lower id first; NaN logits rank as `-inf`). `k` = 0 (or ≥ the vocabulary)
/// returns the whole vocabulary, sorted. Temperature 0 (or negative, or NaN) is the greedy limit:
/// probability 1 on [`argmax`](super::argmax) and 0 elsewhere, the rest still ranked by logit.
///
/// Probabilities are normalized over the whole vocabulary, so they sum to 1 only when `k`
/// covers it. Selection is O(vocabulary + k log k).
pub fn distribution(logits: &[f32], temperature: f32, k: usize) -> (Vec<u32>, Vec<f32>) {
    let n = logits.len();
    let k = if k == 0 { n } else { k.min(n) };
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, clean(l)))
        .collect();
    keep_top_sorted(&mut cand, k);
    let ids: Vec<u32> = cand.iter().map(|c| c.0).collect();
    let probs = if greedy(temperature) {
        (0..ids.len())
            .map(|i| if i == 0 { 1.0 } else { 0.0 })
            .collect()
    } else {
        let m = max_logit(logits);
        let w = |l: f32| f64::from(weight((shift(l, m) / f64::from(temperature)) as f32));
        let z: f64 = if m == f32::NEG_INFINITY {
            f64::NAN
        } else {
            logits.iter().map(|&l| w(l)).sum()
        };
        cand.iter().map(|&(_, l)| (w(l) / z) as f32).collect()
    };
    (ids, probs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f64, tol: f64) -> bool {
        (f64::from(a) - b).abs() <= tol
    }

    #[test]
    fn log_softmax_of_one_two_three() {
        // ln(e + e² + e³) = 3 + ln(1 + e⁻¹ + e⁻²) = 3 + ln(1.5032147244) = 3.4076059644.
        let lse = 3.0 + (1.0 + (-1f64).exp() + (-2f64).exp()).ln();
        assert!((lse - 3.407_605_964_4).abs() < 1e-9);
        let mut out = Vec::new();
        log_softmax(&[1.0, 2.0, 3.0], &mut out);
        for (i, &o) in out.iter().enumerate() {
            assert!(close(o, (i + 1) as f64 - lse, 1e-6), "{out:?}");
        }
        // Shifting every logit changes nothing, even far from 0.
        log_softmax(&[10_001.0, 10_002.0, 10_003.0], &mut out);
        assert!(
            close(out[0], 1.0 - lse, 1e-6) && close(out[2], 3.0 - lse, 1e-6),
            "{out:?}"
        );
    }

    #[test]
    fn log_softmax_sums_to_one_and_logprobs_agree() {
        let mut r = super::super::Rng::new(11);
        let logits: Vec<f32> = (0..50_000)
            .map(|_| r.next_f32() * 40.0 - 20.0 + 500.0)
            .collect();
        let mut out = Vec::new();
        log_softmax(&logits, &mut out);
        let total: f64 = out.iter().map(|&o| f64::from(o).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        let ids = [0, 7, 49_999, 50_000];
        let lp = logprobs_of(&logits, &ids);
        assert_eq!(&lp[..3], &[out[0], out[7], out[49_999]]);
        assert!(lp[3].is_nan());
    }

    #[test]
    fn entropy_known_values() {
        for n in [1usize, 2, 10, 262_144] {
            assert!(
                close(entropy(&vec![3.5; n]), (n as f64).ln(), 1e-5),
                "n = {n}"
            );
        }
        // [0.25, 0.75]: −(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351446.
        assert!(close(entropy(&[0.0, 3f32.ln()]), 0.562_335_144_6, 1e-6));
        // One overwhelming token: ~0; a banned token adds nothing.
        assert!(entropy(&[0.0, 1000.0]) < 1e-6);
        assert!(close(
            entropy(&[1.0, 1.0, f32::NEG_INFINITY, f32::NAN]),
            2f64.ln(),
            1e-6
        ));
    }

    #[test]
    fn distribution_ranks_and_normalizes() {
        let logits = [1.0, 3.0, 2.0, f32::NAN];
        let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
        let (ids, p) = distribution(&logits, 1.0, 2);
        assert_eq!(ids, [1, 2]);
        assert!(close(p[0], 3f64.exp() / z, 1e-6) && close(p[1], 2f64.exp() / z, 1e-6));
        // T = 0.5 doubles the logits: weights e², e⁶, e⁴.
        let (ids, p) = distribution(&logits, 0.5, 0);
        let z2 = 2f64.exp() + 4f64.exp() + 6f64.exp();
        assert_eq!(ids, [1, 2, 0, 3]);
        let want = [6f64.exp() / z2, 4f64.exp() / z2, 2f64.exp() / z2, 0.0];
        assert!(p.iter().zip(want).all(|(&a, b)| close(a, b, 1e-6)), "{p:?}");
        // Greedy limit and ties.
        assert_eq!(
            distribution(&logits, 0.0, 0),
            (vec![1, 2, 0, 3], vec![1.0, 0.0, 0.0, 0.0])
        );
        assert_eq!(distribution(&[2.0, 2.0, 1.0], 0.0, 9).0, [0, 1, 2]);
        let (ids, p) = distribution(&[2.0, 2.0, f32::INFINITY], 1.0, 0);
        assert_eq!((ids, p), (vec![2, 0, 1], vec![1.0, 0.0, 0.0]));
        assert_eq!(distribution(&[], 1.0, 3), (vec![], vec![]));
    }

    #[test]
    fn degenerate_rows_are_nan_not_panics() {
        let mut out = Vec::new();
        for row in [&[][..], &[f32::NAN, f32::NEG_INFINITY][..]] {
            log_softmax(row, &mut out);
            assert!(out.iter().all(|o| o.is_nan()));
            assert!(entropy(row).is_nan());
            assert!(distribution(row, 1.0, 0).1.iter().all(|p| p.is_nan()));
        }
        log_softmax(&[0.0, f32::INFINITY, f32::INFINITY], &mut out);
        assert_eq!(out[0], f32::NEG_INFINITY);
        assert!(close(out[1], -(2f64.ln()), 1e-7));
    }
}
