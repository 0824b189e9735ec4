//! Unit tests of the samplers: expected frequencies are computed by hand from the logits.

use super::*;

// Short constructors: rustfmt spreads struct literals over many lines.
fn temp(temperature: f32) -> Sampler {
    Sampler::Temperature { temperature }
}
fn top_k(k: usize, temperature: f32) -> Sampler {
    Sampler::TopK { k, temperature }
}
fn top_p(p: f32, temperature: f32) -> Sampler {
    Sampler::TopP { p, temperature }
}
fn min_p(p: f32, temperature: f32) -> Sampler {
    Sampler::MinP { p, temperature }
}
fn top_k_top_p(k: usize, p: f32, temperature: f32) -> Sampler {
    Sampler::TopKTopP { k, p, temperature }
}
fn row(logits: &[f32], m: f32, t: f32) -> Row<'_> {
    Row { logits, m, t }
}

const SAMPLERS: [fn(f32) -> Sampler; 6] = [
    |_| Sampler::Argmax,
    temp,
    |t| top_k(2, t),
    |t| top_p(0.9, t),
    |t| min_p(0.05, t),
    |t| top_k_top_p(3, 0.8, t),
];

/// Logits whose softmax at temperature 1 is `probs` (up to normalization).
fn ln(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|&p| p.ln() as f32).collect()
}

/// Draws 20000 tokens and checks each frequency against `expected` within 4.5 standard
/// deviations of a binomial proportion (exactly 0 where expected is 0).
fn check_frequencies(sampler: &Sampler, logits: &[f32], expected: &[f64]) {
    let n = 20_000;
    let mut rng = Rng::new(12345);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[sampler.sample(logits, &mut rng) as usize] += 1;
    }
    for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        let f = c as f64 / n as f64;
        let tol = 4.5 * (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (f - p).abs() <= tol,
            "{sampler:?} id {id}: {f} vs {p} (counts {counts:?})"
        );
    }
}

#[test]
fn argmax_breaks_ties_low_and_skips_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 0.5]), 1);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30]), 1);
    // Long rows (the vectorized path): the first of the largest, wherever it falls.
    let mut rng = Rng::new(11);
    for n in [7, 8, 9, 64, 1001] {
        let mut row: Vec<f32> = (0..n).map(|_| rng.next_f32() * 4.0 - 2.0).collect();
        row[n / 3] = f32::NAN;
        let naive = (0..n).fold(0, |b, i| {
            if row[i] > row[b] || row[b].is_nan() {
                i
            } else {
                b
            }
        });
        assert_eq!(argmax(&row) as usize, naive, "n {n}");
        row[n - 1] = 9.0;
        row[n / 2] = 9.0;
        assert_eq!(argmax(&row) as usize, n / 2, "n {n}: first of two maxima");
    }
}

#[test]
fn temperature_frequencies_match_the_softmax() {
    // softmax([0, ln 2, ln 3, -inf]) = [1/6, 2/6, 3/6, 0].
    let logits = [0.0, 2f32.ln(), 3f32.ln(), f32::NEG_INFINITY];
    check_frequencies(&temp(1.0), &logits, &[1.0 / 6.0, 2.0 / 6.0, 0.5, 0.0]);
    // At T = 0.5 the weights square: [1, 4, 9, 0] / 14.
    let t = temp(0.5);
    check_frequencies(&t, &logits, &[1.0 / 14.0, 4.0 / 14.0, 9.0 / 14.0, 0.0]);
    // The free function is the same sampler.
    let (mut a, mut b) = (Rng::new(3), Rng::new(3));
    for _ in 0..200 {
        assert_eq!(
            t.sample(&logits, &mut a),
            sample_temperature(&logits, 0.5, &mut b)
        );
    }
}

#[test]
fn top_k_one_is_argmax_for_any_seed() {
    let logits = [0.3, 2.5, -1.0, 2.5, f32::NAN, 1.0];
    for seed in 0..200 {
        let mut rng = Rng::new(seed);
        for s in [top_k(1, 1.5), top_k_top_p(1, 0.5, 3.0)] {
            assert_eq!(s.sample(&logits, &mut rng), 1);
        }
    }
}

#[test]
fn top_k_keeps_the_k_most_likely_renormalized() {
    // Weights [1, 3, 2, 6]: top-2 keeps ids 3 and 1 → [0, 1/3, 0, 2/3].
    let s = top_k(2, 1.0);
    check_frequencies(
        &s,
        &ln(&[1.0, 3.0, 2.0, 6.0]),
        &[0.0, 1.0 / 3.0, 0.0, 2.0 / 3.0],
    );
    // Ties at the boundary go to the lower id: ids 1 and 2 are kept, never 3.
    check_frequencies(&s, &[1.0, 2.0, 2.0, 2.0], &[0.0, 0.5, 0.5, 0.0]);
    // k past the vocabulary keeps everything.
    let all = top_k(99, 1.0);
    check_frequencies(&all, &ln(&[0.25, 0.75]), &[0.25, 0.75]);
}

