//! The `weft` command line. It only parses arguments and prints: every capability lives in the
//! `weft` library.

/// `println!` that gives the write's error back instead of panicking on it: a command's output
/// piped into a reader that closes early (`weft models | head -1`) ends it quietly (see
/// `is_broken_pipe`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `eprintln!` that ignores a failed write instead of panicking on it (standard error a closed
/// pipe or a full disk): notes and warnings are not worth a crash.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `print!` as [`outln!`] is `println!`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod commands;
mod model_arg;
mod progress;
mod replacing_file;
mod sampling_arg;

use std::io::Write;

use clap::{Parser, Subcommand};

/// weft: a fast, CPU-first, programmable LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "weft", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Complete a prompt (raw, no chat template), streaming the text.
    Run(commands::run::Args),
    /// Chat with a model in the terminal: its chat template, streamed replies, the history
    /// kept; `/reset`, `/save FILE`, `/load FILE`, `/exit`. Reads one message a line from a pipe.
    Chat(commands::chat::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat, completions, streaming,
    /// structured output, tools, metrics).
    Serve(commands::serve::Args),
    /// Embed text: one JSON vector per input line, from a sentence-embedding encoder
    /// (all-minilm-l6-v2, a sentence-transformers folder) or a decoder's pooled hidden states.
    Embed(commands::embed::Args),
    /// Measure prefill and decode speed (like llama-bench and llama-batched-bench).
    Bench(commands::bench::Args),
    /// Perplexity of a text file (as llama-perplexity computes it).
    Perplexity(commands::perplexity::Args),
    /// Fetch a known model into the cache (`$WEFT_HOME`, default ~/.cache/weft).
    Pull(commands::pull::Args),
    /// List the known models and whether they are cached.
    Models(commands::pull::ListArgs),
    /// Print a model file's architecture, hyper-parameters, tokenizer and tensors.
    Inspect(commands::inspect::Args),
    /// Tokenize text read from stdin; print the ids as one JSON array.
    Tokenize(commands::tokenize::Args),
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of the output went away (`weft run ... | head`): stop quietly, as
        // command-line tools do.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Not `eprintln!`, which panics when standard error is a closed pipe.
            let _ = writeln!(std::io::stderr(), "error: {}", message(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The whole cause chain on one line (as `{:#}` prints it), without a cause that its parent's
/// message already ends with (an I/O error both shown and kept as the source).
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// "1 token", "3 tokens": `n` and the noun, in the plural unless `n` is 1.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Whether `e` comes from writing to a pipe whose reader has closed it.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The arguments, without llama.cpp's GPU offload flags (`-ngl N`, `--n-gpu-layers N`,
/// `--gpu-layers N`, `=N` too), which a user coming from it may pass: weft runs on the CPU, so
/// they are dropped with a note (clap would read `-ngl 99` as `-n gl` and fail on it). Only
/// with a count after them (a number, `auto`, `all`, a list such as `0,99`), and before a
/// `--`: anything else is left for clap to judge (the text `-ngl` may be another option's
/// value).
fn args_without_gpu_flags() -> Vec<std::ffi::OsString> {
    // A layer count, llama.cpp's `auto` / `all`, or llama-bench's list (`0,99`).
    let number = |s: &str| {
        matches!(s, "auto" | "all") || s.split(',').all(|n| n.trim().parse::<i64>().is_ok())
    };
    let mut out = Vec::new();
    let mut args = std::env::args_os().peekable();
    while let Some(a) = args.next() {
        let text = a.to_string_lossy().to_string();
        if text == "--" {
            out.push(a);
            out.extend(args);
            break;
        }
        let (flag, value) = match text.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (text.as_str(), None),
        };
        if ["-ngl", "--n-gpu-layers", "--gpu-layers"].contains(&flag) {
            let next_is_number = args.peek().is_some_and(|n| number(&n.to_string_lossy()));
            let dropped = match &value {
                Some(v) => number(v),
                None if next_is_number => {
                    args.next();
                    true
                }
                None => false,
            };
            if dropped {
                errln!("note: {flag} is ignored: weft runs on the CPU");
                continue;
            }
        }
        out.push(a);
    }
    out
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse_from(args_without_gpu_flags());
    // The server logs one line per request by default; other commands only warnings.
    let default_filter = match cli.command {
        Command::Serve(_) => "warn,weft_server=info",
        _ => "warn",
    };
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("RUST_LOG"))
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal, and not when NO_COLOR asks: a log file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && !no_color)
        .init();
    match cli.command {
        Command::Serve(args) => commands::serve::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Embed(args) => commands::embed::run(args),
        Command::Perplexity(args) => commands::perplexity::run(args),
        Command::Pull(args) => commands::pull::run(args),
        Command::Models(args) => commands::pull::list(args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
    }
}
