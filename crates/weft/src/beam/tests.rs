//! [`BeamScorer`] on toy "models" (tables of log-probabilities by generated prefix), against
//! results worked out by hand step by step from Hugging Face's `_beam_search` (v5.23
//! `generation/utils.py`). Tokens: 0 is EOS, 1 = a, 2 = b, 3 = c; the prompt is `[9]`.

use super::*;
// The toy model's hash, as `scripts/beam_hf_reference.py` computes it.
use weft_core::sampling::rng::splitmix64;

const E: u32 = 0;
const A: u32 = 1;
const B: u32 = 2;
const C: u32 = 3;

/// Runs the scorer to the end with `table(generated prefix)` as each beam's candidates.
fn run(
    config: &BeamSearchConfig,
    table: impl Fn(&[u32]) -> Vec<(u32, f32)>,
) -> Vec<BeamHypothesis> {
    let mut scorer = BeamScorer::new(&[9], config).expect("config");
    let mut steps = 0;
    while !scorer.is_done() {
        let lists: Vec<_> = scorer.running().map(|seq| table(&seq[1..])).collect();
        let parents = scorer.step(&lists).expect("step");
        assert_eq!(parents.len(), scorer.running().len());
        steps += 1;
        assert!(steps <= 100, "no end");
    }
    scorer.finish()
}

/// `(generated tokens, score)` of each hypothesis.
fn summary(hs: &[BeamHypothesis]) -> Vec<(Vec<u32>, f32)> {
    hs.iter()
        .map(|h| (h.generated().to_vec(), h.score))
        .collect()
}

fn assert_result(got: &[BeamHypothesis], want: &[(&[u32], f32)]) {
    let s = summary(got);
    assert_eq!(s.len(), want.len(), "{s:?}");
    for ((g, gs), (w, ws)) in s.iter().zip(want) {
        assert_eq!(g.as_slice(), *w, "{s:?}");
        assert!((gs - ws).abs() < 1e-5, "score {gs} vs {ws}: {s:?}");
    }
    assert!(got.iter().all(|h| h.tokens[0] == 9 && h.prompt_len == 1));
}

/// Case A: `num_beams` 2, `max_new_tokens` 4, EOS 0, so K = 4 candidates a step.
///
/// | prefix | E | a | b | c |
/// |---|---|---|---|---|
/// | []    | −1.0 | −0.5 | −2.0 | −3.0 |
/// | a     | −0.4 | −1.3 | −2.5 | −4.0 |
/// | b     | −0.1 | −0.2 | −3.0 | −4.0 |
/// | aa    | −0.3 | −2.0 | −2.5 | −3.0 |
/// | ba    | −0.05 | −0.5 | −3.0 | −4.0 |
/// | baa   | −0.2 | −0.02 | −3.0 | −4.0 |
/// | aaa   | −1.0 | −0.7 | −2.0 | −3.0 |
///
/// With α = 1:
/// 1. top 4: a −0.5, E −1.0, b −2.0, c −3.0. Of the first two, E ends: hypothesis [E]
///    −1.0/1 = −1.0. Running: a −0.5, b −2.0.
/// 2. top 4: aE −0.9, aa −1.8, bE −2.1, ba −2.2. aE ends (first two): −0.9/2 = −0.45; bE is
///    third, so dropped. Finished [aE −0.45, E −1.0] is full. Running: aa −1.8, ba −2.2.
///    `True` stops here. `False`: −1.8/2 = −0.9 > −1.0, go on. `Never`: −1.8/4 > −1.0.
/// 3. top 4: aaE −2.1, baE −2.25, baa −2.7, aaa −3.8. Both ends are in the first two: aaE
///    −2.1/3 = −0.7 replaces E; baE −0.75 does not fit. Finished [aE −0.45, aaE −0.7].
///    Running: baa −2.7, aaa −3.8. `False`: −2.7/3 = −0.9 ≤ −0.7, stop. `Never`: −2.7/4 =
///    −0.675 > −0.7, go on.
/// 4. (`Never`; the length limit, so every candidate ends) top 4: baaa −2.72, baaE −2.9,
///    aaaa −4.5, aaaE −4.8. The first two: baaa −0.68 replaces aaE; baaE −0.725 does not fit.
fn table_a(prefix: &[u32]) -> Vec<(u32, f32)> {
    let row: [f32; 4] = match prefix {
        [] => [-1.0, -0.5, -2.0, -3.0],
        [A] => [-0.4, -1.3, -2.5, -4.0],
        [B] => [-0.1, -0.2, -3.0, -4.0],
        [A, A] => [-0.3, -2.0, -2.5, -3.0],
        [B, A] => [-0.05, -0.5, -3.0, -4.0],
        [B, A, A] => [-0.2, -0.02, -3.0, -4.0],
        [A, A, A] => [-1.0, -0.7, -2.0, -3.0],
        _ => panic!("prefix {prefix:?} is not expected to run"),
    };
    [E, A, B, C].into_iter().zip(row).collect()
}

