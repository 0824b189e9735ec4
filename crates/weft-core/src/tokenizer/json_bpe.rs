//! Loading a BPE `tokenizer.json` (GPT-2 / Llama 3 style byte-level BPE, SentencePiece-style BPE
//! with byte fallback such as Gemma's) into the [`super::hf`] pipeline.
//!
//! Supported: model `BPE` (string or pair merges, `byte_fallback`, `unk_token`, `fuse_unk`,
//! `ignore_merges`, `continuing_subword_prefix`, `end_of_word_suffix`; `dropout` only off);
//! normalizers `Replace` (literal), `Prepend`, `NFC`/`NFD`/`NFKC`/`NFKD`, `Lowercase`, `Strip`,
//! `Sequence`; pre-tokenizers `ByteLevel`, `Split` (a literal, or GPT-2's or Llama 3's regex,
//! which weft implements by hand), `Digits`, `Metaspace`, `Sequence`; post-processors
//! `TemplateProcessing`, `ByteLevel`, `Sequence` of those; decoders `ByteLevel`, `Replace`,
//! `ByteFallback`, `Fuse`, `Strip` (of the whole text), `Metaspace`, `Sequence`. Anything else is
//! an [`Error::UnsupportedTokenizer`] naming it, never a tokenizer that is silently wrong.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::bpe::ByteMap;
use super::hf::{
    normalize, AddedSet, AddedToken, Behavior, Decoding, Normalizer, Pipeline, PreStep,
    PrependScheme,
};
use super::hf_bpe::BpeModel;
use super::json::{bad, file_settings, special_wrap, unsupported};
use super::pretokenize::PreTokenizer;
use super::vocab::{TokenType, Vocab};
use super::{Model, Tokenizer};
use crate::error::{Error, Result};

/// GPT-2's split regex, as `tokenizer.json` files spell it.
pub(super) const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's split regex.
pub(super) const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn kind(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or_default()
}

fn flag(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

fn string<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{what} has no string {key:?}")))
}

/// The literal of a `{"String": ...}` pattern; a `{"Regex": ...}` one is returned as `Err`.
fn pattern<'a>(v: &'a Value, what: &str) -> Result<std::result::Result<&'a str, &'a str>> {
    let p = v.get("pattern").unwrap_or(&Value::Null);
    if let Some(s) = p.get("String").and_then(Value::as_str) {
        Ok(Ok(s))
    } else if let Some(r) = p.get("Regex").and_then(Value::as_str) {
        Ok(Err(r))
    } else {
        Err(bad(format!(
            "{what} pattern {p} is neither a String nor a Regex"
        )))
    }
}

fn one_char(s: &str, what: &str) -> Result<char> {
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Ok(c),
        _ => Err(bad(format!("{what} {s:?} is not one character"))),
    }
}

fn normalizers(v: &Value, out: &mut Vec<Normalizer>) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    out.push(match kind(v) {
        "Sequence" => {
            let list = v.get("normalizers").and_then(Value::as_array);
            for n in list.ok_or_else(|| bad("normalizer Sequence has no list"))? {
                normalizers(n, out)?;
            }
            return Ok(());
        }
        "Replace" => match pattern(v, "Replace normalizer")? {
            Ok(p) => Normalizer::Replace {
                pattern: p.to_string(),
                content: string(v, "content", "Replace normalizer")?.to_string(),
            },
            Err(_) => return Err(unsupported("normalizer Replace with a regex", v)),
        },
        "Prepend" => Normalizer::Prepend(string(v, "prepend", "Prepend normalizer")?.to_string()),
        "NFC" => Normalizer::Nfc,
        "NFD" => Normalizer::Nfd,
        "NFKC" => Normalizer::Nfkc,
        "NFKD" => Normalizer::Nfkd,
        "Lowercase" => Normalizer::Lowercase,
        "Strip" => Normalizer::Strip {
            left: flag(v, "strip_left", true),
            right: flag(v, "strip_right", true),
        },
        _ => return Err(unsupported("normalizer", v.get("type").unwrap_or(v))),
    });
    Ok(())
}

