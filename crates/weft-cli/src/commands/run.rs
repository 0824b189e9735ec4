//! `weft run -m MODEL [-n N] [--temp T] [--seed S] "PROMPT"`: a raw completion, streamed,
//! through the public API (one context, one generator), optionally constrained
//! (`--json-schema`, `--grammar`, `--regex`), with speculative decoding (`--speculate`), and
//! with session files (`--load-session`, `--save-session`: llama.cpp's `--prompt-cache`).

use std::io::Write;
use std::time::Instant;

use anyhow::Context as _;
use weft::{block_on, Schema};

use crate::model_arg::{ContextArg, ModelArg, ThreadsArg};
use crate::replacing_file::ReplacingFile;
use crate::sampling_arg::SamplingArg;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    context: ContextArg,
    /// Tokens to generate at most (generation also stops at the model's end-of-text tokens);
    /// -1: no limit but the end of the text or of the context, as in llama.cpp.
    #[arg(short = 'n', long = "n-predict", default_value = "128", allow_negative_numbers = true,
        value_parser = crate::sampling_arg::parse_n_predict)]
    n_predict: usize,
    #[command(flatten)]
    sampling: SamplingArg,
    /// Print `{"prompt_ids":[...],"ids":[...],"text":"..."}` instead of streaming text:
    /// `prompt_ids` are the tokens this run computed before generating (with
    /// `--load-session`, those the session did not hold: its last token, to continue it).
    #[arg(long)]
    json: bool,
    /// Constrain the output to JSON valid under a JSON Schema: the schema itself, as
    /// llama.cpp's `-j` takes it, or a FILE holding it (`--json-schema-file`). One constraint
    /// at a time, as the server and the Python package take.
    #[arg(
        short = 'j',
        long,
        value_name = "SCHEMA|FILE",
        group = "constraint",
        alias = "json-schema-file"
    )]
    json_schema: Option<String>,
    /// Constrain the output to a grammar: its text or a FILE holding it (`--grammar-file`).
    /// GBNF (llama.cpp's grammars: rules written `name ::= ...`, or a `.gbnf` file) or Lark.
    #[arg(
        long,
        value_name = "GRAMMAR|FILE",
        group = "constraint",
        alias = "grammar-file"
    )]
    grammar: Option<String>,
    /// Constrain the output to match a regular expression.
    #[arg(long, value_name = "REGEX", group = "constraint")]
    regex: Option<String>,
    /// Stop when the output contains STRING, which is left out of it (repeatable; as the
    /// server's `stop`). Text that might be the start of one is printed once it is clear.
    #[arg(long, value_name = "STRING", alias = "reverse-prompt")]
    stop: Vec<String>,
    /// Take `\n`, `\t`, `\\` and the other escapes of the prompt and of `--stop` literally
    /// (by default they become the characters they name, as in llama.cpp).
    #[arg(long)]
    no_escape: bool,
    /// Speculative decoding with the built-in n-gram (prompt-lookup) drafter.
    #[arg(long)]
    speculate: bool,
    /// Start from the session saved in FILE (by `--save-session`): the part of the prompt
    /// it already holds is not computed again. The prompt may then be empty, to continue.
    #[arg(long, value_name = "FILE")]
    load_session: Option<std::path::PathBuf>,
    /// Save the session (prompt and output, KV cache included) to FILE at the end. It does not
    /// record `--lora`: load it with the same adapters to continue as this run would have.
    #[arg(long, value_name = "FILE")]
    save_session: Option<std::path::PathBuf>,
    /// Apply a LoRA adapter (GGUF file or PEFT directory), optionally scaled: `PATH[:SCALE]`
    /// (repeatable; the adapters' deltas add up).
    #[arg(long, value_name = "PATH[:SCALE]", value_parser = parse_lora)]
    lora: Vec<(std::path::PathBuf, f32)>,
    /// The prompt, used as is (no chat template); `-` reads it from standard input, as does
    /// no prompt at all when standard input is a pipe or a file (one final newline dropped)
    /// — except with `--load-session`, where no prompt continues the session (give `-`).
    /// An empty prompt is an error otherwise (llama.cpp samples from BOS alone there).
    #[arg(default_value = "")]
    prompt: String,
    /// The prompt, as llama.cpp's `-p` gives it (in place of the argument).
    #[arg(
        short = 'p',
        long = "prompt",
        value_name = "PROMPT",
        conflicts_with = "file"
    )]
    prompt_flag: Option<String>,
    /// Read the prompt from FILE (as it is: no escapes), as llama.cpp's `-f`.
    #[arg(short = 'f', long = "file", value_name = "FILE", alias = "prompt-file")]
    file: Option<std::path::PathBuf>,
}

