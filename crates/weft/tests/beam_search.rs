//! `weft::beam` on the real models: width 1 is greedy; over a vocabulary restricted to four
//! tokens the search equals brute force (every sequence scored by its own plain pass) and, when
//! narrower, Hugging Face's pruning worked out from those scores; with EOS allowed it equals
//! [`BeamScorer`] fed by independent passes; all beams of a step share one model call; no
//! page is left behind; bad requests are typed errors.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use weft::beam::{
    beam_search, beam_search_from, BeamHypothesis, BeamScorer, BeamSearchConfig, EarlyStopping,
};
use weft::{block_on, Engine, EngineConfig, Error, Logprobs, Message, Sampler};

const MODELS: [&str; 2] = ["smollm2-135m", "gemma3-270m"];

/// An engine whose scheduler waits up to 1 s for contexts that announced more passes, so that
/// a step never starts before every beam has submitted (what the batching test checks).
fn engine(name: &str) -> Engine {
    common::engine_with(
        name,
        EngineConfig {
            n_threads: 2,
            kv_tokens: 16384,
            batch_wait: Duration::from_secs(1),
            ..EngineConfig::default()
        },
    )
}

/// Token ids of `text` with the BOS the model wants.
fn prompt(engine: &Engine, text: &str) -> Vec<u32> {
    engine.tokenizer().encode(text, true, true)
}

/// Token ids of a one-message chat, the assistant's turn opened.
fn chat_prompt(engine: &Engine, question: &str) -> Vec<u32> {
    let mut ctx = engine.context();
    ctx.fill_chat(&[Message::user(question)]).expect("chat");
    ctx.pending().to_vec()
}

/// The first id of each word, distinct.
fn single_tokens(engine: &Engine, words: &[&str]) -> Vec<u32> {
    let mut ids: Vec<u32> = words.iter().map(|w| engine.tokenize(w)[0]).collect();
    ids.dedup();
    assert_eq!(ids.len(), words.len(), "{ids:?}");
    ids
}

#[test]
fn width_one_is_greedy() {
    for name in MODELS {
        let engine = engine(name);
        // Gemma 3 270M rarely ends a turn: a newline ends hypotheses too (and greedy).
        let newline = engine.tokenize("\n")[0];
        let mut eos = engine.stop_tokens().to_vec();
        eos.push(newline);
        let cases = [
            (prompt(&engine, "The capital of France is"), 12),
            (
                chat_prompt(&engine, "What is 2+2? Answer with one number."),
                40,
            ),
        ];
        let mut ended_on_eos = false;
        for (p, n) in cases {
            let mut ctx = engine.context();
            ctx.fill_tokens(&p).expect("fill");
            let gen = ctx.generate(Sampler::Argmax).max_tokens(n).stop(&[newline]);
            let greedy = block_on(gen.collect_tokens()).expect("greedy");
            let config = BeamSearchConfig::new(1)
                .max_new_tokens(n)
                .eos_token_ids(eos.clone());
            let beams = block_on(beam_search(&engine, &p, &config)).expect("beam");
            assert_eq!(beams.len(), 1);
            let got = beams[0].generated();
            println!("{name}: greedy {greedy:?}, beam {got:?}");
            assert_eq!(&beams[0].tokens[..p.len()], p.as_slice());
            assert_eq!(&got[..greedy.len()], greedy.as_slice());
            if got.len() > greedy.len() {
                // Greedy stopped on an EOS id, which the hypothesis keeps.
                assert_eq!(got.len(), greedy.len() + 1);
                assert!(eos.contains(&got[got.len() - 1]));
                ended_on_eos = true;
            } else {
                assert_eq!(got.len(), n);
            }
            let (sum, len) = (beams[0].sum_logprobs, got.len() as f32);
            assert!((beams[0].score - sum / len).abs() < 1e-5);
        }
        assert!(ended_on_eos, "{name}: the chat case should end on EOS");
    }
}

/// Log-probabilities of each of `seq`'s tokens after `prompt`, from one plain pass.
async fn score_sequence(engine: &Engine, prompt: &[u32], seq: &[u32]) -> Vec<f32> {
    let mut ctx = engine.context();
    ctx.fill_tokens(prompt).expect("fill");
    ctx.fill_tokens(&seq[..seq.len() - 1]).expect("fill");
    let mut fwd = ctx.forward();
    let handles: Vec<_> = (0..seq.len())
        .map(|i| fwd.probe(prompt.len() - 1 + i, Logprobs(vec![seq[i]])))
        .collect();
    let out = fwd.execute().await.expect("pass");
    handles
        .into_iter()
        .map(|h| out.logprobs(h).expect("logprob")[0])
        .collect()
}

