//! `weft bench`: prefill and decode speed like llama-bench, aggregate decode over parallel
//! sequences like llama-batched-bench.
//!
//! - `ppN`: N prompt tokens in one call from an empty sequence (logits for the last only).
//! - `tgN`: N single-token decode steps from an empty sequence.
//! - `pp128+tgN xP`: P contexts on one [`weft::Engine`], each prefilled with 128 tokens, then
//!   N steps in which every context submits a one-token pass with a greedy sampler through the
//!   public API; the scheduler batches them. Reported as aggregate decode tokens/s (P·N / time).
//!   With `--raw`, the same test on the bare batched forward (`... raw`), to show what the API
//!   costs.
//!
//! - `tgN rewrite` / `tgN rewrite +ngram` (`--speculate`): greedy decoding of a task that
//!   copies a code block, without and with the n-gram drafter, and the share of drafted
//!   tokens the model accepted.
//!
//! Prompt tokens are pseudo-random ids, as llama-bench uses. Each test runs `-r` times after
//! one warm-up; the table shows the median and the standard deviation.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use futures_util::future::join_all;
use weft::sampling::Rng;
use weft::{block_on, BatchEntry, Context, Engine, ModelRunner, Sampler};

use crate::model_arg::{ModelArg, ThreadsArg};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Prompt lengths to test (`ppN`); 0 skips the prefill tests.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "128,512"
    )]
    n_prompt: Vec<usize>,
    /// Tokens to generate (`tgN`, and per sequence in parallel tests); 0 skips them.
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Parallel sequence counts for aggregate decode (`pp128+tgN xP`).
    #[arg(long, value_delimiter = ',')]
    parallel: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Print one JSON object per test instead of a table.
    #[arg(long)]
    json: bool,
    /// Also run the parallel tests on the bare batched forward, bypassing the scheduler.
    #[arg(long)]
    raw: bool,
    /// Also measure greedy decoding of a repetitive task (rewriting a code block) with and
    /// without the n-gram drafter, and its acceptance rate.
    #[arg(long)]
    speculate: bool,
    /// LoRA adapter files (repeatable): also run the decode tests with them, beside the
    /// same tests without (`+lora`; parallel contexts take the adapters in turn).
    #[arg(long, value_name = "FILE")]
    lora: Vec<std::path::PathBuf>,
}

/// The repetitive task of `--speculate`: copy a code block.
const REWRITE_PROMPT: &str = r#"Rewrite the following code exactly as it is.

```python
def merge_sorted(a, b):
    result = []
    i, j = 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result


def merge_sort(items):
    if len(items) <= 1:
        return items
    middle = len(items) // 2
    left = merge_sort(items[:middle])
    right = merge_sort(items[middle:])
    return merge_sorted(left, right)
```

Rewritten:

