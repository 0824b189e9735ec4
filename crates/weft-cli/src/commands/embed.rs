//! `weft embed [-m MODEL] [--pooling P] [--no-normalize] [FILE|-]`: one JSON array (the text's
//! embedding; with `--pooling none` an array of each token's) per input line, computed in
//! batches — through the encoder for a sentence-transformers model (`all-minilm-l6-v2`, the
//! default), through the engine's scheduler for a GGUF decoder.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::Context as _;
use weft::{EmbedOptions, EmbeddingModel, Pooling};

use crate::model_arg::{ModelArg, ThreadsArg};

/// `-m` defaults to the sentence-embedding encoder rather than the chat model.
#[derive(Debug, clap::Args)]
#[command(mut_arg("model", |a| {
    a.default_value(weft::hub::DEFAULT_EMBEDDING_MODEL).help(
        "A known model name (see `weft models`), a sentence-transformers folder, the path of a \
         GGUF file (its pooled hidden states), or a Hugging Face checkpoint folder (Llama or \
         Gemma 3 safetensors with config.json and tokenizer.json)",
    )
}))]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    /// How token states become one vector: mean, max, last, cls, or none (every token's, as an
    /// array of arrays).
    /// Default: the model's own (an encoder's pooling config, a GGUF's `pooling_type`),
    /// else mean.
    #[arg(long, value_parser = str::parse::<Pooling>)]
    pooling: Option<Pooling>,
    /// Print the vectors as pooled, without scaling them to unit length.
    #[arg(long)]
    no_normalize: bool,
    /// Lines embedded per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// The input: one text per line (default or `-`: standard input).
    file: Option<std::path::PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let pooling = args.pooling;
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    args.threads.check()?;
    // The input is opened first: a missing file is an error before a model is fetched.
    let input: Box<dyn BufRead> = match &args.file {
        Some(p) if p.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let path = args.model.path()?;
    // A GGUF file or a generator's checkpoint folder is a decoder (pooled hidden states);
    // anything else is read as an encoder (a sentence-transformers folder, its safetensors).
    let decoder = path.is_dir() && weft::ensure_decoder(&path).is_ok();
    let model: Arc<dyn EmbeddingModel> = if weft::is_gguf(&path) || decoder {
        Arc::new(args.model.engine(&path, args.threads.engine_config()?)?)
    } else {
        let config = args.threads.engine_config()?;
        // Opened first: a file that is neither a GGUF nor an encoder's safetensors is named as
        // such, not called an encoder by the check below.
        let encoder = weft::open_embedding_model(&path, config)
            .with_context(|| format!("cannot load model {}", path.display()))?;
        // An encoder is read as its safetensors hold it, has no KV cache, and stays whole.
        let ignored = [
            (args.model.weights != Default::default(), "--weights"),
            (args.threads.kv_type != Default::default(), "--kv-type"),
            (args.threads.resident_layers.is_some(), "--resident-layers"),
        ];
        if let Some((_, flag)) = ignored.iter().find(|(set, _)| *set) {
            anyhow::bail!(
                "{flag} applies to decoders; {} is an encoder (its weights as stored, no KV cache)",
                args.model.model
            );
        }
        encoder
    };
    let opts = EmbedOptions {
        pooling: pooling.unwrap_or_else(|| model.default_pooling()),
        normalize: !args.no_normalize,
        ..EmbedOptions::default()
    };
    let mut out = std::io::stdout().lock();
    // Grown as lines come: `--batch` may be any number.
    let mut lines = Vec::new();
    // Input lines embedded so far, to name the lines of a batch that fails.
    let mut done = 0;
    let mut flush = |lines: &mut Vec<String>| -> anyhow::Result<()> {
        let texts: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (first, last) = (done + 1, done + lines.len());
        let vectors = model
            .embed_texts(&texts, opts)
            .with_context(|| match first == last {
                true => format!("cannot embed input line {first}"),
                false => format!("cannot embed input lines {first} to {last}"),
            })?;
        done = last;
        for v in vectors {
            let line = match opts.pooling {
                // Every token's vector: one array of arrays a line.
                Pooling::None => {
                    let rows: Vec<&[f32]> = v.chunks(model.dimensions().max(1)).collect();
                    serde_json::to_string(&rows)?
                }
                _ => serde_json::to_string(&v)?,
            };
            writeln!(out, "{line}")?;
        }
        lines.clear();
        Ok(())
    };
    // Empty lines at the end of the input are dropped; one before another text would leave
    // the output a line short of the input, and is an error.
    let mut first_empty = None;
    for (i, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("cannot read input line {}", i + 1))?;
        if line.is_empty() {
            first_empty.get_or_insert(i + 1);
            continue;
        }
        if let Some(n) = first_empty {
            anyhow::bail!("input line {n} is empty: each line is one text, and gets one vector");
        }
        lines.push(line);
        if lines.len() == args.batch {
            flush(&mut lines)?;
        }
    }
    if !lines.is_empty() {
        flush(&mut lines)?;
    }
    Ok(())
}
