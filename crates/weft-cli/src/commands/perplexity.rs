//! `weft perplexity -m MODEL -f FILE [-c 512]`: perplexity as llama-perplexity computes it.
//!
//! The text is tokenized once (with BOS when the model adds one) and cut into chunks of `c`
//! tokens. Each chunk is evaluated from an empty cache, with its first token replaced by BOS
//! when the model uses one; only the second half of each chunk is scored (the first half is
//! context), each token by the log-probability the model gave it at the previous position.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use weft::{BatchEntry, Tokenizer};

use crate::model_arg::{ModelArg, ThreadsArg};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    /// The text file to score (`-`: standard input).
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx: usize,
}

/// Rows of logits computed per call (bounds memory: a Gemma 3 row is 1 MiB).
const ROWS_PER_CALL: usize = 64;

/// The log-probability each row of `logits` gives its target (`row r` → `targets[r]`), as
/// llama-perplexity's `log_softmax` takes it (exp in f32, summed in f64): the rows are shared
/// over `threads` threads, since one row of Gemma 3's is 262,144 exponentials and the model's
/// threads would otherwise wait on them.
fn target_logprobs(logits: &[f32], targets: &[u32], threads: usize) -> Vec<f64> {
    let vocab = logits.len() / targets.len().max(1);
    let one = |(row, &t): (&[f32], &u32)| f64::from(weft::sampling::logprobs_of(row, &[t])[0]);
    let per = targets.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = logits
            .chunks(per * vocab)
            .zip(targets.chunks(per))
            .map(|(rows, ts)| {
                s.spawn(move || {
                    rows.chunks_exact(vocab)
                        .zip(ts)
                        .map(one)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.threads.check()?;
    anyhow::ensure!(args.ctx >= 8, "--ctx-size must be at least 8");
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("cannot read {}", args.file.display()))?
    };
    let file = Arc::new(args.model.open()?);
    let tok = Tokenizer::from_gguf(&file)?;
    let mut tokens = tok.encode(&text, true, true);
    let n_ctx = args.ctx;
    let n_chunks = tokens.len() / n_ctx;
    anyhow::ensure!(
        n_chunks >= 1 && tokens.len() >= n_ctx.saturating_mul(2),
        "{} tokens is too short for chunks of {n_ctx} (need at least {})",
        tokens.len(),
        n_ctx.saturating_mul(2)
    );
    // Chunks of `-c` tokens, past the model's training context if asked (as `run` allows).
    let mut cfg = args.threads.runner_config()?;
    cfg.n_ctx = Some(n_ctx);
    let mut runner = weft::ModelRunner::new(file, &cfg)?;
    let threads = runner.n_threads();
    let vocab = runner.info().vocab_size;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        anyhow::bail!("the tokenizer produced id {bad}, past the model's {vocab} outputs");
    }
    errln!("{} tokens, {n_chunks} chunks of {n_ctx}", tokens.len());
    let special = tok.vocab().special().clone();
    let bos = special.bos.filter(|_| special.add_bos);
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    for chunk in 0..n_chunks {
        let start = chunk * n_ctx;
        let original = tokens[start];
        if let Some(bos) = bos {
            tokens[start] = bos;
        }
        let seq = runner.new_sequence();
        let entry = |j: usize, logits: bool| BatchEntry {
            token: tokens[start + j],
            pos: j as u32,
            seq,
            logits,
            mask: None,
            hidden: false,
            embed: None,
        };
        // Context half: no logits needed.
        let context: Vec<BatchEntry> = (0..first).map(|j| entry(j, false)).collect();
        runner.forward(&context)?;
        // Scored half: row j predicts token j + 1.
        let mut j = first;
        while j < n_ctx - 1 {
            let end = (j + ROWS_PER_CALL).min(n_ctx - 1);
            // The chunk's last token is only ever a target: it is never run.
            let batch: Vec<BatchEntry> = (j..end).map(|k| entry(k, true)).collect();
            let logits = runner.forward(&batch)?;
            let targets = &tokens[start + j + 1..start + end + 1];
            for lp in target_logprobs(logits, targets, threads) {
                nll -= lp;
                nll2 += lp * lp;
                count += 1;
            }
            j = end;
        }
        runner.free_sequence(seq);
        tokens[start] = original;
        // Progress only: a closed standard error does not stop the run.
        let _ = write!(
            std::io::stderr(),
            "[{}]{:.4},",
            chunk + 1,
            (nll / count as f64).exp()
        );
    }
    errln!();
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    outln!("Final estimate: PPL = {ppl:.4} +/- {err:.5}")?;
    Ok(())
}