#[test]
fn top_p_keeps_the_smallest_prefix_with_mass_p() {
    let dominant = top_p(0.9, 1.0);
    let mut rng = Rng::new(9);
    // p(0) = e^10 / (e^10 + 3) > 0.9999.
    assert!((0..1000).all(|_| dominant.sample(&[10.0, 0.0, 0.0, 0.0], &mut rng) == 0));
    // [0.5, 0.3, 0.2], p = 0.7: 0.5 < 0.7 <= 0.8 → keep {0, 1} → [5/8, 3/8, 0].
    let probs = ln(&[0.5, 0.3, 0.2]);
    check_frequencies(&top_p(0.7, 1.0), &probs, &[0.625, 0.375, 0.0]);
    // At T = 0.5 the weights square to [0.25, 0.09, 0.04] / 0.38 = [0.658, 0.237, 0.105]:
    // p = 0.85 keeps {0, 1} → [25/34, 9/34, 0].
    let s = top_p(0.85, 0.5);
    check_frequencies(&s, &probs, &[25.0 / 34.0, 9.0 / 34.0, 0.0]);
    // p = 1 keeps everything.
    check_frequencies(&top_p(1.0, 1.0), &probs, &[0.5, 0.3, 0.2]);
}

#[test]
fn top_p_candidates_reach_as_far_as_the_nucleus_does() {
    // One token at 0 and n tokens at v (weight w = e^v each), at T = 1: the nucleus is token 0
    // and the first j tail tokens, j the smallest with 1 + j w >= p Z, Z = 1 + n w. The tail
    // values fall between the cuts of the candidate ladder and below its last one.
    for (v, n, p) in [
        (-5.0f32, 10, 0.95f32),
        (-5.0, 10, 0.5),
        (-13.0, 3000, 0.999),
        (-25.0, 20_000, 0.999_999_9),
    ] {
        let mut logits = vec![v; n + 1];
        logits[0] = 0.0;
        let w = f64::from(v.exp());
        let z = 1.0 + n as f64 * w;
        let j = ((f64::from(p) * z - 1.0) / w).ceil().max(0.0) as u32;
        let mut cand = Vec::new();
        let row = row(&logits, 0.0, 1.0);
        let ids: Vec<u32> = row
            .filter(n + 1, p, 0.0, &mut cand)
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(ids, (0..=j).collect::<Vec<_>>(), "v = {v}, p = {p}");
        assert!(j > 0 || p <= 0.5);
    }
}

#[test]
fn top_k_top_p_renormalizes_after_k() {
    // [0.4, 0.3, 0.2, 0.1], k = 3 → [4/9, 3/9, 2/9]; p = 0.7: 4/9 < 0.7 <= 7/9 → [4/7, 3/7].
    let s = top_k_top_p(3, 0.7, 1.0);
    check_frequencies(
        &s,
        &ln(&[0.4, 0.3, 0.2, 0.1]),
        &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0],
    );
}

#[test]
fn min_p_excludes_unlikely_tokens() {
    // min-p 0.1 of a top probability 0.5 → threshold 0.05: 0.04 goes, the rest renormalize.
    let s = min_p(0.1, 1.0);
    let e = [0.5 / 0.96, 0.3 / 0.96, 0.0, 0.16 / 0.96];
    check_frequencies(&s, &ln(&[0.5, 0.3, 0.04, 0.16]), &e);
    // min-p 0 keeps everything; min-p 1 keeps only the top token.
    check_frequencies(&min_p(0.0, 1.0), &ln(&[0.25, 0.75]), &[0.25, 0.75]);
    check_frequencies(&min_p(1.0, 1.0), &ln(&[0.25, 0.75]), &[0.0, 1.0]);
}

#[test]
fn greedy_at_temperature_zero_draws_nothing_and_others_draw_once() {
    let logits = [0.1, -2.0, 0.7, 0.7, 0.2];
    for make in SAMPLERS {
        let (mut rng, mut fresh) = (Rng::new(5), Rng::new(5));
        assert_eq!(make(0.0).sample(&logits, &mut rng), 2);
        assert_eq!(
            rng.next_u64(),
            fresh.next_u64(),
            "{:?} drew at T = 0",
            make(0.0)
        );
        let s = make(0.8);
        let (mut rng, mut fresh) = (Rng::new(5), Rng::new(5));
        s.sample(&logits, &mut rng);
        if !s.is_greedy() {
            fresh.next_f32();
        }
        assert_eq!(
            rng.next_u64(),
            fresh.next_u64(),
            "{s:?} must draw exactly once"
        );
    }
}