fn config_a() -> BeamSearchConfig {
    BeamSearchConfig::new(2)
        .max_new_tokens(4)
        .eos_token_id(E)
        .num_return_sequences(2)
}

#[test]
fn early_stopping_true_stops_when_num_beams_finished() {
    let got = run(&config_a().early_stopping(EarlyStopping::True), table_a);
    assert_result(&got, &[(&[A, E], -0.45), (&[E], -1.0)]);
    assert!((got[0].sum_logprobs + 0.9).abs() < 1e-6);
}

#[test]
fn early_stopping_false_stops_when_running_beams_cannot_catch_up_at_their_length() {
    let got = run(&config_a(), table_a);
    assert_result(&got, &[(&[A, E], -0.45), (&[A, A, E], -0.7)]);
    let one = run(&config_a().num_return_sequences(1), table_a);
    assert_result(&one, &[(&[A, E], -0.45)]);
}

#[test]
fn early_stopping_never_judges_running_beams_at_the_longest_length() {
    let got = run(&config_a().early_stopping(EarlyStopping::Never), table_a);
    assert_result(&got, &[(&[A, E], -0.45), (&[B, A, A, A], -0.68)]);
    // The hypothesis that reached the limit has no EOS.
    assert_eq!(got[1].tokens, [9, B, A, A, A]);
}

/// α = 0: scores are plain sums. After step 2 the finished set is [aE −0.9, E −1.0] and the
/// best running beam (aa −1.8) cannot beat −1.0; with α = 0 `Never` behaves as `False`.
#[test]
fn zero_length_penalty_ranks_by_sum() {
    for e in [EarlyStopping::False, EarlyStopping::Never] {
        let got = run(&config_a().length_penalty(0.0).early_stopping(e), table_a);
        assert_result(&got, &[(&[A, E], -0.9), (&[E], -1.0)]);
    }
}

/// α = 2: step 2 gives aE −0.9/4 = −0.225 and E −1.0; aa −1.8/4 = −0.45 > −1.0 goes on.
/// Step 3: aaE −2.1/9 = −0.2333, baE −2.25/9 = −0.25; baa −2.7/9 = −0.3 cannot beat −0.2333.
#[test]
fn length_penalty_two() {
    let got = run(&config_a().length_penalty(2.0), table_a);
    assert_result(&got, &[(&[A, E], -0.225), (&[A, A, E], -2.1 / 9.0)]);
}

/// Case B: an EOS candidate ranked below the first `num_beams` is dropped, even though it
/// would have been the best hypothesis (−3.0 against −3.5).
#[test]
fn eos_below_the_first_num_beams_is_dropped() {
    let table = |prefix: &[u32]| -> Vec<(u32, f32)> {
        match prefix {
            [] => vec![(A, -0.1), (B, -0.2), (E, -3.0), (C, -5.0)],
            [A] => vec![(A, -6.9), (B, -7.5), (C, -8.0), (E, -9.0)],
            [B] => vec![(B, -6.9), (A, -7.5), (C, -8.0), (E, -9.0)],
            _ => panic!("prefix {prefix:?} is not expected to run"),
        }
    };
    let config = BeamSearchConfig::new(2)
        .max_new_tokens(2)
        .eos_token_id(E)
        .num_return_sequences(2);
    let got = run(&config, table);
    assert_result(&got, &[(&[A, A], -3.5), (&[B, B], -3.55)]);
}