fn pre_tokenizers(v: &Value, out: &mut Vec<PreStep>) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    out.push(match kind(v) {
        "Sequence" => {
            let list = v.get("pretokenizers").and_then(Value::as_array);
            for p in list.ok_or_else(|| bad("pre_tokenizer Sequence has no list"))? {
                pre_tokenizers(p, out)?;
            }
            return Ok(());
        }
        "ByteLevel" => PreStep::ByteLevel {
            add_prefix_space: flag(v, "add_prefix_space", true),
            use_regex: flag(v, "use_regex", true),
        },
        "Split" => {
            let behavior = match v.get("behavior").and_then(Value::as_str) {
                Some("Removed") => Behavior::Removed,
                Some("Isolated") => Behavior::Isolated,
                Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
                Some("MergedWithNext") => Behavior::MergedWithNext,
                Some("Contiguous") => Behavior::Contiguous,
                _ => return Err(bad(format!("Split has no known behavior: {v}"))),
            };
            let invert = flag(v, "invert", false);
            match pattern(v, "Split")? {
                Ok(p) => PreStep::Split {
                    pattern: p.to_string(),
                    behavior,
                    invert,
                },
                Err(r) if behavior == Behavior::Isolated && !invert && r == GPT2_REGEX => {
                    PreStep::Regex(PreTokenizer::Gpt2)
                }
                Err(r) if behavior == Behavior::Isolated && !invert && r == LLAMA3_REGEX => {
                    PreStep::Regex(PreTokenizer::Llama3)
                }
                Err(_) => return Err(unsupported("pre_tokenizer Split", v)),
            }
        }
        "Digits" => PreStep::Digits {
            individual: flag(v, "individual_digits", false),
        },
        "Metaspace" => {
            let replacement = one_char(
                v.get("replacement").and_then(Value::as_str).unwrap_or("▁"),
                "Metaspace replacement",
            )?;
            let prepend = match v.get("prepend_scheme").and_then(Value::as_str) {
                Some("always") => PrependScheme::Always,
                Some("first") => PrependScheme::First,
                Some("never") => PrependScheme::Never,
                Some(other) => return Err(bad(format!("Metaspace prepend_scheme {other:?}"))),
                // Files older than prepend_scheme say add_prefix_space.
                None if flag(v, "add_prefix_space", true) => PrependScheme::Always,
                None => PrependScheme::Never,
            };
            PreStep::Metaspace {
                replacement,
                prepend,
                split: flag(v, "split", true),
            }
        }
        _ => return Err(unsupported("pre_tokenizer", v.get("type").unwrap_or(v))),
    });
    Ok(())
}

/// Folds the decoder chain into token-by-token [`Decoding`]. Steps after `Fuse` see the whole
/// text, so only those that act the same on it (one-char replacements, stripping the start)
/// are accepted there.
fn decoder(v: &Value, d: &mut Decoding, fused: &mut bool) -> Result<()> {
    match kind(v) {
        "Sequence" => {
            let list = v.get("decoders").and_then(Value::as_array);
            for step in list.ok_or_else(|| bad("decoder Sequence has no list"))? {
                decoder(step, d, fused)?;
            }
        }
        "ByteLevel" if !*fused => d.byte_level = true,
        "ByteFallback" if !*fused => d.byte_fallback = true,
        "Fuse" => *fused = true,
        "Replace" => match pattern(v, "Replace decoder")? {
            Ok(p) if !*fused || p.chars().count() == 1 => d.replace.push((
                p.to_string(),
                string(v, "content", "Replace decoder")?.to_string(),
            )),
            _ => return Err(unsupported("decoder", v)),
        },
        "Strip" => {
            let content = one_char(string(v, "content", "Strip decoder")?, "Strip content")?;
            let count = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
            match (count("start"), count("stop")) {
                (0, 0) => {}
                (start, 0) if *fused && d.strip_start.is_none() => {
                    d.strip_start = Some((content, start))
                }
                _ => return Err(unsupported("decoder", v)),
            }
        }
        "Metaspace" if !*fused => {
            let replacement = v.get("replacement").and_then(Value::as_str).unwrap_or("▁");
            d.replace.push((replacement.to_string(), " ".to_string()));
            let prepends = match v.get("prepend_scheme").and_then(Value::as_str) {
                Some(scheme) => scheme != "never",
                None => flag(v, "add_prefix_space", true),
            };
            if prepends && d.strip_start.is_none() {
                d.strip_start = Some((' ', 1));
            }
        }
        _ => return Err(unsupported("decoder", v.get("type").unwrap_or(v))),
    }
    Ok(())
}

