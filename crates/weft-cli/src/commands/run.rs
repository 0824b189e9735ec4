//! `weft run -m MODEL [-n N] [--temp T] [--seed S] "PROMPT"`: a raw completion, streamed.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use weft::sampling::{sample_temperature, Rng};
use weft::{BatchEntry, Tokenizer};

use crate::model_arg::{ModelArg, ThreadsArg};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Tokens to generate at most (generation also stops at the model's end-of-text tokens).
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature; 0 picks the most likely token every step.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Random seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Print `{"prompt_ids":[...],"ids":[...],"text":"..."}` instead of streaming text.
    #[arg(long)]
    json: bool,
    /// The prompt, used as is (no chat template).
    prompt: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = Arc::new(args.model.open()?);
    let tok = Tokenizer::from_gguf(&file)?;
    let mut runner = args.threads.runner(file)?;
    let prompt_ids = tok.encode(&args.prompt, true, true);
    anyhow::ensure!(!prompt_ids.is_empty(), "the prompt is empty");
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng::new(seed);
    let seq = runner.new_sequence();
    let mut batch = BatchEntry::run_of(&prompt_ids, seq, 0, false);
    let mut out = std::io::stdout().lock();
    let mut stream = tok.stream_decoder(false);
    if !args.json {
        write!(out, "{}", args.prompt)?;
        out.flush()?;
    }
    let mut ids = Vec::new();
    let t0 = Instant::now();
    let mut t_prompt = None;
    for _ in 0..args.n_predict {
        let logits = runner.forward(&batch)?;
        t_prompt.get_or_insert_with(|| t0.elapsed());
        let next = sample_temperature(logits, args.temp, &mut rng);
        if tok.vocab().is_eog(next) {
            break;
        }
        ids.push(next);
        if !args.json {
            write!(out, "{}", stream.push(next)?)?;
            out.flush()?;
        }
        let pos = (prompt_ids.len() + ids.len() - 1) as u32;
        batch = vec![BatchEntry {
            token: next,
            pos,
            seq,
            logits: true,
            mask: None,
        }];
    }
    let total = t0.elapsed();
    if args.json {
        let text = tok.decode(&ids)?;
        let json = serde_json::json!({ "prompt_ids": prompt_ids, "ids": ids, "text": text });
        writeln!(out, "{json}")?;
    } else {
        writeln!(out, "{}", stream.finish())?;
    }
    let t_prompt = t_prompt.unwrap_or(total);
    let t_gen = total.saturating_sub(t_prompt).as_secs_f64();
    eprintln!(
        "\nprompt: {} tokens, {:.1} tokens/s | generated: {} tokens, {:.1} tokens/s | seed {seed}",
        prompt_ids.len(),
        prompt_ids.len() as f64 / t_prompt.as_secs_f64().max(1e-9),
        ids.len(),
        ids.len().saturating_sub(1) as f64 / t_gen.max(1e-9),
    );
    runner.free_sequence(seq);
    Ok(())
}