/// Every sequence of `depth` tokens from `allowed`, with its per-token log-probabilities.
fn brute_force(
    engine: &Engine,
    prompt: &[u32],
    allowed: &[u32],
    depth: usize,
) -> Vec<(Vec<u32>, Vec<f32>)> {
    let n = allowed.len().pow(depth as u32);
    let seqs: Vec<Vec<u32>> = (0..n)
        .map(|mut k| {
            (0..depth)
                .map(|_| {
                    let t = allowed[k % allowed.len()];
                    k /= allowed.len();
                    t
                })
                .collect()
        })
        .collect();
    let scores = block_on(join_all(
        seqs.iter().map(|s| score_sequence(engine, prompt, s)),
    ));
    seqs.into_iter().zip(scores).collect()
}

/// Hugging Face's beam search without EOS, worked out from the full table of scores: at each
/// depth the `width` best prefixes by summed log-probability go on; the result is the
/// `width` best full sequences.
fn pruned_reference(table: &[(Vec<u32>, Vec<f32>)], width: usize) -> Vec<(Vec<u32>, f32)> {
    let depth = table[0].0.len();
    let prefix_score: HashMap<Vec<u32>, f32> = table
        .iter()
        .flat_map(|(s, lp)| {
            (1..=depth).map(move |d| (s[..d].to_vec(), lp[..d].iter().sum::<f32>()))
        })
        .collect();
    let mut kept: Vec<Vec<u32>> = vec![Vec::new()];
    for d in 1..=depth {
        let mut next: Vec<(Vec<u32>, f32)> = prefix_score
            .iter()
            .filter(|(p, _)| p.len() == d && kept.contains(&p[..d - 1].to_vec()))
            .map(|(p, &s)| (p.clone(), s))
            .collect();
        next.sort_by(|a, b| b.1.total_cmp(&a.1));
        if d < depth {
            let margin = next[width - 1].1 - next.get(width).map_or(f32::NEG_INFINITY, |n| n.1);
            assert!(margin > 1e-3, "near tie at depth {d}: {margin}");
        }
        next.truncate(width);
        if d == depth {
            return next;
        }
        kept = next.into_iter().map(|(p, _)| p).collect();
    }
    unreachable!()
}

#[test]
fn restricted_vocabulary_equals_brute_force_and_hf_pruning() {
    for name in MODELS {
        let engine = engine(name);
        let p = prompt(&engine, "My favourite animal is");
        let allowed = single_tokens(&engine, &[" the", " a", " cat", " dog"]);
        let table = brute_force(&engine, &p, &allowed, 4);
        let mut brute: Vec<(Vec<u32>, f32)> = table
            .iter()
            .map(|(s, lp)| (s.clone(), lp.iter().sum::<f32>()))
            .collect();
        brute.sort_by(|a, b| b.1.total_cmp(&a.1));
        let brute_score: HashMap<&[u32], f32> =
            brute.iter().map(|(s, v)| (s.as_slice(), *v)).collect();
        let base = BeamSearchConfig::new(64)
            .max_new_tokens(4)
            .eos_token_ids(vec![])
            .allowed_tokens(allowed.clone());

        // 64 beams keep every prefix up to depth 3: exact.
        let beams = block_on(beam_search(
            &engine,
            &p,
            &base.clone().num_return_sequences(64),
        ))
        .expect("beam");
        assert_eq!(beams.len(), 64);
        let mut worst_diff = 0f32;
        for h in &beams {
            let want = brute_score[h.generated()];
            worst_diff = worst_diff.max((h.sum_logprobs - want).abs());
            assert!((h.score - h.sum_logprobs / 4.0).abs() < 1e-5);
        }
        println!(
            "{name}: best {:?} {:.4}; worst |beam − brute| {worst_diff:.2e}",
            beams[0].generated(),
            beams[0].sum_logprobs
        );
        assert!(worst_diff < 2e-3, "{name}: {worst_diff}");
        assert!(beams.windows(2).all(|w| w[0].score >= w[1].score));
        // Nothing better was left out, and the best is the brute-force best.
        assert!(beams[63].sum_logprobs >= brute[64].1 - 2e-3);
        assert!(beams[0].sum_logprobs >= brute[0].1 - 2e-3);

        // Narrower beams prune as Hugging Face does.
        for width in [2, 3] {
            let config = BeamSearchConfig::new(width)
                .num_return_sequences(width)
                .max_new_tokens(4)
                .eos_token_ids(vec![])
                .allowed_tokens(allowed.clone());
            let beams = block_on(beam_search(&engine, &p, &config)).expect("beam");
            let want = pruned_reference(&table, width);
            let got: Vec<&[u32]> = beams.iter().map(BeamHypothesis::generated).collect();
            let want_seqs: Vec<&[u32]> = want.iter().map(|w| w.0.as_slice()).collect();
            assert_eq!(got, want_seqs, "{name}, width {width}");
            for (h, w) in beams.iter().zip(&want) {
                assert!((h.sum_logprobs - w.1).abs() < 2e-3);
            }
        }
    }
}