#[test]
fn same_seed_same_tokens_and_scratch_changes_nothing() {
    let mut gen = Rng::new(77);
    let logits: Vec<f32> = (0..5000).map(|_| gen.next_f32() * 12.0 - 6.0).collect();
    let mut scratch = SampleScratch::new();
    for make in SAMPLERS {
        let s = make(0.9);
        let (mut a, mut b) = (Rng::new(1), Rng::new(1));
        let x: Vec<u32> = (0..50).map(|_| s.sample(&logits, &mut a)).collect();
        let y: Vec<u32> = (0..50)
            .map(|_| s.sample_with(&logits, &mut b, &mut scratch))
            .collect();
        assert_eq!(x, y, "{s:?}");
    }
}

#[test]
fn large_vocab_filters_match_a_naive_reference() {
    let mut gen = Rng::new(2024);
    let logits: Vec<f32> = (0..262_144).map(|_| gen.next_f32() * 20.0 - 10.0).collect();
    // Naive reference: a full sort by logit, then softmax at T = 0.8 in f64.
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    let m = f64::from(logits[order[0] as usize]);
    let ws: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i as usize]) - m) / 0.8).exp())
        .collect();
    let z: f64 = ws.iter().sum();
    let mut cum = 0.0;
    let n_p = 1 + ws
        .iter()
        .position(|w| {
            cum += w;
            cum >= 0.5 * z
        })
        .unwrap_or(ws.len());
    let mut cand = Vec::new();
    let big = row(&logits, m as f32, 0.8);
    let kept = big.filter(logits.len(), 0.5, 0.0, &mut cand);
    // Rounding may move the boundary by a token between f32 and f64 weights.
    assert!(kept.len().abs_diff(n_p) <= 1, "{} vs {n_p}", kept.len());
    assert!(kept.iter().zip(&order).all(|(c, &id)| c.0 == id));
    for k in [1, 40, 3000] {
        let kept = big.filter(k, 1.0, 0.0, &mut cand);
        assert_eq!(kept.iter().map(|c| c.0).collect::<Vec<_>>(), order[..k]);
    }
    // Min-p 0.05 keeps the tokens with weight >= 0.05 (in id order).
    let n_min = ws.iter().filter(|&&w| w >= 0.05).count();
    let mut kept: Vec<u32> = big
        .filter(logits.len(), 1.0, 0.05, &mut cand)
        .iter()
        .map(|c| c.0)
        .collect();
    kept.sort_unstable();
    let mut want = order[..n_min].to_vec();
    want.sort_unstable();
    assert!(kept.len().abs_diff(n_min) <= 1 && kept.iter().zip(&want).all(|(a, b)| a == b));
    // All ties: top-k keeps the lowest ids, through many buffer refills.
    let flat = vec![0.5f32; 100_000];
    let flat_row = row(&flat, 0.5, 1.0);
    let kept = flat_row.filter(40, 1.0, 0.0, &mut cand);
    assert_eq!(
        kept.iter().map(|c| c.0).collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
    let mut rng = Rng::new(4);
    for make in SAMPLERS {
        let id = make(0.8).sample(&logits, &mut rng);
        assert!((id as usize) < logits.len());
    }
}

#[test]
fn odd_logits_never_panic() {
    let rows: [&[f32]; 6] = [
        &[f32::NAN, 1.0, f32::NAN, 0.5],
        &[f32::NAN; 3],
        &[],
        &[f32::NEG_INFINITY, f32::NEG_INFINITY],
        &[0.0, f32::INFINITY, 1.0],
        &[f32::MAX, f32::MIN, f32::MAX],
    ];
    let odd = [
        top_k(0, 1.0),
        top_p(f32::NAN, 1.0),
        top_p(0.0, f32::INFINITY),
        min_p(7.0, 1.0),
        temp(f32::NAN),
    ];
    let mut rng = Rng::new(0);
    for row in rows {
        for s in SAMPLERS.iter().map(|f| f(1.0)).chain(odd.iter().cloned()) {
            let id = s.sample(row, &mut rng) as usize;
            assert!(row.is_empty() || id < row.len());
        }
    }
    // With a finite logit around, NaN tokens are never drawn.
    for make in SAMPLERS {
        let id = make(2.0).sample(&[f32::NAN, 1.0, f32::NAN, 0.5], &mut rng);
        assert!(id == 1 || id == 3);
    }
}