/// BOS and EOS the post-processor adds to a single sequence.
fn post_processor(v: &Value, texts: &[String]) -> Result<(Option<u32>, Option<u32>)> {
    match kind(v) {
        _ if v.is_null() => Ok((None, None)),
        "ByteLevel" => Ok((None, None)),
        "Sequence" => {
            let mut wrap = (None, None);
            let list = v.get("processors").and_then(Value::as_array);
            for p in list.ok_or_else(|| bad("post_processor Sequence has no list"))? {
                match post_processor(p, texts)? {
                    (None, None) => {}
                    w if wrap == (None, None) => wrap = w,
                    _ => return Err(unsupported("post_processor", v)),
                }
            }
            Ok(wrap)
        }
        _ => special_wrap(Some(v), texts),
    }
}

/// Builds a tokenizer from a parsed `tokenizer.json` whose model is `BPE`.
pub(super) fn from_json(v: &Value, model: &Value) -> Result<Tokenizer> {
    if model.get("dropout").and_then(Value::as_f64).unwrap_or(0.0) != 0.0 {
        return Err(unsupported("BPE with dropout", &model["dropout"]));
    }
    let vocab_map = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("model.vocab is not an object"))?;
    let added = v.get("added_tokens").and_then(Value::as_array);
    let added = added.map_or(&[][..], Vec::as_slice);
    // Ids may leave holes (unused slots) but not more than the file has tokens.
    let limit = (vocab_map.len() + added.len()) as u64;
    let id_of = |id: &Value, what: &dyn std::fmt::Display| {
        id.as_u64()
            .filter(|&id| id < limit && id < u64::from(u32::MAX))
            .map(|id| id as usize)
            .ok_or_else(|| bad(format!("{what} has id {id}, out of range")))
    };
    let mut texts: Vec<Option<String>> = Vec::new();
    let put = |texts: &mut Vec<Option<String>>, id: usize, text: &str| -> Result<bool> {
        if texts.len() <= id {
            texts.resize(id + 1, None);
        }
        match &texts[id] {
            Some(t) if t == text => Ok(false),
            Some(t) => Err(bad(format!("tokens {t:?} and {text:?} both have id {id}"))),
            None => {
                texts[id] = Some(text.to_string());
                Ok(true)
            }
        }
    };
    for (token, id) in vocab_map {
        let id = id_of(id, &format_args!("token {token:?}"))?;
        put(&mut texts, id, token)?;
    }
    let mut added_only = HashSet::new();
    let mut added_tokens = Vec::with_capacity(added.len());
    for a in added {
        let content = string(a, "content", "added token")?;
        let id = id_of(
            a.get("id").unwrap_or(&Value::Null),
            &format_args!("added token {content:?}"),
        )?;
        if put(&mut texts, id, content)? {
            if vocab_map.contains_key(content) {
                return Err(unsupported(
                    "added token that repeats a vocabulary token under another id",
                    a,
                ));
            }
            added_only.insert(id as u32);
        }
        added_tokens.push((id as u32, content, a));
    }
    let n = texts.len();
    let mut types: Vec<TokenType> = texts
        .iter()
        .map(|t| match t {
            Some(_) => TokenType::Normal,
            None => TokenType::Unused,
        })
        .collect();
    let texts: Vec<String> = texts.into_iter().map(Option::unwrap_or_default).collect();
    if n == 0 {
        return Err(bad("empty vocabulary"));
    }
    let model_id = |text: &str| {
        vocab_map
            .get(text)
            .and_then(Value::as_u64)
            .map(|i| i as u32)
    };

    let opt_string = |key: &str| model.get(key).and_then(Value::as_str).map(str::to_string);
    let prefix = opt_string("continuing_subword_prefix").filter(|p| !p.is_empty());
    let suffix = opt_string("end_of_word_suffix").filter(|s| !s.is_empty());
    let byte_fallback = flag(model, "byte_fallback", false);
    let unk = match opt_string("unk_token") {
        None => None,
        Some(t) => Some(
            model_id(&t)
                .ok_or_else(|| bad(format!("the unknown token {t:?} is not in the vocabulary")))?,
        ),
    };
    let byte_ids = byte_fallback.then(|| {
        let mut ids = Box::new([None; 256]);
        for (b, slot) in ids.iter_mut().enumerate() {
            *slot = model_id(&format!("<0x{b:02X}>"));
            if let Some(id) = *slot {
                types[id as usize] = TokenType::Byte;
            }
        }
        ids
    });
    let merges = merges(model, &model_id, prefix.as_deref().map_or(0, str::len))?;

    let mut norm = Vec::new();
    normalizers(v.get("normalizer").unwrap_or(&Value::Null), &mut norm)?;
    let mut pre = Vec::new();
    pre_tokenizers(v.get("pre_tokenizer").unwrap_or(&Value::Null), &mut pre)?;
    let mut decoding = Decoding::default();
    match v.get("decoder") {
        None | Some(Value::Null) => {
            return Err(Error::UnsupportedTokenizer {
                model: "tokenizer.json BPE without a decoder".to_string(),
            })
        }
        Some(d) => decoder(d, &mut decoding, &mut false)?,
    }

    let (mut raw_added, mut normalized_added) = (AddedSet::default(), AddedSet::default());
    for (id, content, a) in added_tokens {
        let special = flag(a, "special", false);
        types[id as usize] = if special {
            TokenType::Control
        } else {
            TokenType::UserDefined
        };
        let token = AddedToken {
            id,
            special,
            lstrip: flag(a, "lstrip", false),
            rstrip: flag(a, "rstrip", false),
            single_word: flag(a, "single_word", false),
        };
        // The library's default: special tokens are matched in the raw text.
        if flag(a, "normalized", !special) {
            normalized_added.insert(&normalize(&norm, content), token);
        } else {
            raw_added.insert(content, token);
        }
    }
    if let Some(u) = unk.filter(|&u| types[u as usize] == TokenType::Normal) {
        types[u as usize] = TokenType::Unknown;
    }

    let wrap = post_processor(v.get("post_processor").unwrap_or(&Value::Null), &texts)?;
    let (special, truncation) = file_settings(v, wrap, unk, n);
    let scores = vec![0.0; n];
    Ok(Tokenizer {
        vocab: Vocab::new(texts, scores, types, special),
        model: Model::HfBpe(Box::new(Pipeline {
            raw_added,
            normalized_added,
            normalizers: norm,
            pre,
            model: BpeModel {
                merges,
                unk,
                fuse_unk: flag(model, "fuse_unk", false),
                byte_ids,
                prefix,
                suffix,
                ignore_merges: flag(model, "ignore_merges", false),
                added_only,
            },
            decoding,
            bytes: ByteMap::new(),
        })),
        truncation,
    })
}

