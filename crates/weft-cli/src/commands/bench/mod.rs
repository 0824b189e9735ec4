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
//! - `-d D` (llama-bench's `-d`): each `ppN` / `tgN` again after D tokens already in the
//!   context (`ppN @ dD`: N more prompt tokens; `tgN @ dD`: N decode steps from there). The KV
//!   cache is sized to the largest test, as llama-bench sizes each test's context, so a depth
//!   may pass the default capacity and the model's training context.
//! - `--bandwidth`: every decode row reports the GB/s it achieved (weights read once per step
//!   plus each sequence's keys and values at its mean depth, times steps per second) and its
//!   share of the streaming read bandwidth: the rate a buffer of the step's own bytes is read
//!   at, probed before each repetition and after the last; each repetition is rated against
//!   the higher of the two probes beside it, and the row shows the median share (the JSON
//!   also the median bound and every probe).
//!   A model of ~100 MB partly stays in a large last-level cache between steps (against a
//!   single 256 MiB probe, SmolLM2's tg128 ran at 110–113% of its "limit"), and a shared VM's
//!   bus can switch between a slow and a fast state within seconds (an AMD EPYC host's read
//!   46–58 or 66–85 GB/s; one row's probes 57.6 before and 77.6 after it), so a probe from
//!   other seconds — the 256 MiB one taken before all tests, still printed — rated one decode
//!   at 62% and the next at 87% of its bound. With two or more threads each probe also times
//!   a cache line's round trip between two threads (JSON: `threads_apart_ns`): on that host the
//!   fast bus came with threads ~370 ns apart, the slow one with ~50 ns — most likely the
//!   vCPUs moving between core complexes, each with its own link to memory (see
//!   `weft::bandwidth::core_round_trip`).
//!
//! Prompt tokens are pseudo-random ids, as llama-bench uses. Each test runs `-r` times after
//! one warm-up; the table shows the median and the standard deviation.

use std::sync::Arc;

use anyhow::Context as _;
use weft::sampling::Rng;
use weft::{Engine, ModelRunner};

use crate::model_arg::{ModelArg, ThreadsArg};
use measure::{median_and_sd, peak_rss_mib, Bench, Test, PARALLEL_PROMPT};
use speculate::{rewrite, REWRITE_PROMPT};

mod measure;
mod speculate;

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
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Context depths to run the `ppN` / `tgN` tests at (`@ dD`), as llama-bench's `-d`.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Measure the streaming read bandwidth (of the machine, and of each decode row's bytes
    /// per step) and report each decode row's GB/s and share of it; with two or more threads
    /// each probe also times a cache line's round trip between two threads.
    #[arg(long)]
    bandwidth: bool,
    /// Parallel sequence counts for aggregate decode (`pp128+tgN xP`).
    #[arg(long, value_delimiter = ',')]
    parallel: Vec<usize>,
    /// Repetitions of each test (after one short warm-up of the whole run); a row shows
    /// their median t/s and standard deviation.
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

/// The KV cache the tests need, as llama-bench sizes each test's context to its tokens: the
/// longest sequence (a test's depth plus its prompt or generation; a parallel context; the
/// rewrite task, whose prompt has fewer tokens than bytes) and the most tokens held at once
/// (the parallel contexts together, each in whole pages).
fn kv_needs(args: &Args) -> (usize, usize) {
    let page = weft::kv::PAGE_SIZE;
    let depth = args.n_depth.iter().copied().max().unwrap_or(0);
    let prompt = args.n_prompt.iter().copied().max().unwrap_or(0);
    let parallel = args.parallel.iter().copied().max().unwrap_or(0);
    let gen = args.n_gen.iter().copied().max().unwrap_or(0);
    let longest = [
        depth.saturating_add(prompt.max(gen)),
        if parallel > 0 {
            PARALLEL_PROMPT + gen
        } else {
            0
        },
        if args.speculate {
            REWRITE_PROMPT.len() + gen
        } else {
            0
        },
        WARM_UP_TOKENS,
    ]
    .into_iter()
    .max()
    .unwrap_or(WARM_UP_TOKENS);
    let total = parallel.saturating_mul((PARALLEL_PROMPT + gen).next_multiple_of(page));
    (longest, total.max(longest))
}