#[test]
fn validate_rejects_bad_values() {
    let ok = [
        Sampler::Argmax,
        temp(0.0),
        top_k(1000, 0.7),
        top_p(1.0, 1.0),
        min_p(0.0, 1.0),
        top_k_top_p(1, 0.01, 2.0),
    ];
    assert!(ok.iter().all(|s| s.validate(10).is_ok()));
    let bad = [
        (temp(-0.5), SamplerError::Temperature { temperature: -0.5 }),
        (
            temp(f32::INFINITY),
            SamplerError::Temperature {
                temperature: f32::INFINITY,
            },
        ),
        (top_k(0, 1.0), SamplerError::TopK),
        (top_p(0.0, 1.0), SamplerError::TopP { p: 0.0 }),
        (top_k_top_p(4, 1.5, 1.0), SamplerError::TopP { p: 1.5 }),
        (min_p(-0.1, 1.0), SamplerError::MinP { p: -0.1 }),
        (min_p(1.1, 1.0), SamplerError::MinP { p: 1.1 }),
    ];
    for (s, e) in bad {
        assert_eq!(s.validate(10), Err(e));
    }
    assert!(temp(f32::NAN).validate(10).is_err());
    assert!(top_p(f32::NAN, 1.0).validate(10).is_err());
    assert_eq!(
        Sampler::Argmax.validate(0),
        Err(SamplerError::EmptyVocabulary)
    );
}

#[test]
fn doc_example_runs() -> Result<(), SamplerError> {
    // Mirrors the example on `Sampler` (doc tests are not run by `--lib`).
    let logits = [1.0f32, 3.0, 2.0, -1.0];
    let sampler = top_k(2, 0.8);
    sampler.validate(logits.len())?;
    let mut rng = Rng::new(42);
    let id = sampler.sample(&logits, &mut rng);
    assert!(id == 1 || id == 2);
    let mut scratch = SampleScratch::new();
    let top_p = top_p(0.9, 0.7);
    for _ in 0..4 {
        assert!(top_p.sample_with(&logits, &mut rng, &mut scratch) < 4);
    }
    assert_eq!(Sampler::Argmax.sample(&logits, &mut rng), 1);
    Ok(())
}

#[test]
fn sample_temperature_keeps_its_original_stream() {
    // The algorithm as first written (before NaN handling), as a reference: for rows without
    // NaN the same seed must keep giving the same tokens.
    fn original(logits: &[f32], temperature: f32, rng: &mut Rng) -> u32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w = |l: f32| f64::from(((l - max) / temperature).exp());
        let total: f64 = logits.iter().map(|&l| w(l)).sum();
        let mut target = f64::from(rng.next_f32()) * total;
        for (i, &l) in logits.iter().enumerate() {
            target -= w(l);
            if target <= 0.0 {
                return i as u32;
            }
        }
        argmax(logits)
    }
    let mut gen = Rng::new(8);
    let logits: Vec<f32> = (0..1000).map(|_| gen.next_f32() * 16.0 - 8.0).collect();
    let (mut a, mut b) = (Rng::new(21), Rng::new(21));
    for t in [0.3, 1.0, 2.5] {
        for _ in 0..500 {
            assert_eq!(
                sample_temperature(&logits, t, &mut a),
                original(&logits, t, &mut b)
            );
        }
    }
}

#[test]
fn chain_applies_top_k_then_top_p_then_min_p() {
    // [0.4, 0.3, 0.2, 0.06, 0.04]: top-k 4 drops 0.04; top-p 0.9 over the renormalized four
    // (0.417, 0.729, 0.9375) keeps three; min-p 0.6 keeps p ≥ 0.24: 0.4 and 0.3 → [4/7, 3/7].
    let logits = ln(&[0.4, 0.3, 0.2, 0.06, 0.04]);
    let chain = Sampler::Chain {
        k: 4,
        p: 0.9,
        min_p: 0.6,
        temperature: 1.0,
    };
    chain.validate(logits.len()).unwrap();
    check_frequencies(&chain, &logits, &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0, 0.0]);
    // Every filter at its neutral value is plain temperature sampling.
    let off = Sampler::Chain {
        k: 5,
        p: 1.0,
        min_p: 0.0,
        temperature: 1.0,
    };
    check_frequencies(&off, &logits, &[0.4, 0.3, 0.2, 0.06, 0.04]);
    let bad = Sampler::Chain {
        k: 1,
        p: 1.0,
        min_p: 1.5,
        temperature: 1.0,
    };
    assert!(bad.validate(5).is_err());
}
