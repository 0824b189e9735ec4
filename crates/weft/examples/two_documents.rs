//! Two documents in one pass, isolated by an attention mask: both start at position 0 and each
//! token sees only its own document, so each gets the logits it would get alone.
//!
//! Run: `cargo run --release -p weft --example two_documents`

use weft::{block_on, Brle, Engine, Logits, Result};

/// The next-token logits after each document, computed in one shared pass.
pub fn run(engine: &Engine, a: &str, b: &str) -> Result<(Vec<f32>, Vec<f32>)> {
    let tok = engine.tokenizer();
    let (a, b) = (tok.encode(a, true, true), tok.encode(b, true, true));
    let mut ctx = engine.context();
    let mut fwd = ctx.forward();
    let pos = |n: usize| (0..n as u32).collect::<Vec<_>>();
    fwd.input_at(&a, &pos(a.len())).input_at(&b, &pos(b.len()));
    // Token i of a sees slots 0..=i; token j of b sees the slots of b up to itself.
    let masks = (0..a.len())
        .map(|i| Brle::from_runs(vec![0, i as u32 + 1]))
        .chain((0..b.len()).map(|j| Brle::from_runs(vec![a.len() as u32, j as u32 + 1])))
        .collect();
    fwd.attention_mask(masks);
    let ha = fwd.probe(a.len() - 1, Logits);
    let hb = fwd.probe(a.len() + b.len() - 1, Logits);
    let out = block_on(fwd.execute())?;
    let get = |h| out.logits(h).map(<[f32]>::to_vec).unwrap_or_default();
    Ok((get(ha), get(hb)))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let engine = Engine::load("smollm2-135m")?;
    let (la, lb) = run(
        &engine,
        "The recipe needs two cups of",
        "The stock market fell by",
    )?;
    let next = |l: &[f32]| engine.detokenize(&[weft::sampling::argmax(l)]);
    println!("a → {:?}, b → {:?}", next(&la)?, next(&lb)?);
    Ok(())
}