impl Args {
    /// The constraint the flags ask for (clap lets through at most one).
    fn schemas(&self) -> anyhow::Result<Vec<Schema>> {
        let mut out = Vec::new();
        if let Some(arg) = &self.json_schema {
            let (text, from) = text_or_file(arg)?;
            let v = serde_json::from_str(&text).with_context(|| match from {
                Some(p) => format!("{} is not JSON", p.display()),
                None => format!("--json-schema is neither a file nor JSON: {}", shorten(arg)),
            })?;
            out.push(Schema::JsonSchema(v));
        }
        if let Some(arg) = &self.grammar {
            let (text, from) = text_or_file(arg)?;
            let gbnf_file = from.is_some_and(|p| p.extension().is_some_and(|e| e == "gbnf"));
            out.push(if gbnf_file || text.contains("::=") {
                Schema::Gbnf(text)
            } else {
                Schema::Lark(text)
            });
        }
        if let Some(r) = &self.regex {
            out.push(Schema::Regex(r.clone()));
        }
        Ok(out)
    }
}

/// The text `arg` names: the file at that path if there is one (and the path), else `arg`
/// itself. A file name that is not there (`schema.json`, `dir/g.lark`: one word, with a
/// known extension or a directory, and none of a schema's or a grammar's `{`, `"`, `=`) is
/// an error, not text.
fn text_or_file(arg: &str) -> anyhow::Result<(String, Option<&std::path::Path>)> {
    let p = std::path::Path::new(arg);
    if p.is_file() {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        return Ok((text, Some(p)));
    }
    let one_word = !arg.trim().is_empty()
        && !arg.contains(char::is_whitespace)
        && !arg.contains(['{', '"', '='].as_slice());
    let named = [".json", ".gbnf", ".lark"].iter().any(|e| arg.ends_with(e))
        || arg.contains(std::path::MAIN_SEPARATOR);
    anyhow::ensure!(!(one_word && named), "cannot read {arg}: no such file");
    Ok((arg.to_string(), None))
}

