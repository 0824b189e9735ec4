//! Beam search written with `fork()`: every beam is a context; expanding one forks it per
//! candidate token (sharing all full KV pages) and scores candidates with a `Distribution`
//! probe.
//!
//! Run: `cargo run --release -p weft --example tree_search`

use weft::{block_on, Context, Distribution, Engine, Result};

/// A beam: its context (last token pending), generated tokens and total log-probability.
struct Beam {
    ctx: Context,
    tokens: Vec<u32>,
    score: f32,
}

/// Beam search of `width` beams for `depth` tokens; returns (tokens, log-probability), best
/// first.
pub fn run(
    engine: &Engine,
    prompt: &str,
    width: usize,
    depth: usize,
) -> Result<Vec<(Vec<u32>, f32)>> {
    let mut root = engine.context();
    root.fill(prompt)?;
    let mut beams = vec![Beam {
        ctx: root,
        tokens: Vec::new(),
        score: 0.0,
    }];
    for _ in 0..depth {
        let mut candidates = Vec::new();
        for (b, beam) in beams.iter_mut().enumerate() {
            // Run the beam's pending token and read its top `width` continuations.
            let mut fwd = beam.ctx.forward();
            let h = fwd.probe(
                fwd.len() - 1,
                Distribution {
                    temperature: 1.0,
                    k: width,
                },
            );
            let out = block_on(fwd.execute())?;
            let (ids, probs) = out.distribution(h).unwrap_or_default();
            for (&id, &p) in ids.iter().zip(probs) {
                candidates.push((beam.score + p.ln(), b, id));
            }
        }
        candidates.sort_by(|x, y| y.0.total_cmp(&x.0));
        let next = candidates
            .iter()
            .take(width)
            .map(|&(score, b, id)| {
                let mut ctx = beams[b].ctx.fork()?;
                ctx.fill_tokens(&[id])?;
                let mut tokens = beams[b].tokens.clone();
                tokens.push(id);
                Ok(Beam { ctx, tokens, score })
            })
            .collect::<Result<Vec<_>>>()?;
        beams = next; // dropping the old beams frees the pages no fork shares
    }
    Ok(beams.into_iter().map(|b| (b.tokens, b.score)).collect())
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let engine = Engine::load("smollm2-135m")?;
    for (ids, score) in run(&engine, "The best way to learn a language is", 3, 6)? {
        println!("{score:8.3} {:?}", engine.detokenize(&ids)?);
    }
    Ok(())
}
