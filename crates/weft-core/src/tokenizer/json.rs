//! Tokenizers from a Hugging Face `tokenizer.json` (the file `tokenizers` and
//! sentence-transformers ship): the vocabulary, added tokens, normalizer, pre-tokenizer and the
//! post-processor's special tokens.
//!
//! Supported: the BERT family (`WordPiece` model with `BertNormalizer` and `BertPreTokenizer`,
//! `TemplateProcessing` or `BertProcessing` adding `[CLS]` … `[SEP]`), and BPE models (see
//! [`super::json_bpe`]). Any other component is an [`Error::UnsupportedTokenizer`] naming it, so
//! a file this loader does not understand is never tokenized wrongly.

use std::collections::HashMap;

use serde_json::Value;

use super::vocab::{SpecialTokens, TokenType, Vocab};
use super::wordpiece::{BertNormalizer, WordPiece};
use super::{Model, Tokenizer};
use crate::error::{Error, Result};

pub(super) fn bad(reason: impl Into<String>) -> Error {
    Error::BadTokenizer {
        reason: format!("tokenizer.json: {}", reason.into()),
    }
}

pub(super) fn unsupported(what: &str, kind: &Value) -> Error {
    Error::UnsupportedTokenizer {
        model: format!("tokenizer.json {what} {kind}"),
    }
}

/// The BERT pipeline: normalize, split on whitespace and punctuation, WordPiece each word.
#[derive(Debug, Clone)]
pub(super) struct BertPipeline {
    pub normalizer: Option<BertNormalizer>,
    pub wordpiece: WordPiece,
    /// The prefix of word-continuing pieces (`##`), dropped when decoding.
    pub continuing_prefix: String,
}

impl BertPipeline {
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let normalized;
        let text = match &self.normalizer {
            Some(n) => {
                normalized = n.normalize(text);
                normalized.as_str()
            }
            None => text,
        };
        for word in super::wordpiece::bert_pre_tokenize(text) {
            self.wordpiece.encode_word(word, out);
        }
    }
}

/// Parses `text` as a `tokenizer.json`.
pub(super) fn from_json(text: &str) -> Result<Tokenizer> {
    let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let model = v.get("model").ok_or_else(|| bad("no \"model\""))?;
    match model.get("type").and_then(Value::as_str) {
        Some("WordPiece") => wordpiece_from_json(&v, model),
        // Name the model in what this loader refuses: "… normalizer BertNormalizer (BPE model)".
        Some("BPE") => super::json_bpe::from_json(&v, model).map_err(|e| match e {
            Error::UnsupportedTokenizer { model } => Error::UnsupportedTokenizer {
                model: format!("{model} (BPE model)"),
            },
            e => e,
        }),
        _ => Err(unsupported(
            "model",
            model.get("type").unwrap_or(&Value::Null),
        )),
    }
}

/// The BERT family: a `WordPiece` model.
fn wordpiece_from_json(v: &Value, model: &Value) -> Result<Tokenizer> {
    let vocab_map = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("model.vocab is not an object"))?;
    let mut ids: HashMap<String, u32> = HashMap::with_capacity(vocab_map.len());
    for (token, id) in vocab_map {
        let id = id
            .as_u64()
            .filter(|&id| id < vocab_map.len() as u64)
            .ok_or_else(|| bad(format!("token {token:?} has id {id}, not in 0..vocab size")))?;
        ids.insert(token.clone(), id as u32);
    }
    let mut texts = vec![None; vocab_map.len()];
    for (token, &id) in &ids {
        if texts[id as usize].replace(token.clone()).is_some() {
            return Err(bad(format!("two tokens have id {id}")));
        }
    }
    // Each id was checked to be in range and used once, so every slot is filled.
    let texts: Vec<String> = texts.into_iter().map(Option::unwrap_or_default).collect();
    let mut types = vec![TokenType::Normal; texts.len()];
    for added in v
        .get("added_tokens")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        let (Some(id), Some(content)) = (
            added.get("id").and_then(Value::as_u64),
            added.get("content").and_then(Value::as_str),
        ) else {
            return Err(bad(format!("added token {added} lacks an id or content")));
        };
        if texts.get(id as usize).map(String::as_str) != Some(content) {
            return Err(bad(format!(
                "added token {content:?} has id {id}, which the vocabulary gives to another token"
            )));
        }
        let special = added.get("special").and_then(Value::as_bool) == Some(true);
        types[id as usize] = if special {
            TokenType::Control
        } else {
            TokenType::UserDefined
        };
    }

    let str_field = |obj: &Value, k: &str| obj.get(k).and_then(Value::as_str).map(str::to_string);
    let unk_text = str_field(model, "unk_token").unwrap_or_else(|| "[UNK]".to_string());
    let unk = ids.get(&unk_text).copied();
    let continuing_prefix =
        str_field(model, "continuing_subword_prefix").unwrap_or_else(|| "##".to_string());
    let max_chars = model
        .get("max_input_chars_per_word")
        .and_then(Value::as_u64)
        .unwrap_or(100) as usize;
    let wordpiece = WordPiece::new(ids, &unk_text, continuing_prefix.clone(), max_chars)
        .ok_or_else(|| {
            bad(format!(
                "the unknown token {unk_text:?} is not in the vocabulary"
            ))
        })?;

    let normalizer = match v.get("normalizer") {
        None | Some(Value::Null) => None,
        Some(n) if n.get("type").is_some_and(|t| t == "BertNormalizer") => {
            let flag =
                |k: &str, default: bool| n.get(k).and_then(Value::as_bool).unwrap_or(default);
            Some(BertNormalizer {
                clean_text: flag("clean_text", true),
                handle_chinese_chars: flag("handle_chinese_chars", true),
                strip_accents: n.get("strip_accents").and_then(Value::as_bool),
                lowercase: flag("lowercase", true),
            })
        }
        Some(n) => return Err(unsupported("normalizer", n.get("type").unwrap_or(n))),
    };
    match v.get("pre_tokenizer") {
        Some(p) if p.get("type").is_some_and(|t| t == "BertPreTokenizer") => {}
        Some(p) => return Err(unsupported("pre_tokenizer", p.get("type").unwrap_or(p))),
        None => return Err(bad("no pre_tokenizer")),
    }

    let (bos, eos) = special_wrap(v.get("post_processor"), &texts)?;
    let (special, max_len) = file_settings(v, (bos, eos), unk, texts.len());
    let scores = vec![0.0; texts.len()];
    Ok(Tokenizer {
        vocab: Vocab::new(texts, scores, types, special),
        model: Model::WordPiece(Box::new(BertPipeline {
            normalizer,
            wordpiece,
            continuing_prefix,
        })),
        truncation: max_len,
    })
}

