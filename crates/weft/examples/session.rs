//! A session saved to disk and taken up again by another engine (another process, after a
//! restart): a conversation is prefilled and partly answered, the generator is snapshotted in
//! flight, the engine is dropped, and a new engine resumes the snapshot and finishes the answer
//! — exactly as if it had never stopped.
//!
//! Run: `cargo run --release -p weft --example session`

use weft::{block_on, Engine, Message, Result, Sampler};

/// The whole answer generated in one go, and the same answer split by a snapshot written to
/// `path` after `split` tokens and resumed by a second engine loaded with `load`.
pub fn run(
    load: impl Fn() -> Result<Engine>,
    question: &str,
    split: usize,
    max_tokens: usize,
    path: &std::path::Path,
) -> Result<(String, String)> {
    let messages = [Message::user(question)];
    let sampler = Sampler::TopP {
        p: 0.9,
        temperature: 0.7,
    };
    let engine = load()?;
    let whole = {
        let mut ctx = engine.context();
        ctx.set_seed(42);
        ctx.fill_chat(&messages)?;
        let gen = ctx.generate(sampler.clone()).max_tokens(max_tokens);
        block_on(gen.collect_text())?
    };

    // Generate `split` tokens, then save the session (context and generator) to a file.
    let mut ctx = engine.context();
    ctx.set_seed(42);
    ctx.fill_chat(&messages)?;
    let mut gen = ctx.generate(sampler).max_tokens(max_tokens);
    for _ in 0..split {
        match gen.next()? {
            Some(step) => drop(block_on(step.execute())?),
            None => break,
        }
    }
    std::fs::write(path, gen.snapshot()?)?;
    drop(gen);
    drop((ctx, engine));

    // A new engine (in real use: another process) picks the generation up.
    let engine = load()?;
    let mut ctx = engine.resume(&std::fs::read(path)?)?;
    let resumed = match ctx.resume_generator() {
        Ok(gen) => block_on(gen.collect_text())?,
        // The answer was complete before the snapshot: nothing was in flight.
        Err(_) => String::new(),
    };
    Ok((whole, resumed))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let path = std::env::temp_dir().join("weft-example.session");
    let (whole, resumed) = run(
        || Engine::load("smollm2-135m"),
        "Explain in three sentences how a loom works.",
        24,
        96,
        &path,
    )?;
    println!("uninterrupted: {whole}\nresumed:       {resumed}");
    println!("identical: {}", whole == resumed);
    Ok(())
}
