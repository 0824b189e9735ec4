//! A green-list watermark (Kirchenbauer et al., 2023) with manual stepping: at each step the
//! previous token seeds a pseudo-random "green" half of the vocabulary, whose logits get a
//! bonus before we sample; a detector that knows the rule counts green tokens.
//!
//! Run: `cargo run --release -p weft --example watermark`

use weft::sampling::{sample_temperature, Rng};
use weft::{block_on, Engine, Logits, Result, Sampler};

/// Whether `id` is green after `prev` (a keyed hash; half the vocabulary is green).
pub fn is_green(prev: u32, id: u32) -> bool {
    let mut x = (u64::from(prev) << 32 | u64::from(id)) ^ 0x5EED_CAFE;
    x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    (x ^ (x >> 33)) & 1 == 0
}

/// Fraction of green tokens in `ids` (each judged against its predecessor).
pub fn green_fraction(first_prev: u32, ids: &[u32]) -> f32 {
    let mut prev = first_prev;
    let mut green = 0;
    for &id in ids {
        green += usize::from(is_green(prev, id));
        prev = id;
    }
    green as f32 / ids.len().max(1) as f32
}

/// Generates `n` watermarked tokens after `prompt`; returns the last prompt token and them.
pub fn run(
    engine: &Engine,
    prompt: &str,
    n: usize,
    delta: f32,
    seed: u64,
) -> Result<(u32, Vec<u32>)> {
    let mut ctx = engine.context();
    ctx.fill(prompt)?;
    let last_prompt = *ctx.pending().last().unwrap_or(&0);
    let mut rng = Rng::new(seed);
    let mut g = ctx.generate(Sampler::Argmax).max_tokens(n);
    let mut prev = last_prompt;
    let mut out = Vec::new();
    while let Some(mut step) = g.next()? {
        step.clear_sampler(); // we choose the token ourselves
        let h = step.probe(0, Logits);
        let res = block_on(step.execute())?;
        let mut logits = res.logits(h).unwrap_or_default().to_vec();
        for (id, l) in logits.iter_mut().enumerate() {
            if is_green(prev, id as u32) {
                *l += delta;
            }
        }
        // Exactly `n` tokens: the text does not end early (a detector judges a fixed length).
        for &eos in engine.stop_tokens() {
            if let Some(l) = logits.get_mut(eos as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let t = sample_temperature(&logits, 1.0, &mut rng);
        g.accept(&[t])?;
        out.push(t);
        prev = t;
    }
    Ok((last_prompt, out))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let engine = Engine::load("smollm2-135m")?;
    let (first, ids) = run(
        &engine,
        "Write a short story about a lighthouse.",
        64,
        4.0,
        1,
    )?;
    println!("{}", engine.detokenize(&ids)?);
    println!(
        "green fraction: {:.2} (unwatermarked text: about 0.5)",
        green_fraction(first, &ids)
    );
    Ok(())
}