/// The merge table: `"a b"` strings or `["a", "b"]` pairs, rank = position. The merged token is
/// `a` + `b` without its continuing-subword prefix, as in the library.
fn merges(
    model: &Value,
    model_id: &dyn Fn(&str) -> Option<u32>,
    prefix_len: usize,
) -> Result<HashMap<(u32, u32), (u32, u32)>> {
    let list = match model.get("merges") {
        None | Some(Value::Null) => return Ok(HashMap::new()),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(bad(format!("model.merges is not a list: {other}"))),
    };
    let mut map = HashMap::with_capacity(list.len());
    for (rank, m) in list.iter().enumerate() {
        let (a, b) = match m {
            Value::String(s) => s
                .split_once(' ')
                .ok_or_else(|| bad(format!("merge {s:?} is not two tokens")))?,
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(a), Value::String(b)] => (a.as_str(), b.as_str()),
                _ => return Err(bad(format!("merge {m} is not a pair of strings"))),
            },
            _ => return Err(bad(format!("merge {m} is neither a string nor a pair"))),
        };
        let id = |t: &str| {
            model_id(t).ok_or_else(|| bad(format!("merge {m} uses {t:?}, not in the vocabulary")))
        };
        let merged = b
            .get(prefix_len..)
            .map(|rest| format!("{a}{rest}"))
            .ok_or_else(|| bad(format!("merge {m}: {b:?} lacks the subword prefix")))?;
        let new_id = id(&merged)?;
        map.insert((id(a)?, id(b)?), (rank as u32, new_id));
    }
    Ok(map)
}

#[cfg(test)]
#[path = "json_bpe_tests.rs"]
mod tests;