/// Case C: two EOS ids make K = 3 · num_beams; both best candidates end at once, and the
/// running beam a −1.0 cannot beat −0.2.
#[test]
fn several_eos_ids() {
    let config = BeamSearchConfig::new(2)
        .max_new_tokens(5)
        .eos_token_ids(vec![E, 4])
        .num_return_sequences(2);
    let scorer = BeamScorer::new(&[9], &config).expect("config");
    assert_eq!(scorer.candidates_per_beam(), 6);
    let table = |prefix: &[u32]| -> Vec<(u32, f32)> {
        match prefix {
            [] => vec![(E, -0.1), (4, -0.2), (A, -1.0), (B, -2.0), (C, -3.0)],
            _ => panic!("prefix {prefix:?} is not expected to run"),
        }
    };
    assert_result(&run(&config, table), &[(&[E], -0.1), (&[4], -0.2)]);
}

/// Width 1 is greedy (Hugging Face decodes greedily with one beam): a, then E ends it. With
/// `False` the running aa (−0.6) could not beat it anyway; with `Never` and α = 2 the heuristic
/// alone would go on (−0.6/8² > −0.3/2²).
#[test]
fn width_one_is_greedy() {
    let table = |prefix: &[u32]| -> Vec<(u32, f32)> {
        match prefix {
            [] => vec![(A, -0.1), (E, -1.0)],
            [A] => vec![(E, -0.2), (A, -0.5)],
            _ => panic!("prefix {prefix:?} is not expected to run"),
        }
    };
    for (e, alpha) in [
        (EarlyStopping::False, 1.0),
        (EarlyStopping::Never, 2.0),
        (EarlyStopping::False, -1.0),
    ] {
        let config = BeamSearchConfig::new(1)
            .max_new_tokens(8)
            .eos_token_id(E)
            .early_stopping(e)
            .length_penalty(alpha);
        let score = -0.3 / 2f32.powf(alpha);
        assert_result(&run(&config, table), &[(&[A, E], score)]);
    }
}

/// Ties go to the earlier beam, then the lower id; non-finite log-probabilities are left out
/// (fewer candidates than beams: fewer beams run).
#[test]
fn ties_and_non_finite_candidates() {
    let table = |prefix: &[u32]| -> Vec<(u32, f32)> {
        match prefix {
            [] => vec![(C, -1.0), (B, -1.0), (A, f32::NEG_INFINITY), (E, f32::NAN)],
            [B] | [C] => vec![(A, -1.0)],
            _ => panic!("prefix {prefix:?} is not expected to run"),
        }
    };
    let config = BeamSearchConfig::new(3)
        .max_new_tokens(2)
        .eos_token_ids(vec![])
        .num_return_sequences(2);
    assert_result(&run(&config, table), &[(&[B, A], -1.0), (&[C, A], -1.0)]);
}

#[test]
fn bad_options_and_steps_are_errors() {
    let bad = |c: BeamSearchConfig| matches!(c.validate(), Err(Error::BeamSearch { .. }));
    assert!(bad(BeamSearchConfig::new(0)));
    assert!(bad(BeamSearchConfig::new(2).max_new_tokens(0)));
    assert!(bad(BeamSearchConfig::new(2).num_return_sequences(3)));
    assert!(bad(BeamSearchConfig::new(2).num_return_sequences(0)));
    assert!(bad(BeamSearchConfig::new(2).length_penalty(f32::NAN)));
    assert!(!bad(BeamSearchConfig::new(2).num_return_sequences(2)));
    // Counts that would overflow: refused, and a scorer is made without overflowing.
    assert!(bad(BeamSearchConfig::new(1 << 63)));
    assert!(bad(BeamSearchConfig::new(usize::MAX)));
    let huge = BeamSearchConfig::new(2).max_new_tokens(usize::MAX);
    assert!(BeamScorer::new(&[9], &huge).is_ok());
    assert!(matches!(
        BeamScorer::new(&[], &BeamSearchConfig::new(2)),
        Err(Error::EmptyPass)
    ));
    let mut s = BeamScorer::new(&[9], &BeamSearchConfig::new(2).max_new_tokens(1)).expect("ok");
    assert!(matches!(s.step(&[]), Err(Error::BeamSearch { .. })));
    // A token listed twice for one beam counts once (at its better score), wherever the
    // duplicates fall in the ranking: two distinct beams survive.
    let mut d = BeamScorer::new(&[9], &BeamSearchConfig::new(3).max_new_tokens(2)).expect("ok");
    d.step(&[vec![(A, -1.0), (B, -1.1), (A, -1.2), (C, -2.0)]])
        .expect("step");
    let beams: Vec<Vec<u32>> = d.running().map(<[u32]>::to_vec).collect();
    assert_eq!(beams, [vec![9, A], vec![9, B], vec![9, C]]);
    s.step(&[vec![(A, -1.0), (B, -2.0)]]).expect("step");
    assert!(s.is_done());
    assert!(matches!(
        s.step(&[vec![(A, -1.0)]]),
        Err(Error::BeamSearch { .. })
    ));
    assert_eq!(s.finish().len(), 1);
}

