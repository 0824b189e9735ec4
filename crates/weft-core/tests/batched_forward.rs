//! The forward primitive over the real models: a sequence gets the same logits whatever else is
//! in its batch and however its prompt is split into chunks; bad batches are typed errors that
//! leave the cache as it was.

use crate::common;

use std::sync::Arc;

use weft_core::kv::SeqId;
use weft_core::runner::{BatchEntry, ModelRunner, RunnerConfig};
use weft_core::tokenizer::Tokenizer;
use weft_core::Error;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
];

fn runner(model: &str, cfg: &RunnerConfig) -> (ModelRunner, Tokenizer) {
    let file = Arc::new(common::open_model(model));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    (ModelRunner::new(file, cfg).expect("load"), tok)
}

fn entries(ids: &[u32], seq: SeqId, start: usize, all_logits: bool) -> Vec<BatchEntry> {
    BatchEntry::run_of(ids, seq, start, all_logits)
}

/// Logits of every prompt's last token plus 4 greedy steps, each sequence run alone in one
/// batch per step.
fn alone(r: &mut ModelRunner, prompts: &[Vec<u32>], chunk: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for p in prompts {
        let seq = r.new_sequence();
        let mut last = Vec::new();
        for (c, ids) in p.chunks(chunk).enumerate() {
            last = r
                .forward(&entries(ids, seq, c * chunk, false))
                .expect("forward")
                .to_vec();
        }
        out.push(last.clone());
        for step in 0..4 {
            let next = weft_core::sampling::argmax(&last);
            last = r
                .forward(&entries(&[next], seq, p.len() + step, false))
                .expect("forward")
                .to_vec();
            out.push(last.clone());
        }
        r.free_sequence(seq);
    }
    out
}

/// The same, with all sequences' prompts in one batch and then one decode batch per step.
fn together(r: &mut ModelRunner, prompts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let seqs: Vec<SeqId> = prompts.iter().map(|_| r.new_sequence()).collect();
    let mut batch = Vec::new();
    for (p, &seq) in prompts.iter().zip(&seqs) {
        batch.extend(entries(p, seq, 0, false));
    }
    let vocab = r.info().vocab_size;
    let logits = r.forward(&batch).expect("forward").to_vec();
    let mut per_seq: Vec<Vec<Vec<f32>>> = logits.chunks(vocab).map(|l| vec![l.to_vec()]).collect();
    for step in 0..4 {
        let batch: Vec<BatchEntry> = prompts
            .iter()
            .zip(&seqs)
            .zip(&per_seq)
            .map(|((p, &seq), hist)| BatchEntry {
                token: weft_core::sampling::argmax(hist.last().expect("logits")),
                pos: (p.len() + step) as u32,
                seq,
                logits: true,
                mask: None,
                hidden: false,
                embed: None,
            })
            .collect();
        let logits = r.forward(&batch).expect("forward").to_vec();
        for (hist, l) in per_seq.iter_mut().zip(logits.chunks(vocab)) {
            hist.push(l.to_vec());
        }
    }
    for s in seqs {
        r.free_sequence(s);
    }
    per_seq.into_iter().flatten().collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

fn check_invariance(model: &str) {
    let (mut r, tok) = runner(model, &RunnerConfig::default());
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true, true)).collect();
    let reference = alone(&mut r, &prompts, usize::MAX);
    let chunked = alone(&mut r, &prompts, 3);
    let batched = together(&mut r, &prompts);
    let (d_chunk, d_batch) = (
        max_diff(&reference, &chunked),
        max_diff(&reference, &batched),
    );
    eprintln!("{model}: max |Δlogit| chunked {d_chunk}, batched {d_batch}");
    assert_eq!(d_chunk, 0.0, "{model}: chunked prefill changed the logits");
    assert_eq!(
        d_batch, 0.0,
        "{model}: batch composition changed the logits"
    );
    // Micro-batches smaller than the batch give the same logits too.
    let cfg = RunnerConfig {
        max_ubatch: 5,
        ..RunnerConfig::default()
    };
    let (mut small, _) = runner(model, &cfg);
    let d_ubatch = max_diff(&reference, &together(&mut small, &prompts));
    assert_eq!(d_ubatch, 0.0, "{model}: micro-batching changed the logits");
    assert!(
        r.kv_usage().iter().all(|u| u.free == u.total),
        "KV pages leaked"
    );
}

