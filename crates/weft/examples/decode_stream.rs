//! Decode speed of the streaming generator, the loop a front end runs: fill a prompt, then
//! `next_text()` until `max_tokens`. The Rust side of `scripts/py_overhead.py`, which times
//! the same loop driven from Python.
//!
//! `cargo run --release -p weft --example decode_stream -- [MODEL] [TOKENS] [ROUNDS]`
//! prints one JSON line per round: `{"tokens": N, "seconds": S, "tps": N/S}`.

use std::time::Instant;

use weft::{Engine, EngineConfig, Sampler};

const PROMPT: &str = "The history of the city of Paris begins";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let tokens: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(1), |s| s.parse())?;
    let path = weft::Hub::from_env()?.resolve(&model, &mut weft::NoProgress)?;
    let config = EngineConfig {
        n_threads: 2,
        ..EngineConfig::default()
    };
    let engine = Engine::open(&path, config)?;
    for _ in 0..rounds {
        let start = Instant::now();
        let mut ctx = engine.context();
        ctx.fill(PROMPT)?;
        let mut gen = ctx
            .generate(Sampler::Argmax)
            .max_tokens(tokens)
            .ignore_eos();
        let mut text = String::new();
        while let Some(delta) = weft::block_on(gen.next_text())? {
            text.push_str(&delta);
        }
        let n = gen.tokens_generated();
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{{\"tokens\": {n}, \"seconds\": {seconds:.6}, \"tps\": {:.3}}}",
            n as f64 / seconds
        );
    }
    Ok(())
}