/// The script's toy model: logits from a hash of the sequence (exact f64 operations), EOS ids
/// raised by `eos_bias`, log-softmax in f64 rounded to f32.
fn toy_logprobs(model: &serde_json::Value, seq: &[u32]) -> Vec<(u32, f32)> {
    let seed = model["seed"].as_u64().expect("seed");
    let vocab = model["vocab"].as_u64().expect("vocab");
    let spread = model["spread"].as_f64().expect("spread");
    let bias = model["eos_bias"].as_f64().expect("bias");
    let eos = ids(&model["eos"]);
    let h = seq.iter().fold(seed, |h, &t| splitmix64(h ^ u64::from(t)));
    let logits: Vec<f64> = (0..vocab)
        .map(|v| {
            let u = (splitmix64(h.wrapping_add(v)) >> 11) as f64 / 9_007_199_254_740_992.0;
            let l = u * spread;
            if eos.contains(&(v as u32)) {
                l + bias
            } else {
                l
            }
        })
        .collect();
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut z = 0.0;
    for l in &logits {
        z += (l - m).exp();
    }
    let lse = m + z.ln();
    (0..vocab as u32)
        .zip(logits.iter().map(|l| (l - lse) as f32))
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// 160 random toy searches (1–4 beams, 0–2 EOS ids, α from −1 to 2, every `early_stopping`,
/// 1–7 new tokens) against an independent transcription of Hugging Face's own formulation
/// (fixed slots, −1e9 placeholders and penalties, float32) in numpy, and greedy decoding for
/// one beam as `generate()` does: `scripts/beam_hf_reference.py` wrote
/// `tests/fixtures/beam_hf_reference.json`.
#[test]
fn matches_the_hf_formulation_on_random_toy_models() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/beam_hf_reference.json"))
            .expect("fixture");
    let cases = fixture["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 160);
    for (i, case) in cases.iter().enumerate() {
        let c = &case["config"];
        let n = |k: &str| c[k].as_u64().expect(k) as usize;
        let early_stopping = match &c["early_stopping"] {
            serde_json::Value::Bool(true) => EarlyStopping::True,
            serde_json::Value::Bool(false) => EarlyStopping::False,
            _ => EarlyStopping::Never,
        };
        let config = BeamSearchConfig::new(n("num_beams"))
            .max_new_tokens(n("max_new_tokens"))
            .length_penalty(c["length_penalty"].as_f64().expect("alpha") as f32)
            .early_stopping(early_stopping)
            .num_return_sequences(n("num_return_sequences"))
            .eos_token_ids(ids(&case["model"]["eos"]));
        let prompt = ids(&case["prompt"]);
        let mut scorer = BeamScorer::new(&prompt, &config).expect("config");
        while !scorer.is_done() {
            let lists: Vec<_> = scorer
                .running()
                .map(|seq| toy_logprobs(&case["model"], seq))
                .collect();
            scorer.step(&lists).expect("step");
        }
        let got = scorer.finish();
        let want = case["expected"].as_array().expect("expected");
        assert_eq!(got.len(), want.len(), "case {i}: {case}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.tokens, ids(&w["tokens"]), "case {i}: {case}");
            let ws = w["score"].as_f64().expect("score") as f32;
            assert!(
                (g.score - ws).abs() <= 1e-6 * ws.abs().max(1.0),
                "case {i}: {} vs {ws}",
                g.score
            );
        }
    }
}
