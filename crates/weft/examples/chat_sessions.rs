//! Sixteen chat sessions on one engine, one thread each: every session renders its messages
//! with the model's chat template and generates its reply; the scheduler batches all sixteen.
//!
//! Run: `cargo run --release -p weft --example chat_sessions`

use weft::{block_on, Engine, Message, Result, Sampler};

/// Runs one two-turn session per question concurrently; returns the replies, in order.
pub fn run(engine: &Engine, questions: &[String], max_tokens: usize) -> Result<Vec<[String; 2]>> {
    std::thread::scope(|s| {
        let sessions: Vec<_> = questions
            .iter()
            .map(|q| {
                s.spawn(move || -> Result<[String; 2]> {
                    let mut ctx = engine.context();
                    let mut messages = vec![
                        Message::system("You are a concise assistant."),
                        Message::user(q.clone()),
                    ];
                    ctx.fill_chat(&messages)?;
                    let first = block_on(
                        ctx.generate(Sampler::Argmax)
                            .max_tokens(max_tokens)
                            .collect_text(),
                    )?;
                    // Second turn: render the whole conversation again into a fresh context.
                    messages.push(Message::assistant(first.clone()));
                    messages.push(Message::user("Say it again in five words."));
                    let mut ctx = engine.context();
                    ctx.fill_chat(&messages)?;
                    let second = block_on(
                        ctx.generate(Sampler::Argmax)
                            .max_tokens(max_tokens)
                            .collect_text(),
                    )?;
                    Ok([first, second])
                })
            })
            .collect();
        sessions
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(weft::Error::Config("a session thread panicked".into()))
                })
            })
            .collect()
    })
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let engine = Engine::load("smollm2-135m")?;
    let questions: Vec<String> = (1..=16).map(|i| format!("What is {i} times 7?")).collect();
    for (q, [a, b]) in questions.iter().zip(run(&engine, &questions, 32)?) {
        println!("{q}\n  → {a}\n  → {b}");
    }
    let m = engine.metrics();
    println!(
        "{} passes in {} model calls (mean batch {:.1})",
        m.passes, m.steps, m.mean_batch_passes
    );
    Ok(())
}