/// `s` cut to its first 60 characters, for a message.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `s` with llama.cpp's escapes (`string_process_escapes`) turned into the characters they
/// name: `\n`, `\r`, `\t`, `\'`, `\"`, `\\` and `\xHH`; any other backslash stays.
pub fn process_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek().copied() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\'') => out.push('\''),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some('x') => {
                let hex: String = chars.clone().skip(1).take(2).collect();
                match u8::from_str_radix(&hex, 16) {
                    // A byte below 0x80 is a character; others would not be UTF-8 alone.
                    Ok(b) if hex.len() == 2 && b < 0x80 => {
                        out.push(char::from(b));
                        chars.next();
                        chars.next();
                    }
                    _ => {
                        out.push('\\');
                        continue;
                    }
                }
            }
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    out
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    let piped = || !std::io::IsTerminal::is_terminal(&std::io::stdin());
    let given = args.prompt_flag.is_some() || args.file.is_some();
    anyhow::ensure!(
        !given || args.prompt.is_empty(),
        "give the prompt once: as the argument, with -p or with -f"
    );
    if let Some(p) = args.prompt_flag.take() {
        args.prompt = p;
    }
    // An argument's escapes, as llama.cpp reads `-p` (a prompt from standard input is text
    // as it is, as llama.cpp's `-f` file is).
    if !args.no_escape {
        if args.prompt != "-" {
            args.prompt = process_escapes(&args.prompt);
        }
        args.stop = args.stop.iter().map(|s| process_escapes(s)).collect();
    }
    // `weft run gemma3`, as `ollama run gemma3` is typed: the name is the prompt here.
    let named = weft::hub::find(&args.prompt);
    if named.is_some()
        && named.map(|m| m.name) != weft::hub::find(&args.model.model).map(|m| m.name)
    {
        errln!(
            "note: \"{}\" is read as the prompt, for {}; to run that model, give -m {}",
            args.prompt,
            args.model.model,
            args.prompt
        );
    }
    if let Some(f) = &args.file {
        args.prompt = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the prompt file {}", f.display()))?;
    } else if args.prompt == "-"
        || (args.prompt.is_empty() && args.load_session.is_none() && piped())
    {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read the prompt from standard input")?;
        // `echo TEXT |` ends the text with a newline the user did not type.
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        args.prompt = text;
    }
    // What can be refused without the model is refused before loading it (or fetching it).
    anyhow::ensure!(
        !args.prompt.is_empty() || args.load_session.is_some(),
        "the prompt is empty (give it as an argument, or `-` to read it from standard input)"
    );
    anyhow::ensure!(
        args.stop.iter().all(|s| !s.is_empty()),
        "--stop needs a string that is not empty"
    );
    let schemas = args.schemas()?;
    let sampler = args.sampling.sampler()?;
    let penalties = args.sampling.penalties()?;
    args.threads.check()?;
    args.context.check()?;
    let path = args.model.path()?;
    let engine = args
        .model
        .engine(&path, args.context.engine_config(&args.threads)?)?;
    let bias = args.sampling.logit_bias(&engine)?;
    let seed = args.sampling.seed();
    let (mut ctx, reused) = match &args.load_session {
        Some(f) => load_session(&engine, f, &args.prompt)?,
        None => {
            let mut ctx = engine.context();
            ctx.fill(&args.prompt)?;
            (ctx, 0)
        }
    };
    if args.sampling.seed.is_some() || args.load_session.is_none() {
        ctx.set_seed(seed);
    }
    // A session that cannot be saved is found out before the generation, not after it.
    let session_out = args
        .save_session
        .as_deref()
        .map(|f| ReplacingFile::create(f, "save the session"))
        .transpose()?;
    let prompt_ids = ctx.pending().to_vec();
    anyhow::ensure!(
        !prompt_ids.is_empty() || !ctx.is_empty(),
        "the prompt is empty (give it as an argument, or `-` to read it from standard input)"
    );
    let adapters = args
        .lora
        .iter()
        .map(|(p, scale)| {
            let a = engine
                .load_adapter(p)
                .with_context(|| format!("cannot load the adapter {}", p.display()))?;
            anyhow::Ok((a, *scale))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Stop at the context's end, as the server's "length" finish does, rather than fail there;
    // a prompt that leaves no room is an error, as there.
    let held = ctx.len() + prompt_ids.len();
    anyhow::ensure!(
        held < engine.n_ctx(),
        "the prompt has {held} tokens, which leaves no room in the context of {} (-c sets it)",
        engine.n_ctx()
    );
    let max_tokens = args.n_predict.min(engine.n_ctx() - held);
    let mut g = ctx.generate(sampler).max_tokens(max_tokens);
    if let Some(p) = penalties {
        g = g.penalties(p);
    }
    g = g.logit_bias(&bias);
    for (a, scale) in &adapters {
        g = g.adapter(a, *scale);
    }
    for s in &args.stop {
        g = g.stop_string(s);
    }
    let constrained = !schemas.is_empty();
    for s in schemas {
        g = g.constrain_with(s);
    }
    if args.speculate {
        g = g.system_speculation();
    }
    let mut out = std::io::stdout().lock();
    let t0 = Instant::now();
    let mut t_prompt = None;
    // Tokens the prompt's pass gave: one, or more when it also checked drafts.
    let mut first_tokens = 0;
    while let Some(step) = g.next()? {
        // Echo the prompt once the options have been checked (the first `next`).
        if !args.json && t_prompt.is_none() {
            write!(out, "{}", args.prompt)?;
            out.flush()?;
        }
        let step = block_on(step.execute())?;
        if t_prompt.is_none() {
            t_prompt = Some(t0.elapsed());
            first_tokens = step.accepted.len();
        }
        if !args.json {
            write!(out, "{}", g.ready_text())?;
            out.flush()?;
        }
    }
    if !args.json && t_prompt.is_none() {
        // Nothing ran (`-n 0`): the prompt is still the output's start.
        write!(out, "{}", args.prompt)?;
    }
    let total = t0.elapsed();
    let ids = g.tokens().to_vec();
    let context_full = max_tokens < args.n_predict && ids.len() >= max_tokens;
    if args.json {
        let json = serde_json::json!({ "prompt_ids": prompt_ids, "ids": ids, "text": g.text() });
        writeln!(out, "{json}")?;
    } else {
        writeln!(out, "{}", g.ready_text())?;
    }
    let ran = t_prompt.is_some();
    let t_prompt = t_prompt.unwrap_or(total);
    let t_gen = total.saturating_sub(t_prompt).as_secs_f64();
    // A greedy generation draws no random number: its seed means nothing. A loaded session
    // samples on with the random state it saved, unless --seed says otherwise.
    let seed_note = match (
        args.sampling.is_greedy(),
        args.sampling.seed,
        &args.load_session,
    ) {
        (true, ..) => String::new(),
        (false, None, Some(_)) => " | seed from the session".to_string(),
        (false, ..) => format!(" | seed {seed}"),
    };
    let (drafted, accepted) = g.speculation_stats();
    let cut_constraint =
        constrained && matches!(g.stop_reason(), Some(weft::StopReason::MaxTokens));
    drop(g);
    if let Some(out) = session_out {
        out.write(|w| ctx.snapshot_to(w))?;
    }
    let session_note = if args.load_session.is_some() {
        format!(" ({reused} more from the session)")
    } else {
        String::new()
    };
    let spec_note = if args.speculate {
        format!(" | drafts accepted {accepted}/{drafted}")
    } else {
        String::new()
    };
    if cut_constraint && !context_full {
        // Standard error may be a closed pipe (`2>&1 | head`): nothing to do about it then.
        let _ = writeln!(
            std::io::stderr(),
            "\nnote: the output stopped at -n {} tokens, before the constraint reached its end: it may be incomplete (raise -n)",
            args.n_predict
        );
    }
    if context_full {
        let _ = writeln!(
            std::io::stderr(),
            "\nnote: the output stopped at the end of the context ({} tokens; -c sets it)",
            engine.n_ctx()
        );
    }
    // The prompt's pass gives the first token (or several, with drafts); the decode rate counts
    // the ones after it.
    let prompt_rate = match ran {
        true => format!(
            ", {:.1} tokens/s",
            prompt_ids.len() as f64 / t_prompt.as_secs_f64().max(1e-9)
        ),
        false => ", not run".to_string(),
    };
    let gen_rate = match ids.len().saturating_sub(first_tokens) {
        0 => String::new(),
        n => format!(", {:.1} tokens/s", n as f64 / t_gen.max(1e-9)),
    };
    let _ = writeln!(
        std::io::stderr(),
        "\nprompt: {}{session_note}{prompt_rate} | generated: {}{gen_rate}{seed_note}{spec_note}",
        crate::count(prompt_ids.len(), "token"),
        crate::count(ids.len(), "token"),
    );
    Ok(())
}

/// A context resumed from the session file `f`, keeping the longest part of its tokens that
/// `prompt` starts with and buffering the rest of the prompt (an empty prompt continues the
/// session as it is). Returns the context and how many of the prompt's tokens it reused.
fn load_session(
    engine: &weft::Engine,
    f: &std::path::Path,
    prompt: &str,
) -> anyhow::Result<(weft::Context, usize)> {
    let bytes =
        std::fs::read(f).with_context(|| format!("cannot read the session {}", f.display()))?;
    let mut ctx = engine
        .resume(&bytes)
        .with_context(|| format!("cannot resume the session {}", f.display()))?;
    if prompt.is_empty() {
        let n = ctx.len();
        return Ok((ctx, n));
    }
    let ids = engine.tokenizer().encode(prompt, true, true);
    // The prompt's last token is run even when the session holds it, as the generation would
    // run it again for its logits: `--json`'s prompt_ids then lists it.
    let Ok(common) = ctx.rewind_to_shared(&ids[..ids.len().saturating_sub(1)]) else {
        // A sliding-window model cannot rewind far back: start over.
        ctx = engine.context();
        ctx.fill_tokens(&ids)?;
        return Ok((ctx, 0));
    };
    ctx.fill_tokens(&ids[common..])?;
    Ok((ctx, common))
}

/// `PATH[:SCALE]` of `--lora` (a suffix that is not a number belongs to the path).
fn parse_lora(s: &str) -> Result<(std::path::PathBuf, f32), String> {
    if let Some((path, scale)) = s.rsplit_once(':') {
        if let Ok(scale) = scale.parse::<f32>() {
            if !scale.is_finite() {
                return Err(format!("the scale in {s:?} is not a finite number"));
            }
            return Ok((path.into(), scale));
        }
    }
    Ok((s.into(), 1.0))
}