/// The warm-up's prompt: its longest sequence (its decodes run 4 steps).
const WARM_UP_TOKENS: usize = 16;

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.repetitions > 0, "--repetitions must be at least 1");
    anyhow::ensure!(
        !args.parallel.contains(&0),
        "--parallel counts sequences: each must be at least 1"
    );
    // A 0-token prompt or generation measures nothing: `-p 0` / `-n 0` skip those tests.
    let gens: Vec<usize> = args.n_gen.iter().copied().filter(|&n| n > 0).collect();
    anyhow::ensure!(
        !gens.is_empty() || args.n_prompt.iter().any(|&p| p > 0),
        "nothing to measure: the prompt lengths (-p) and the generation length (-n) are all 0"
    );
    // Options that only add decode rows would be ignored without them: say so instead.
    let decode_only = [
        (!args.parallel.is_empty(), "--parallel"),
        (args.speculate, "--speculate"),
        (!args.lora.is_empty(), "--lora"),
        (args.bandwidth, "--bandwidth"),
    ];
    if let Some((_, flag)) = decode_only.iter().find(|(set, _)| *set && gens.is_empty()) {
        anyhow::bail!("{flag} measures decoding, and -n 0 asks for none: give -n N");
    }
    anyhow::ensure!(
        !args.raw || !args.parallel.is_empty(),
        "--raw runs the parallel tests on the bare forward: give --parallel P too"
    );
    args.threads.check()?;
    let file = Arc::new(args.model.open()?);
    let size: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let weight_bytes = weft::bandwidth::weight_bytes_per_step(&file);
    let (longest, total) = kv_needs(&args);
    let mut runner_cfg = args.threads.runner_config()?;
    runner_cfg.n_ctx = Some(longest);
    runner_cfg.kv_tokens = runner_cfg.kv_tokens.max(total);
    let runner = ModelRunner::new(file.clone(), &runner_cfg)?;
    let threads = runner.n_threads();
    let vocab = runner.info().vocab_size as u32;
    let engine =
        if (args.parallel.is_empty() || gens.is_empty()) && !args.speculate && args.lora.is_empty()
        {
            None
        } else {
            let mut cfg = args.threads.engine_config()?;
            cfg.n_ctx = Some(longest);
            cfg.kv_tokens = cfg.kv_tokens.max(total);
            Some(Engine::from_file(file, cfg)?)
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
    bench.prefill(WARM_UP_TOKENS, 0)?;
    bench.decode(1, 0, 4)?;
    if bench.engine.is_some() {
        bench.decode_api(2, 4, 4)?;
    }

    let mut tests: Vec<Test> = Vec::new();
    let test = |name: String, prompt, depth, gen, parallel| Test {
        name,
        prompt,
        depth,
        gen,
        parallel,
        api: false,
        lora: false,
    };
    for &d in &args.n_depth {
        let at = if d > 0 {
            format!(" @ d{d}")
        } else {
            String::new()
        };
        for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
            tests.push(test(format!("pp{p}{at}"), p, d, 0, 1));
        }
        for &n in &gens {
            tests.push(test(format!("tg{n}{at}"), 0, d, n, 1));
        }
    }
    for &n in &gens {
        if !args.lora.is_empty() {
            tests.push(Test {
                lora: true,
                ..test(format!("tg{n} +lora"), 0, 0, n, 1)
            });
        }
        let lora_runs: &[bool] = if args.lora.is_empty() {
            &[false]
        } else {
            &[false, true]
        };
        for &p in &args.parallel {
            for &lora in lora_runs {
                let tag = if lora { " +lora" } else { "" };
                let name = format!("pp{PARALLEL_PROMPT}+tg{n} x{p}{tag}");
                let t = Test {
                    lora,
                    ..test(name, PARALLEL_PROMPT, 0, n, p)
                };
                if args.raw {
                    tests.push(Test {
                        name: format!("{} raw", t.name),
                        ..t.clone()
                    });
                }
                tests.push(Test { api: true, ..t });
            }
        }
    }
    // A cache line's round trip between two threads, in ns (one thread: none): a shared VM's
    // vCPUs can move between core complexes, which changes both the bus and the cost of each
    // hand-over between the threads (see `weft::bandwidth::core_round_trip`).
    let round_trip = || {
        if threads < 2 {
            return None;
        }
        let ns = weft::bandwidth::core_round_trip(20_000);
        ns.is_finite().then_some(ns)
    };
    // The machine's bandwidth, for the record: each decode row is rated against probes of its
    // own step's bytes, taken around its repetitions.
    if args.bandwidth {
        let bw = weft::bandwidth::read_bandwidth(threads, 8, weft::bandwidth::BUFFER_BYTES);
        errln!(
            "streaming read bandwidth: {:.1} GB/s ({threads} threads){}",
            bw / 1e9,
            round_trip().map_or(String::new(), |ns| format!(
                "; a cache line's round trip between two threads: {ns:.0} ns"
            ))
        );
    }
    let kv_layout = bench.runner.kv().layout().clone();
    let model = &args.model.model;
    // Which kernels ran, as llama-bench names its backend (and the CPU's wider extensions).
    let extensions = weft::kernels::cpu_extensions();
    let level = weft::kernels::simd_level();
    errln!(
        "kernels: {}{}{}{}; KV cache: {}",
        level.name(),
        if extensions.is_empty() {
            String::new()
        } else {
            format!(" (the CPU has {})", extensions.join(", "))
        },
        match level {
            weft::kernels::SimdLevel::Avx512 if weft::kernels::one_token_pairs() => {
                ", one-token products on the 512-bit pair tiles"
            }
            weft::kernels::SimdLevel::Avx512 => ", one-token products on the 256-bit tiles",
            _ => "",
        },
        if level == weft::kernels::SimdLevel::Scalar || weft::kernels::weight_prefetch() {
            ""
        } else {
            " (weights not hinted ahead)"
        },
        kv_layout.kv_type
    );
    if !args.json {
        if args.bandwidth {
            outln!("| model | size | params | threads | test | t/s | GB/s | of limit |")?;
            outln!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")?;
        } else {
            outln!("| model | size | params | threads | test | t/s |")?;
            outln!("| --- | ---: | ---: | ---: | ---: | ---: |")?;
        }
    }
    for t in tests {
        bench.with_lora = t.lora;
        // A decode step reads the weights once and each sequence's KV at its mean depth.
        let step_bytes = (t.gen > 0).then(|| {
            let depth = t.prompt.max(t.depth) + t.gen / 2;
            weight_bytes + t.parallel as u64 * kv_layout.bytes_read_at(depth)
        });
        // The bytes per second a decode at `tps` tokens per second reads.
        let rate = |tps: f64| step_bytes.map(|b| b as f64 * tps / t.parallel as f64);
        // The rate the step's bytes are read at, probed before each repetition and after the
        // last: each repetition is rated against the higher of the probes on either side of
        // it, the bus of its own seconds. Each probe also says how far apart two threads run
        // then.
        let probe = |when: String| {
            let bytes = step_bytes.filter(|_| args.bandwidth)?;
            let here = weft::bandwidth::read_bandwidth(threads, 4, bytes as usize);
            let apart = round_trip();
            errln!(
                "streaming read bandwidth over {:.0} MB (a step of {}) {when}: {:.1} GB/s{}",
                bytes as f64 / 1e6,
                t.name,
                here / 1e9,
                apart.map_or(String::new(), |ns| format!(
                    "; round trip between threads {ns:.0} ns"
                ))
            );
            Some((here, apart))
        };
        let mut samples = Vec::with_capacity(args.repetitions);
        let (mut probes, mut aparts) = (Vec::new(), Vec::new());
        let mut record = |p: Option<(f64, Option<f64>)>| {
            if let Some((bw, apart)) = p {
                probes.push(bw);
                aparts.extend(apart);
            }
        };
        for r in 1..=args.repetitions {
            record(probe(format!("before repetition {r}")));
            let tps = if t.gen == 0 {
                t.prompt as f64 / bench.prefill(t.prompt, t.depth)?
            } else if t.api {
                (t.parallel * t.gen) as f64 / bench.decode_api(t.parallel, t.prompt, t.gen)?
            } else {
                let context = t.prompt.max(t.depth);
                (t.parallel * t.gen) as f64 / bench.decode(t.parallel, context, t.gen)?
            };
            samples.push(tps);
        }
        record(probe(format!("after repetition {}", args.repetitions)));
        let (median, sd) = median_and_sd(samples.clone());
        let achieved = rate(median);
        // Each repetition's bound and share of it; the row's medians (a decode row probed).
        let rated = (probes.len() == samples.len() + 1).then(|| {
            let bounds: Vec<f64> = probes.windows(2).map(|w| w[0].max(w[1])).collect();
            let shares: Vec<f64> = samples
                .iter()
                .zip(&bounds)
                .filter_map(|(&tps, &bw)| Some(rate(tps)? / bw))
                .collect();
            (median_and_sd(bounds).0, median_and_sd(shares).0)
        });
        if args.json {
            let mut json = serde_json::json!({
                "model": model, "test": t.name, "threads": threads, "n_prompt": t.prompt,
                "n_depth": t.depth, "n_gen": t.gen, "parallel": t.parallel,
                "kernels": level.name(),
                "kv_type": kv_layout.kv_type.name(),
                "tps_median": median, "tps_stddev": sd, "samples": samples,
            });
            if let (Some((bw, share)), Some(a)) = (rated, achieved) {
                json["gbps"] = (a / 1e9).into();
                json["bandwidth_gbps"] = (bw / 1e9).into();
                json["of_limit"] = share.into();
                json["probes_gbps"] = probes.iter().map(|p| p / 1e9).collect::<Vec<_>>().into();
                if !aparts.is_empty() {
                    json["threads_apart_ns"] = aparts.clone().into();
                }
            }
            outln!("{json}")?;
        } else {
            let extra = match (rated, achieved) {
                (Some((_, share)), Some(a)) => format!(" {:.1} | {:.0}% |", a / 1e9, 100.0 * share),
                _ if args.bandwidth => " | |".to_string(),
                _ => String::new(),
            };
            outln!(
                "| {model} | {:.2} MiB | {:.2} M | {threads} | {} | {median:.2} ± {sd:.2} |{extra}",
                size as f64 / (1 << 20) as f64,
                params as f64 / 1e6,
                t.name
            )?;
        }
    }
    if let (true, Some(engine)) = (args.speculate, &bench.engine) {
        for &n in &gens {
            for speculate in [false, true] {
                let (mut samples, mut drafted, mut accepted) = (Vec::new(), 0, 0);
                for _ in 0..args.repetitions {
                    let (secs, made, (d, a)) = rewrite(engine, n, speculate)?;
                    samples.push(made as f64 / secs);
                    (drafted, accepted) = (drafted + d, accepted + a);
                }
                let (median, sd) = median_and_sd(samples.clone());
                let name = format!("tg{n} rewrite{}", if speculate { " +ngram" } else { "" });
                let rate = accepted as f64 / drafted.max(1) as f64;
                if args.json {
                    let json = serde_json::json!({
                        "model": model, "test": name, "threads": threads, "n_gen": n,
                        "speculate": speculate, "tps_median": median, "tps_stddev": sd,
                        "samples": samples, "drafted": drafted, "accepted": accepted,
                    });
                    outln!("{json}")?;
                } else {
                    let acc = if speculate {
                        format!(
                            " (drafts accepted {accepted}/{drafted} = {:.0}%)",
                            100.0 * rate
                        )
                    } else {
                        String::new()
                    };
                    outln!(
                    "| {model} | {:.2} MiB | {:.2} M | {threads} | {name} | {median:.2} ± {sd:.2}{acc} |",
                    size as f64 / (1 << 20) as f64,
                    params as f64 / 1e6
                )?;
                }
            }
        }
    }
    if let Some(rss) = peak_rss_mib() {
        let note = if args.bandwidth {
            " (with the bandwidth tests' buffers)"
        } else {
            ""
        };
        errln!("peak RSS: {rss:.1} MiB{note}");
    }
    if let Some(k) = args.threads.resident_layers {
        errln!("layer pager: at most {k} blocks resident");
    }
    Ok(())
}