/// The special tokens of a `tokenizer.json` (`bos`/`eos` from its post-processor, `unk` from
/// its model, the pad id of its `padding`, if in the `n`-token vocabulary) and its truncation
/// length (`truncation.max_length`).
pub(super) fn file_settings(
    v: &Value,
    (bos, eos): (Option<u32>, Option<u32>),
    unk: Option<u32>,
    n: usize,
) -> (SpecialTokens, Option<usize>) {
    let special = SpecialTokens {
        bos,
        eos,
        unk,
        pad: v
            .get("padding")
            .and_then(|p| p.get("pad_id"))
            .and_then(Value::as_u64)
            .filter(|&id| (id as usize) < n)
            .map(|id| id as u32),
        add_bos: bos.is_some(),
        add_eos: eos.is_some(),
    };
    let truncation = v
        .get("truncation")
        .and_then(|t| t.get("max_length"))
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    (special, truncation)
}

/// The tokens the post-processor puts before and after a single sequence: `[CLS]` and
/// `[SEP]` for BERT. No post-processor adds none.
pub(super) fn special_wrap(
    post: Option<&Value>,
    texts: &[String],
) -> Result<(Option<u32>, Option<u32>)> {
    let Some(post) = post.filter(|p| !p.is_null()) else {
        return Ok((None, None));
    };
    let id_of = |token: &Value| -> Result<u32> {
        // BertProcessing: ["[CLS]", 101]; TemplateProcessing: the special_tokens map.
        let id = token.get(1).and_then(Value::as_u64);
        id.filter(|&id| (id as usize) < texts.len())
            .map(|id| id as u32)
            .ok_or_else(|| bad(format!("post_processor token {token} has no valid id")))
    };
    match post.get("type").and_then(Value::as_str) {
        Some("BertProcessing") => {
            let cls = id_of(post.get("cls").unwrap_or(&Value::Null))?;
            let sep = id_of(post.get("sep").unwrap_or(&Value::Null))?;
            Ok((Some(cls), Some(sep)))
        }
        Some("TemplateProcessing") => {
            let single = post
                .get("single")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("post_processor.single is not a list"))?;
            let special_id = |piece: &Value| -> Result<u32> {
                let name = piece
                    .get("SpecialToken")
                    .and_then(|s| s.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let ids = post
                    .get("special_tokens")
                    .and_then(|m| m.get(name))
                    .and_then(|t| t.get("ids"))
                    .and_then(Value::as_array);
                match ids.map(Vec::as_slice) {
                    Some([id]) => id_of(&Value::Array(vec![Value::Null, id.clone()])),
                    _ => Err(bad(format!(
                        "special token {name:?} of the template has no single id"
                    ))),
                }
            };
            let is_seq = |p: &Value| p.get("Sequence").is_some();
            match single.as_slice() {
                [a] if is_seq(a) => Ok((None, None)),
                [c, a] if is_seq(a) => Ok((Some(special_id(c)?), None)),
                [a, s] if is_seq(a) => Ok((None, Some(special_id(s)?))),
                [c, a, s] if is_seq(a) => Ok((Some(special_id(c)?), Some(special_id(s)?))),
                _ => Err(unsupported(
                    "post_processor template",
                    &Value::Array(single.clone()),
                )),
            }
        }
        _ => Err(unsupported(
            "post_processor",
            post.get("type").unwrap_or(post),
        )),
    }
}
