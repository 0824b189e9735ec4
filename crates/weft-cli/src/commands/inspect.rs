//! `weft inspect -m MODEL`: what a GGUF file holds, or a sentence-embedding encoder's folder.

use std::fmt::Write as _;

use weft::gguf::{Array, Value};
use weft::models::TensorFile;
use weft::{Embedder, EmbedderConfig, GgufFile, Tokenizer};

use crate::model_arg::ModelArg;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Print every metadata key, not only the architecture's (arrays as their type and
    /// length, strings cut at 60 characters), and the chat template in full.
    #[arg(long)]
    all: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = args.model.path()?;
    if let Some(dir) = weft::checkpoint::encoder_folder(&path) {
        out!("{}", encoder_report(&dir)?)?;
        return Ok(());
    }
    let (file, mapped) = args.model.open_path_from(&path)?;
    let mut shown = path.display().to_string();
    if mapped.as_deref() != Some(path.as_path()) {
        // A checkpoint folder: what follows describes its conversion.
        let at = mapped.map_or("memory".to_string(), |m| m.display().to_string());
        shown = format!("{shown}, converted to {at}");
    }
    out!("{}", report(&file, &shown, args.all))?;
    Ok(())
}

/// A sentence-embedding encoder's folder: what weft makes of it, its `config.json` and its
/// tensors.
fn encoder_report(dir: &std::path::Path) -> anyhow::Result<String> {
    let embedder = Embedder::open(dir, EmbedderConfig::default())?;
    let weights = dir.join("model.safetensors");
    let tensors = TensorFile::open(&weights)?;
    let size = std::fs::metadata(&weights).map_or(0, |m| m.len());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "folder: {} (model.safetensors {})",
        dir.display(),
        mib(size)
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let _ = writeln!(
        out,
        "encoder: {}, {} dimensions, up to {} tokens, {} pooling",
        config["model_type"].as_str().unwrap_or("?"),
        embedder.dim(),
        embedder.max_tokens(),
        format!("{:?}", embedder.pooling()).to_lowercase()
    );
    let _ = writeln!(out, "\nconfig.json:");
    for (key, value) in config.as_object().into_iter().flatten() {
        let _ = writeln!(out, "  {key} = {value}");
    }
    let tok = embedder.tokenizer();
    let s = tok.vocab().special();
    let name = |id| special_name(tok, id);
    let _ = writeln!(
        out,
        "\ntokenizer: tokenizer.json, {} tokens",
        tok.vocab_size()
    );
    let _ = writeln!(
        out,
        "  cls/bos {}, sep/eos {}, unk {}, pad {}",
        name(s.bos),
        name(s.eos),
        name(s.unk),
        name(s.pad)
    );
    let mut list: Vec<(String, Vec<usize>)> = tensors.tensors().collect();
    list.sort();
    let _ = writeln!(out, "\ntensors: {}", list.len());
    let width = list.iter().map(|t| t.0.len()).max().unwrap_or(4).max(4);
    for (name, shape) in list {
        let _ = writeln!(out, "  {name:<width$}  {shape:?}");
    }
    Ok(out)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn report(file: &GgufFile, path: &str, all: bool) -> String {
    let mut out = String::new();
    let arch = file.architecture().unwrap_or("(none)");
    let _ = writeln!(
        out,
        "file: {path} ({}, GGUF v{}, alignment {})",
        mib(file.file_size()),
        file.version(),
        file.alignment()
    );
    let name = file.opt_str("general.name").ok().flatten().unwrap_or("-");
    let _ = writeln!(out, "architecture: {arch}   name: {name}");

    let _ = writeln!(out, "\nhyper-parameters:");
    let prefix = format!("{arch}.");
    for (key, value) in file.metadata() {
        if all || key.starts_with(&prefix) {
            let _ = writeln!(out, "  {key} = {value}");
        }
    }

    let _ = writeln!(out, "\ntokenizer:");
    let hf_json = file.get("tokenizer.huggingface.json").is_some();
    let model = file
        .opt_str("tokenizer.ggml.model")
        .ok()
        .flatten()
        .unwrap_or(if hf_json {
            "tokenizer.json (Hugging Face)"
        } else {
            "(none)"
        });
    let pre = file
        .opt_str("tokenizer.ggml.pre")
        .ok()
        .flatten()
        .unwrap_or(if hf_json {
            "from tokenizer.json"
        } else {
            "default"
        });
    let merges = match file.get("tokenizer.ggml.merges") {
        Some(Value::Array(a)) => format!(", {} merges", a.len()),
        _ => String::new(),
    };
    match Tokenizer::from_gguf(file) {
        Ok(tok) => {
            let _ = writeln!(
                out,
                "  model {model}, pre-tokenizer {pre}, {} tokens{merges}",
                tok.vocab_size()
            );
            let s = tok.vocab().special();
            let show = |id| special_name(&tok, id);
            let _ = writeln!(
                out,
                "  bos {}, eos {}, unk {}, pad {}; add_bos {}, add_eos {}",
                show(s.bos),
                show(s.eos),
                show(s.unk),
                show(s.pad),
                s.add_bos,
                s.add_eos
            );
        }
        Err(e) => {
            let _ = writeln!(out, "  model {model}: cannot build tokenizer: {e}");
        }
    }
    let template = match file.get("tokenizer.chat_template") {
        Some(Value::String(t)) => format!("present ({} chars)", t.len()),
        _ => "absent (weft uses the architecture's built-in format)".to_string(),
    };
    let _ = writeln!(out, "  chat template: {template}");
    if let (true, Some(Value::String(t))) = (all, file.get("tokenizer.chat_template")) {
        for line in t.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    if !hf_json
        && !matches!(
            file.get("tokenizer.ggml.tokens"),
            Some(Value::Array(Array::String(_)))
        )
    {
        let _ = writeln!(out, "  (no vocabulary in file)");
    }

    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let _ = writeln!(out, "\ntensors: {} ({})", file.tensors().len(), mib(total));
    let width = file
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "  {:<width$}  {:<6}  {:<18}  {:>12}",
        "name", "type", "shape", "bytes"
    );
    for t in file.tensors() {
        let shape = format!("{:?}", t.shape);
        let _ = writeln!(
            out,
            "  {:<width$}  {:<6}  {:<18}  {:>12}",
            t.name,
            t.dtype.name(),
            shape,
            t.n_bytes
        );
    }
    out
}

/// A special token as `ID "TEXT"`, or `-` when the tokenizer has none.
fn special_name(tok: &Tokenizer, id: Option<u32>) -> String {
    match id {
        Some(id) => format!("{id} {:?}", tok.vocab().text(id).unwrap_or("?")),
        None => "-".to_string(),
    }
}
