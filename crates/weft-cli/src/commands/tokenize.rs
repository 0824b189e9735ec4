//! `weft tokenize -m MODEL [--no-parse-special]`: stdin text to a JSON array of ids.

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
    let file = args.model.open()?;
    let tok = Tokenizer::from_gguf(&file)?;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("stdin is not valid UTF-8 text")?;
    let ids = tok.encode(&text, !args.no_add_special, !args.no_parse_special);
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