#[test]
fn smollm2_logits_do_not_depend_on_batching() {
    check_invariance("smollm2-135m");
}

#[test]
fn gemma3_logits_do_not_depend_on_batching() {
    check_invariance("gemma3-270m");
}

/// The same logits on 1, 2 and 3 threads (the matmuls split their rows, attention its pages,
/// differently on each).
fn check_thread_count_invariance(model: &str) {
    let mut per_count = Vec::new();
    for n_threads in [1, 2, 3] {
        let cfg = RunnerConfig {
            n_threads,
            ..RunnerConfig::default()
        };
        let (mut r, tok) = runner(model, &cfg);
        let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true, true)).collect();
        per_count.push(alone(&mut r, &prompts[..2], usize::MAX));
    }
    for (threads, logits) in [2, 3].iter().zip(&per_count[1..]) {
        let d = max_diff(&per_count[0], logits);
        assert_eq!(
            d, 0.0,
            "{model}: {threads} threads changed the logits by {d}"
        );
    }
}

#[test]
fn smollm2_logits_do_not_depend_on_the_thread_count() {
    check_thread_count_invariance("smollm2-135m");
}

#[test]
fn gemma3_logits_do_not_depend_on_the_thread_count() {
    check_thread_count_invariance("gemma3-270m");
}

#[test]
fn bad_batches_are_typed_errors_and_leave_the_cache_unchanged() {
    let cfg = RunnerConfig {
        n_ctx: Some(64),
        ..RunnerConfig::default()
    };
    let (mut r, _) = runner("smollm2-135m", &cfg);
    let seq = r.new_sequence();
    r.forward(&entries(&[1, 2, 3], seq, 0, false))
        .expect("forward");
    let vocab = r.info().vocab_size as u32;

    let e = r.forward(&entries(&[vocab], seq, 3, false)).unwrap_err();
    assert!(matches!(e, Error::TokenOutOfRange { .. }), "{e}");
    let e = r.forward(&entries(&[5], SeqId(999), 0, false)).unwrap_err();
    assert!(matches!(e, Error::UnknownSequence { .. }), "{e}");
    let long = vec![7u32; 62];
    let e = r.forward(&entries(&long, seq, 3, false)).unwrap_err();
    assert!(
        matches!(e, Error::ContextOverflow { len: 65, n_ctx: 64 }),
        "{e}"
    );
    assert_eq!(
        r.kv().len(seq).unwrap(),
        3,
        "failed calls must not grow the sequence"
    );

    // A batch whose second sequence is unknown appends nothing to the first.
    let mut batch = entries(&[4, 5], seq, 3, false);
    batch.extend(entries(&[6], SeqId(12345), 0, false));
    assert!(r.forward(&batch).is_err());
    assert_eq!(r.kv().len(seq).unwrap(), 3);

    r.free_sequence(seq);
    assert!(
        r.kv_usage().iter().all(|u| u.free == u.total),
        "KV pages leaked"
    );
}

#[test]
fn truncate_then_redo_gives_the_same_logits() {
    let (mut r, tok) = runner("smollm2-135m", &RunnerConfig::default());
    let ids = tok.encode(PROMPTS[2], true, true);
    let seq = r.new_sequence();
    let first = r
        .forward(&entries(&ids, seq, 0, false))
        .expect("forward")
        .to_vec();
    // Rewind the last 5 tokens and run them again.
    let keep = ids.len() - 5;
    r.truncate(seq, keep).expect("truncate");
    let again = r
        .forward(&entries(&ids[keep..], seq, keep, false))
        .expect("forward")
        .to_vec();
    assert_eq!(first, again);
    r.free_sequence(seq);
}