```python
"#;

/// Seconds for a greedy generation of `n` tokens of the rewrite task, and (drafted,
/// accepted) draft tokens.
fn rewrite(
    engine: &Engine,
    n: usize,
    speculate: bool,
) -> anyhow::Result<(f64, usize, (usize, usize))> {
    let mut ctx = engine.context();
    ctx.fill(REWRITE_PROMPT)?;
    block_on(ctx.flush_logits())?;
    let g = ctx.generate(Sampler::Argmax).max_tokens(n);
    let mut g = if speculate { g.system_speculation() } else { g };
    let t = Instant::now();
    while let Some(step) = g.next()? {
        block_on(step.execute())?;
    }
    Ok((
        t.elapsed().as_secs_f64(),
        g.tokens_generated(),
        g.speculation_stats(),
    ))
}

/// Prompt length of the parallel tests, as in llama-batched-bench's `-npp 128`.
const PARALLEL_PROMPT: usize = 128;

struct Bench {
    runner: ModelRunner,
    engine: Option<Engine>,
    rng: Rng,
    vocab: u32,
    /// Adapters of the `+lora` tests, and whether the current test uses them.
    loras: Vec<weft::Adapter>,
    with_lora: bool,
}

impl Bench {
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.rng.next_u64() % u64::from(self.vocab)) as u32)
            .collect()
    }

    /// Seconds to prefill `n` tokens.
    fn prefill(&mut self, n: usize) -> anyhow::Result<f64> {
        let seq = self.runner.new_sequence();
        let batch = BatchEntry::run_of(&self.tokens(n), seq, 0, false);
        let t = Instant::now();
        let r = self.runner.forward(&batch).map(|_| ());
        let secs = t.elapsed().as_secs_f64();
        self.runner.free_sequence(seq);
        r?;
        Ok(secs)
    }

    /// Seconds for `steps` decode calls over `n_seq` sequences prefilled with `prompt` tokens.
    fn decode(&mut self, n_seq: usize, prompt: usize, steps: usize) -> anyhow::Result<f64> {
        let seqs: Vec<_> = (0..n_seq).map(|_| self.runner.new_sequence()).collect();
        let result = self.decode_seqs(&seqs, prompt, steps);
        for &s in &seqs {
            self.runner.free_sequence(s);
        }
        result
    }

    /// Seconds for `steps` decode passes of `n_seq` contexts through the engine's scheduler.
    fn decode_api(&mut self, n_seq: usize, prompt: usize, steps: usize) -> anyhow::Result<f64> {
        let engine = self
            .engine
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no engine"))?;
        let mut ctxs: Vec<Context> = (0..n_seq).map(|_| engine.context()).collect();
        for c in &mut ctxs {
            c.fill_tokens(&self.tokens(prompt))?;
        }
        if prompt > 0 {
            for r in block_on(join_all(ctxs.iter_mut().map(|c| c.flush_logits()))) {
                r?;
            }
        }
        let mut next = self.tokens(n_seq);
        let t = Instant::now();
        for step in 0..steps {
            let horizon = steps - step - 1;
            let loras: Vec<_> = (0..n_seq).map(|i| self.lora(i).cloned()).collect();
            let passes =
                ctxs.iter_mut()
                    .zip(&next)
                    .zip(loras)
                    .map(|((c, &token), lora)| async move {
                        let mut fwd = c.forward();
                        fwd.input(&[token]).horizon(horizon);
                        if let Some(a) = &lora {
                            fwd.adapter(a, 1.0);
                        }
                        let h = fwd.sample(&[0], Sampler::Argmax);
                        let out = fwd.execute().await?;
                        Ok::<u32, weft::Error>(out.token(h).unwrap_or(token))
                    });
            next = block_on(join_all(passes))
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    fn decode_seqs(
        &mut self,
        seqs: &[weft::kv::SeqId],
        prompt: usize,
        steps: usize,
    ) -> anyhow::Result<f64> {
        if prompt > 0 {
            let mut batch = Vec::with_capacity(seqs.len() * prompt);
            for &seq in seqs {
                batch.extend(BatchEntry::run_of(&self.tokens(prompt), seq, 0, false));
            }
            self.runner.forward(&batch)?;
        }
        let adapters: Vec<(weft::kv::SeqId, weft::lora::AdapterSet)> = seqs
            .iter()
            .enumerate()
            .filter_map(|(i, &seq)| {
                let a = self.lora(i)?;
                let set = weft::lora::AdapterSet {
                    stack: vec![(a.as_core().clone(), 1.0)],
                    zo: None,
                };
                Some((seq, set))
            })
            .collect();
        let t = Instant::now();
        for step in 0..steps {
            let tokens = self.tokens(seqs.len());
            let batch: Vec<BatchEntry> = seqs
                .iter()
                .zip(tokens)
                .map(|(&seq, token)| BatchEntry {
                    token,
                    pos: (prompt + step) as u32,
                    seq,
                    logits: true,
                    mask: None,
                    hidden: false,
                    embed: None,
                })
                .collect();
            self.runner.forward_with(&batch, &[], &adapters)?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// The adapter of the `i`-th context of a `+lora` test.
    fn lora(&self, i: usize) -> Option<&weft::Adapter> {
        if !self.with_lora || self.loras.is_empty() {
            return None;
        }
        self.loras.get(i % self.loras.len())
    }
}

fn median_and_sd(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (median, var.sqrt())
}

/// Peak resident memory of this process, from /proc (Linux), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.repetitions > 0, "--repetitions must be at least 1");
    anyhow::ensure!(
        args.n_gen > 0 || args.n_prompt.iter().any(|&p| p > 0),
        "nothing to measure: the prompt lengths (-p) and the generation length (-n) are all 0"
    );
    let file = Arc::new(args.model.open()?);
    let size: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let runner = args.threads.runner(file.clone())?;
    let threads = runner.n_threads();
    let vocab = runner.info().vocab_size as u32;
    let engine =
        if (args.parallel.is_empty() || args.n_gen == 0) && !args.speculate && args.lora.is_empty()
        {
            None
        } else {
            Some(args.threads.engine(file)?)
        };
    let loras = match &engine {
        Some(e) => args
            .lora
            .iter()
            .map(|p| {
                e.load_adapter(p)
                    .with_context(|| format!("cannot load the adapter {}", p.display()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let mut bench = Bench {
        runner,
        engine,
        rng: Rng::new(1234),
        loras,
        with_lora: false,
        vocab,
    };
    // Warm-up: touch the weights and size the buffers.
    bench.prefill(16)?;
    bench.decode(1, 0, 4)?;
    if bench.engine.is_some() {
        bench.decode_api(2, 4, 4)?;
    }

    // name, prompt, gen, parallel, through the API, with the adapters
    let mut tests: Vec<(String, usize, usize, usize, bool, bool)> = Vec::new();
    // A 0-token prompt or generation measures nothing: `-p 0` / `-n 0` skip those tests.
    for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
        tests.push((format!("pp{p}"), p, 0, 1, false, false));
    }
    let lora_runs: &[bool] = if args.lora.is_empty() {
        &[false]
    } else {
        &[false, true]
    };
    if args.n_gen > 0 {
        for &lora in lora_runs {
            let tag = if lora { " +lora" } else { "" };
            tests.push((
                format!("tg{}{tag}", args.n_gen),
                0,
                args.n_gen,
                1,
                false,
                lora,
            ));
        }
        for &p in &args.parallel {
            for &lora in lora_runs {
                let tag = if lora { " +lora" } else { "" };
                let name = format!("pp{PARALLEL_PROMPT}+tg{} x{p}{tag}", args.n_gen);
                if args.raw {
                    let raw = format!("{name} raw");
                    tests.push((raw, PARALLEL_PROMPT, args.n_gen, p, false, lora));
                }
                tests.push((name, PARALLEL_PROMPT, args.n_gen, p, true, lora));
            }
        }
    }
    let model = &args.model.model;
    if !args.json {
        println!("| model | size | params | threads | test | t/s |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    }
    for (name, prompt, gen, parallel, api, lora) in tests {
        bench.with_lora = lora;
        let mut samples = Vec::with_capacity(args.repetitions);
        for _ in 0..args.repetitions {
            let tps = if gen == 0 {
                prompt as f64 / bench.prefill(prompt)?
            } else if api {
                (parallel * gen) as f64 / bench.decode_api(parallel, prompt, gen)?
            } else {
                (parallel * gen) as f64 / bench.decode(parallel, prompt, gen)?
            };
            samples.push(tps);
        }
        let (median, sd) = median_and_sd(samples.clone());
        if args.json {
            let json = serde_json::json!({
                "model": model, "test": name, "threads": threads, "n_prompt": prompt,
                "n_gen": gen, "parallel": parallel, "tps_median": median, "tps_stddev": sd,
                "samples": samples,
            });
            println!("{json}");
        } else {
            println!(
                "| {model} | {:.2} MiB | {:.2} M | {threads} | {name} | {median:.2} ± {sd:.2} |",
                size as f64 / (1 << 20) as f64,
                params as f64 / 1e6
            );
        }
    }
    if let (true, Some(engine)) = (args.speculate && args.n_gen > 0, &bench.engine) {
        for speculate in [false, true] {
            let (mut samples, mut drafted, mut accepted) = (Vec::new(), 0, 0);
            for _ in 0..args.repetitions {
                let (secs, n, (d, a)) = rewrite(engine, args.n_gen, speculate)?;
                samples.push(n as f64 / secs);
                (drafted, accepted) = (drafted + d, accepted + a);
            }
            let (median, sd) = median_and_sd(samples.clone());
            let name = format!(
                "tg{} rewrite{}",
                args.n_gen,
                if speculate { " +ngram" } else { "" }
            );
            let rate = accepted as f64 / drafted.max(1) as f64;
            if args.json {
                let json = serde_json::json!({
                    "model": model, "test": name, "threads": threads, "n_gen": args.n_gen,
                    "speculate": speculate, "tps_median": median, "tps_stddev": sd,
                    "samples": samples, "drafted": drafted, "accepted": accepted,
                });
                println!("{json}");
            } else {
                let acc = if speculate {
                    format!(
                        " (drafts accepted {accepted}/{drafted} = {:.0}%)",
                        100.0 * rate
                    )
                } else {
                    String::new()
                };
                println!(
                    "| {model} | {:.2} MiB | {:.2} M | {threads} | {name} | {median:.2} ± {sd:.2}{acc} |",
                    size as f64 / (1 << 20) as f64,
                    params as f64 / 1e6
                );
            }
        }
    }
    if let Some(rss) = peak_rss_mib() {
        eprintln!("peak RSS: {rss:.1} MiB");
    }
    if let Some(k) = args.threads.resident_layers {
        eprintln!("layer pager: at most {k} blocks resident");
    }
    Ok(())
}