/// Drives [`BeamScorer`] with log-probabilities from a fresh context per running beam.
fn oracle_search(
    engine: &Engine,
    p: &[u32],
    allowed: &[u32],
    config: &BeamSearchConfig,
) -> Vec<BeamHypothesis> {
    let mut scorer = BeamScorer::new(p, config).expect("config");
    while !scorer.is_done() {
        let lists: Vec<Vec<(u32, f32)>> = scorer
            .running()
            .map(|seq| {
                let mut ctx = engine.context();
                ctx.fill_tokens(seq).expect("fill");
                let mut fwd = ctx.forward();
                let h = fwd.probe(fwd.len() - 1, Logprobs(allowed.to_vec()));
                let out = block_on(fwd.execute()).expect("pass");
                allowed
                    .iter()
                    .copied()
                    .zip(out.logprobs(h).expect("lp").to_vec())
                    .collect()
            })
            .collect();
        scorer.step(&lists).expect("step");
    }
    scorer.finish()
}

#[test]
fn eos_bookkeeping_matches_the_scorer_on_independent_passes() {
    for name in MODELS {
        let engine = engine(name);
        let p = chat_prompt(&engine, "Is the sky blue? Answer yes or no.");
        // "." ends hypotheses too: Gemma 3 270M rarely ends a turn.
        let mut eos = engine.stop_tokens().to_vec();
        eos.extend(single_tokens(&engine, &["."]));
        let mut allowed = single_tokens(&engine, &["Yes", "No", "!"]);
        allowed.extend(&eos);
        allowed.sort_unstable();
        allowed.dedup();
        let mut ended = 0;
        for (e, alpha) in [
            (EarlyStopping::False, 1.0),
            (EarlyStopping::True, 1.0),
            (EarlyStopping::Never, 1.0),
            (EarlyStopping::False, -0.5),
            (EarlyStopping::Never, 2.0),
        ] {
            let config = BeamSearchConfig::new(3)
                .max_new_tokens(6)
                .num_return_sequences(3)
                .early_stopping(e)
                .length_penalty(alpha)
                .eos_token_ids(eos.clone())
                .allowed_tokens(allowed.clone());
            let got = block_on(beam_search(&engine, &p, &config)).expect("beam");
            let want = oracle_search(&engine, &p, &allowed, &config);
            let show = |hs: &[BeamHypothesis]| -> Vec<(Vec<u32>, f32)> {
                hs.iter()
                    .map(|h| (h.generated().to_vec(), h.score))
                    .collect()
            };
            println!("{name} {e:?} α={alpha}: {:?}", show(&got));
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    g.tokens,
                    w.tokens,
                    "{name} {e:?}: {:?} vs {:?}",
                    show(&got),
                    show(&want)
                );
                assert!((g.score - w.score).abs() < 2e-3);
            }
            ended += got
                .iter()
                .filter(|h| eos.contains(h.tokens.last().unwrap()))
                .count();
        }
        assert!(ended > 0, "{name}: no hypothesis ended on EOS");
    }
}

