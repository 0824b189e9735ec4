//! Beam search with `weft::beam`: every beam is a context forked from its parent (sharing all
//! its KV pages), all beams of a step run in one model call, and candidates come from a top-k
//! `Distribution` probe. Here the canonical search: plain sums of log-probabilities (length
//! penalty 0), exactly `depth` tokens (no EOS), never stopping early.
//!
//! Run: `cargo run --release -p weft --example tree_search`

use weft::beam::{beam_search, BeamSearchConfig, EarlyStopping};
use weft::{block_on, Engine, Result};

/// Beam search of `width` beams for `depth` tokens; returns (generated tokens, summed
/// log-probability), best first.
pub fn run(
    engine: &Engine,
    prompt: &str,
    width: usize,
    depth: usize,
) -> Result<Vec<(Vec<u32>, f32)>> {
    let ids = engine.tokenizer().encode(prompt, true, true); // with the BOS the model wants
    let config = BeamSearchConfig::new(width)
        .max_new_tokens(depth)
        .length_penalty(0.0)
        .early_stopping(EarlyStopping::Never)
        .eos_token_ids(vec![])
        .num_return_sequences(width);
    let beams = block_on(beam_search(engine, &ids, &config))?;
    Ok(beams
        .into_iter()
        .map(|h| (h.generated().to_vec(), h.sum_logprobs))
        .collect())
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let engine = Engine::load("smollm2-135m")?;
    for (ids, score) in run(&engine, "The best way to learn a language is", 3, 6)? {
        println!("{score:8.3} {:?}", engine.detokenize(&ids)?);
    }
    Ok(())
}
