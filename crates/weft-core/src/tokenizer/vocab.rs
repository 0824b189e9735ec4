//! The vocabulary as a GGUF file stores it: token texts, scores, types and special ids.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::gguf::{Array, GgufFile};

/// A token's type (`tokenizer.ggml.token_type`), as in SentencePiece and llama.cpp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary piece of text.
    Normal,
    /// The unknown token.
    Unknown,
    /// A control token (`<bos>`, `<|im_start|>`): never produced from plain text.
    Control,
    /// A user-defined token: always matched as a whole in the input.
    UserDefined,
    /// A reserved, unused slot.
    Unused,
    /// A byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenType {
    fn from_gguf(t: i64) -> TokenType {
        match t {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// Special token ids and flags read from `tokenizer.ggml.*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// Whether encoding with special tokens prepends BOS.
    pub add_bos: bool,
    /// Whether encoding with special tokens appends EOS.
    pub add_eos: bool,
}

/// Token texts with their lookup table, scores and types.
#[derive(Debug, Clone)]
pub struct Vocab {
    pub(crate) texts: Vec<String>,
    pub(crate) scores: Vec<f32>,
    pub(crate) types: Vec<TokenType>,
    pub(crate) ids: HashMap<String, u32>,
    pub(crate) special: SpecialTokens,
    /// Tokens that end a generation: EOS and the end-of-turn tokens of known chat formats.
    pub(crate) eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order in which
    /// they are cut out of the input before the text between them is tokenized.
    pub(crate) specials_by_length: Vec<u32>,
}

fn bad(reason: impl Into<String>) -> Error {
    Error::BadTokenizer {
        reason: reason.into(),
    }
}

/// Token texts llama.cpp takes for end-of-generation tokens whatever the file says
/// (`llama_vocab::impl::load`, the `special_eog_ids` list): a token with one of these texts
/// gets the control attribute on top of its type.
const LLAMA_CPP_EOG_TEXTS: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// Makes the tokens llama.cpp forces to control tokens by their text control tokens here too.
///
/// Which tokens llama.cpp's `tokenizer_st_partition` cuts out of the input depends on their
/// attributes: control and unknown tokens only when special tokens are parsed, user-defined
/// tokens always, so with parsing off their text still becomes the token. A user-defined (or
/// normal) token whose text is on [`LLAMA_CPP_EOG_TEXTS`] has the control attribute added at
/// load, so with parsing off it is plain text, and with parsing on it is cut out even when the
/// file calls it normal. Gemma 3's user-defined `</s>` is such a token, unlike its other
/// user-defined tags (`<s>`, `<b>`, `<h1>`): `"<s>x</s>"` unparsed is `<s>`, `x`, `</`, `s`, `>`.
/// Control plus any other attribute acts as control wherever weft reads the type (partition;
/// decoding, which renders its text only with special tokens rendered).
///
/// Not mirrored: llama.cpp's marking of the first fill-in-the-middle token of each kind it finds
/// by text (only when the file names none; neither real model has one that is not control
/// already), and its exceptions for gpt-oss, Solar Open, Gemma 4 and PLaMo vocabularies. Token
/// attributes lstrip/rstrip (whitespace swallowed beside a match) are not in GGUF files;
/// llama.cpp sets them only by model name for Jina, Nomic, Phi-3 and ModernBERT, so none apply.
fn promote_end_tokens_to_control(texts: &[String], types: &mut [TokenType]) {
    for (text, ty) in texts.iter().zip(types.iter_mut()) {
        // Unknown already acts as control here; byte tokens never have such text.
        let promotable = matches!(
            ty,
            TokenType::Normal | TokenType::UserDefined | TokenType::Unused
        );
        if promotable && LLAMA_CPP_EOG_TEXTS.contains(&text.as_str()) {
            *ty = TokenType::Control;
        }
    }
}

impl Vocab {
    /// Reads the vocabulary from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab> {
        let texts = match file.get_array("tokenizer.ggml.tokens")? {
            Array::String(t) => t.clone(),
            a => {
                return Err(bad(format!(
                    "tokenizer.ggml.tokens holds {} values, expected strings",
                    a.element_type_name()
                )))
            }
        };
        if texts.is_empty() || texts.len() > u32::MAX as usize {
            return Err(bad(format!("vocabulary of {} tokens", texts.len())));
        }
        let n = texts.len();
        let scores = match file.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(_) => match file.get_array("tokenizer.ggml.scores")? {
                Array::F32(s) if s.len() == n => s.clone(),
                a => {
                    return Err(bad(format!(
                        "tokenizer.ggml.scores has {} {} values for {n} tokens",
                        a.len(),
                        a.element_type_name()
                    )))
                }
            },
        };
        let mut types = match file.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n],
            Some(_) => {
                let a = file.get_array("tokenizer.ggml.token_type")?;
                match a.to_i64_vec() {
                    Some(t) if t.len() == n => t.into_iter().map(TokenType::from_gguf).collect(),
                    _ => {
                        return Err(bad(format!(
                            "tokenizer.ggml.token_type has {} {} values for {n} tokens",
                            a.len(),
                            a.element_type_name()
                        )))
                    }
                }
            }
        };
        promote_end_tokens_to_control(&texts, &mut types);
        let id_key = |key: &str| -> Result<Option<u32>> {
            match file.opt_u64(key)? {
                None => Ok(None),
                Some(id) if (id as usize) < n => Ok(Some(id as u32)),
                // llama.cpp treats an out-of-range special id as absent; so do we.
                Some(_) => Ok(None),
            }
        };
        let special = SpecialTokens {
            bos: id_key("tokenizer.ggml.bos_token_id")?,
            eos: id_key("tokenizer.ggml.eos_token_id")?,
            unk: id_key("tokenizer.ggml.unknown_token_id")?,
            pad: id_key("tokenizer.ggml.padding_token_id")?,
            add_bos: file
                .opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(false),
            add_eos: file
                .opt_bool("tokenizer.ggml.add_eos_token")?
                .unwrap_or(false),
        };
        Ok(Vocab::new(texts, scores, types, special))
    }

    /// Builds a vocabulary from its parts (all three vectors have one entry per token).
    pub(crate) fn new(
        texts: Vec<String>,
        scores: Vec<f32>,
        types: Vec<TokenType>,
        special: SpecialTokens,
    ) -> Vocab {
        let mut ids = HashMap::with_capacity(texts.len());
        // On duplicate texts the last id wins, as in llama.cpp's token_to_id map.
        for (i, t) in texts.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let mut specials_by_length: Vec<u32> = (0..texts.len() as u32)
            .filter(|&i| {
                matches!(
                    types[i as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                ) && !texts[i as usize].is_empty()
            })
            .collect();
        // Stable sort: equal lengths keep id order, like llama.cpp's std::sort on this data.
        specials_by_length.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));
        // As llama.cpp: EOS plus every token whose text is on its end-of-generation list, the
        // list that made them control tokens (Gemma 3's `</s>` too, which llama.cpp stops on).
        let mut eog: Vec<u32> = special.eos.into_iter().collect();
        for t in LLAMA_CPP_EOG_TEXTS {
            if let Some(&id) = ids.get(t) {
                if !eog.contains(&id) {
                    eog.push(id);
                }
            }
        }
        Vocab {
            eog,
            texts,
            scores,
            types,
            ids,
            special,
            specials_by_length,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// True for an empty vocabulary (never the case for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The id of the token whose text is exactly `text`.
    pub fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The stored text of token `id` (byte-level or `▁`-escaped, as in the file).
    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The score of token `id` (SentencePiece log-probability; 0 when the file has none).
    pub fn score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// Tokens that end a generation (EOS and end-of-turn tokens).
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` ends a generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Special token ids and flags.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_texts_become_control_and_other_tags_stay_user_defined() {
        let texts: Vec<String> = ["<unk>", "</s>", "<s>", "<b>", "<|endoftext|>", "<eos>"]
            .map(String::from)
            .into();
        let mut types = vec![
            TokenType::Unknown,
            TokenType::UserDefined,
            TokenType::UserDefined,
            TokenType::UserDefined,
            TokenType::Normal,
            TokenType::Control,
        ];
        promote_end_tokens_to_control(&texts, &mut types);
        assert_eq!(
            types,
            [
                TokenType::Unknown,
                TokenType::Control,
                TokenType::UserDefined,
                TokenType::UserDefined,
                TokenType::Control,
                TokenType::Control,
            ]
        );
    }
}