#[test]
fn beams_of_a_step_share_one_model_call_and_free_their_pages() {
    let engine = engine("smollm2-135m");
    let p = prompt(&engine, "The best way to learn a language is");
    let config = BeamSearchConfig::new(4)
        .max_new_tokens(6)
        .eos_token_ids(vec![])
        .num_return_sequences(4);
    let before = engine.metrics();
    let beams = block_on(beam_search(&engine, &p, &config)).expect("beam");
    let after = engine.metrics();
    assert_eq!(beams.len(), 4);
    assert!(beams.iter().all(|h| h.generated().len() == 6));
    // One call for the prompt, then one per generated token but the last, each with all 4
    // beams.
    assert_eq!(after.steps - before.steps, 6, "{after:?}");
    assert_eq!(after.passes - before.passes, 1 + 5 * 4, "{after:?}");
    assert_eq!(after.max_batch_passes, 4);
    assert_eq!(after.kv_pages_used, 0, "pages left: {after:?}");

    // From a context holding the prompt: the same result, the context untouched.
    let mut ctx = engine.context();
    ctx.fill_tokens(&p).expect("fill");
    block_on(ctx.flush_logits()).expect("prefill");
    let from = block_on(beam_search_from(&ctx, &config)).expect("from ctx");
    assert_eq!(ctx.tokens(), p.as_slice());
    for (a, b) in from.iter().zip(&beams) {
        assert_eq!(a.tokens, b.tokens);
        assert!((a.score - b.score).abs() < 2e-3);
    }
    let mut pending = engine.context();
    pending.fill_tokens(&p).expect("fill");
    let from_pending = block_on(beam_search_from(&pending, &config)).expect("from pending");
    assert_eq!(from_pending[0].tokens, beams[0].tokens);
    drop((ctx, pending));
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn bad_requests_are_typed_errors_and_leave_no_pages() {
    let engine = engine("smollm2-135m");
    let p = prompt(&engine, "Hello");
    let run = |p: &[u32], c: BeamSearchConfig| block_on(beam_search(&engine, p, &c));
    let is_beam = |r: weft::Result<Vec<BeamHypothesis>>| matches!(r, Err(Error::BeamSearch { .. }));
    assert!(is_beam(run(&p, BeamSearchConfig::new(0))));
    assert!(is_beam(run(
        &p,
        BeamSearchConfig::new(2).num_return_sequences(3)
    )));
    assert!(is_beam(run(&p, BeamSearchConfig::new(2).max_new_tokens(0))));
    assert!(matches!(
        run(&[], BeamSearchConfig::new(2)),
        Err(Error::EmptyPass)
    ));
    assert!(matches!(
        block_on(beam_search_from(
            &engine.context(),
            &BeamSearchConfig::new(2)
        )),
        Err(Error::EmptyPass)
    ));
    let n_ctx = engine.n_ctx();
    assert!(matches!(
        run(&p, BeamSearchConfig::new(2).max_new_tokens(n_ctx + 1)),
        Err(Error::ContextTooLong { .. })
    ));
    assert!(matches!(
        run(&p, BeamSearchConfig::new(2).max_new_tokens(usize::MAX)),
        Err(Error::ContextTooLong { .. })
    ));
    assert!(is_beam(run(&p, BeamSearchConfig::new(1 << 63))));
    // More beams than the cache has pages for one token each: refused before any pass (it
    // failed with KvCacheFull after seconds of work).
    let pages = engine.config().kv_tokens / weft::kv::PAGE_SIZE;
    let steps = engine.metrics().steps;
    let wide = run(&p, BeamSearchConfig::new(pages + 1).max_new_tokens(3));
    assert!(
        matches!(&wide, Err(Error::BeamSearch { reason }) if reason.contains("KV pages")),
        "{wide:?}"
    );
    assert_eq!(engine.metrics().steps, steps);
    let long = vec![p[p.len() - 1]; n_ctx + 1];
    assert!(matches!(
        run(&long, BeamSearchConfig::new(2).max_new_tokens(1)),
        Err(Error::ContextTooLong { .. })
    ));
    assert!(matches!(
        run(&p, BeamSearchConfig::new(2).allowed_tokens(vec![])),
        Err(Error::NothingAllowed)
    ));
    let vocab = engine.info().vocab_size as u32;
    assert!(matches!(
        run(&p, BeamSearchConfig::new(2).allowed_tokens(vec![1, vocab])),
        Err(Error::TokenOutOfVocab { .. })
    ));
    // An EOS past the vocabulary could never end a beam.
    assert!(matches!(
        run(&p, BeamSearchConfig::new(2).eos_token_ids(vec![vocab])),
        Err(Error::TokenOutOfVocab { .. })
    ));
    // A restriction that empties after the first step fails mid-search.
    let first = p.len();
    let config = BeamSearchConfig::new(2).prefix_allowed_tokens(move |seq: &[u32]| {
        if seq.len() == first {
            vec![1, 2, 3]
        } else {
            vec![]
        }
    });
    assert!(matches!(run(&p, config), Err(Error::NothingAllowed)));
    assert!(matches!(
        run(
            &p,
            BeamSearchConfig::new(1).prefix_allowed_tokens(|_: &[u32]| vec![u32::MAX])
        ),
        Err(Error::TokenOutOfVocab { .. })
    ));
    assert_eq!(engine.metrics().kv_pages_used, 0);
}
