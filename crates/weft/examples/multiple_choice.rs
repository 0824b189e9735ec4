//! Score multiple-choice answers with a `Logprobs` probe: one pass per answer over a fork of
//! the question, summing the log-probability of every answer token.
//!
//! Run: `cargo run --release -p weft --example multiple_choice`

use weft::{block_on, Context, Engine, Logprobs, Result};

/// Total log-probability of `answer` after the question held by `question`.
pub fn score(question: &Context, answer: &str) -> Result<f32> {
    let engine = question.engine().clone();
    let ids = engine.tokenize(answer);
    let mut ctx = question.fork()?;
    if ctx.pending().is_empty() {
        // The question's last token already ran: run it again so its logits are at hand
        // (truncating a fork only drops the fork's copy of the last page).
        let n = ctx.len();
        let last = *ctx.tokens().last().ok_or(weft::Error::EmptyPass)?;
        ctx.truncate(n - 1)?;
        ctx.fill_tokens(&[last])?;
    }
    let mut fwd = ctx.forward();
    // Probe the position before each answer token for that token's log-probability.
    let before = fwd.len();
    fwd.input(&ids);
    let handles: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| fwd.probe(before + i - 1, Logprobs(vec![id])))
        .collect();
    let out = block_on(fwd.execute())?;
    Ok(handles
        .iter()
        .filter_map(|&h| out.logprobs(h).and_then(|v| v.first().copied()))
        .sum())
}

/// The index of the most likely answer, and every score.
pub fn run(engine: &Engine, question: &str, answers: &[&str]) -> Result<(usize, Vec<f32>)> {
    let mut ctx = engine.context();
    ctx.fill(question)?;
    // Run the question once; every answer forks from it (shared pages).
    block_on(ctx.flush_logits())?;
    let scores = answers
        .iter()
        .map(|a| score(&ctx, a))
        .collect::<Result<Vec<_>>>()?;
    let best = (0..scores.len())
        .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
        .unwrap_or(0);
    Ok((best, scores))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let engine = Engine::load("smollm2-135m")?;
    let answers = [" Paris", " London", " Berlin", " Madrid"];
    let (best, scores) = run(&engine, "The capital of France is", &answers)?;
    for (a, s) in answers.iter().zip(&scores) {
        println!("{a:>10}: {s:8.3}");
    }
    println!("answer: {}", answers[best]);
    Ok(())
}
