//! `weft tokenize -m MODEL [--no-parse-special]`: stdin text to a JSON array of ids, with a
//! decoder's tokenizer or a sentence-embedding encoder's.

use std::io::Read;

use anyhow::Context;
use weft::Tokenizer;

use crate::model_arg::ModelArg;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Treat special-token text such as `<|im_start|>` as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// Do not add the BOS/EOS tokens the model's file asks for.
    #[arg(long)]
    no_add_special: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = args.model.path()?;
    let tok = match weft::checkpoint::encoder_folder(&path) {
        // A sentence-embedding encoder: its tokenizer.json (the ids `weft embed` reads, before
        // the cut at the model's longest input).
        Some(dir) => {
            let json = dir.join("tokenizer.json");
            let text = std::fs::read_to_string(&json)
                .with_context(|| format!("cannot read {}", json.display()))?;
            Tokenizer::from_json(&text)?
        }
        // A decoder's checkpoint folder: the tokenizer alone, not a conversion of every
        // matrix (minutes, written to the cache).
        None => match weft::checkpoint::folder_of(&path) {
            Some(dir) => {
                weft::ensure_decoder(&path)?;
                let metadata = weft::checkpoint::convert_metadata(&dir)
                    .with_context(|| format!("cannot read the checkpoint {}", dir.display()))?;
                Tokenizer::from_gguf(&weft::GgufFile::from_bytes(metadata)?)?
            }
            // A GGUF file as it is: `--weights` widens matrices, which tokenizing never reads.
            None => Tokenizer::from_gguf(&weft::GgufFile::open(&path)?)?,
        },
    };
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("stdin is not valid UTF-8 text")?;
    let ids = tok.encode(&text, !args.no_add_special, !args.no_parse_special);
    outln!("{}", serde_json::to_string(&ids)?)?;
    Ok(())
}
