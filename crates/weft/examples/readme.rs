//! The README's Rust examples as one program. `tests/readme.rs` checks that each of the
//! README's `rust` blocks is here word for word (so rustfmt leaves these functions alone), and
//! `cargo test` builds examples, so the README cannot drift from the API. Run it:
//! `cargo run --release -p weft --example readme`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    library()?;
    embeddings()?;
    Ok(())
}

/// "The library".
#[rustfmt::skip]
fn library() -> Result<(), Box<dyn std::error::Error>> {
    use weft::{Engine, Sampler, Entropy};

    let engine = Engine::load("smollm2-135m")?;  // or a GGUF path / checkpoint folder; one scheduler thread
    let mut ctx = engine.context();                       // one sequence in the paged KV cache
    ctx.fill("The capital of France is")?;                // pending until the next pass

    // One pass, full control: inputs at positions, masks, samplers and probes at any index.
    let mut fwd = ctx.forward();
    let last = fwd.len() - 1;
    let next = fwd.sample(&[last], Sampler::Argmax);
    let ent = fwd.probe(last, Entropy);
    let out = weft::block_on(fwd.execute())?;             // or `.await` under tokio
    let token: u32 = out.get(next)[0];                    // one per sampled index
    let entropy: f32 = out.get(ent);                      // each handle reads its own type
    println!("{:?} (entropy {entropy:.2} nats)", engine.detokenize(&[token])?);

    // The loop over passes: samplers, stop rules, collectors, manual stepping.
    let text = weft::block_on(ctx.generate(Sampler::TopP { p: 0.95, temperature: 0.7 })
        .max_tokens(64).stop_string("\n\n").collect_text())?;

    // Exactly 64 tokens, whatever the model emits (seed 002's `generate(n)`).
    let ids = weft::block_on(ctx.generate(Sampler::Argmax).max_tokens(64).ignore_eos().collect_tokens())?;

    // Beam search with Hugging Face's semantics (length_penalty 1.0, early_stopping False).
    use weft::beam::{beam_search, BeamSearchConfig};
    let prompt = engine.tokenizer().encode("The best way to learn a language is", true, true);
    let config = BeamSearchConfig::new(4).max_new_tokens(24).num_return_sequences(2);
    for h in weft::block_on(beam_search(&engine, &prompt, &config))? {
        println!("{:.3} {}", h.score, engine.detokenize(h.generated())?); // h.tokens: prompt + output
    }
    println!("{text}\n{ids:?}");
    Ok(())
}

/// "Sentence embeddings".
#[rustfmt::skip]
fn embeddings() -> Result<(), Box<dyn std::error::Error>> {
    let model = weft::Embedder::load("all-minilm-l6-v2")?;
    let v = model.embed_batch(&["A man is eating food.", "A man is eating a piece of bread."])?;
    let cosine: f32 = v[0].iter().zip(&v[1]).map(|(a, b)| a * b).sum(); // 0.755
    println!("cosine {cosine:.3}");
    Ok(())
}
