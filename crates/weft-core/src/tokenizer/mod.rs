//! Tokenizers built from GGUF metadata, matching llama.cpp token for token, or from a Hugging
//! Face `tokenizer.json`, matching the `tokenizers` library.
//!
//! From GGUF metadata: byte-level BPE (`tokenizer.ggml.model = "gpt2"`, e.g. SmolLM2) and
//! SentencePiece-style (`"llama"`, e.g. Gemma 3, Llama 2), as llama.cpp does them. From a
//! `tokenizer.json`: BERT's WordPiece (e.g. all-MiniLM-L6-v2) and BPE models (byte-level like
//! SmolLM2's or Llama 3's, SentencePiece-style with byte fallback like Gemma's), as Hugging
//! Face `tokenizers` does them. All first cut special tokens out of the input (user-defined
//! tokens always; control tokens only when special-token parsing is on), then tokenize the text
//! between them.
//!
//! Key design decision: our own code rather than the `tokenizers` crate. llama.cpp's behaviour
//! (its hand-written pre-tokenizers, its special-token partition, its byte fallback) is the
//! reference, and replicating it directly is simpler than bending a general library to it.
//!
//! ```no_run
//! use weft_core::{gguf::GgufFile, tokenizer::Tokenizer};
//! let file = GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello world", true, true);
//! assert_eq!(tok.decode(&ids)?, "Hello world");
//! # Ok::<(), weft_core::Error>(())
//! ```

mod bpe;
mod hf;
mod hf_bpe;
mod json;
mod json_bpe;
mod pretokenize;
mod spm;
mod stream;
mod vocab;
mod wordpiece;

pub use pretokenize::PreTokenizer;
pub use stream::{StreamDecoder, Utf8Buffer};
pub use vocab::{SpecialTokens, TokenType, Vocab};

use crate::error::{Error, Result};
use crate::gguf::{Array, GgufFile};

/// The tokenization algorithm of a vocabulary.
#[derive(Debug, Clone)]
enum Model {
    Bpe(Box<bpe::Bpe>),
    Spm {
        add_space_prefix: bool,
    },
    WordPiece(Box<json::BertPipeline>),
    /// A BPE `tokenizer.json`, with the `tokenizers` library's pipeline.
    HfBpe(Box<hf::Pipeline>),
}

/// A tokenizer: encodes text to token ids and decodes ids to text.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    /// The longest input the file says to truncate to (`tokenizer.json`'s `truncation`).
    truncation: Option<usize>,
}

/// A piece of input after special tokens are cut out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata, or, for a
    /// file with no `tokenizer.ggml.model` that holds a whole Hugging Face `tokenizer.json` in
    /// `tokenizer.huggingface.json` (as GGUF's specification allows, and as weft's
    /// [conversion](crate::checkpoint) of a safetensors checkpoint writes), the tokenizer that
    /// file describes, with the special ids the file's `tokenizer.ggml.*_token_id` name.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        if file.get("tokenizer.ggml.model").is_none() {
            if let Some(json) = file.opt_str("tokenizer.huggingface.json")? {
                let mut tok = Tokenizer::from_json(json)?;
                tok.fill_special_ids(file)?;
                return Ok(tok);
            }
        }
        let vocab = Vocab::from_gguf(file)?;
        let model = match file.get_str("tokenizer.ggml.model")? {
            "gpt2" => {
                let merges = match file.get_array("tokenizer.ggml.merges")? {
                    Array::String(m) => m,
                    a => {
                        return Err(Error::BadTokenizer {
                            reason: format!(
                                "tokenizer.ggml.merges holds {} values, expected strings",
                                a.element_type_name()
                            ),
                        })
                    }
                };
                let pre_name = file.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
                let pre = PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| {
                    Error::UnsupportedTokenizer {
                        model: format!("gpt2 with pre-tokenizer {pre_name:?}"),
                    }
                })?;
                Model::Bpe(Box::new(bpe::Bpe::new(merges, pre)))
            }
            "llama" => Model::Spm {
                add_space_prefix: file
                    .opt_bool("tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(true),
            },
            other => {
                return Err(Error::UnsupportedTokenizer {
                    model: other.to_string(),
                })
            }
        };
        Ok(Tokenizer {
            vocab,
            model,
            truncation: None,
        })
    }

    /// Builds the tokenizer a Hugging Face `tokenizer.json` describes: a `WordPiece` (BERT) or
    /// `BPE` model with the normalizers, pre-tokenizers and decoders these use; anything else
    /// is [`Error::UnsupportedTokenizer`]. Added tokens marked special are control tokens, the
    /// others user-defined; encoding with `add_special` wraps the text as the file's
    /// post-processor does (e.g. Gemma's BOS).
    ///
    /// ```no_run
    /// use weft_core::tokenizer::Tokenizer;
    /// let tok = Tokenizer::from_json(&std::fs::read_to_string("tokenizer.json")?)?;
    /// let ids = tok.encode("Hello world!", true, true);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Tokenizer> {
        json::from_json(text)
    }

    /// Fills in the special token ids this tokenizer lacks (a `tokenizer.json` names no EOS,
    /// and names BOS only when its post-processor adds it) from a GGUF file's
    /// `tokenizer.ggml.{bos,eos,unknown,padding}_token_id`, where the file's token at that id
    /// has the same text as ours. A filled-in EOS also ends generations. Whether BOS and EOS
    /// are added when encoding is left as the tokenizer says.
    pub fn fill_special_from_gguf(&mut self, file: &GgufFile) -> Result<()> {
        let texts = match file.get("tokenizer.ggml.tokens") {
            Some(_) => match file.get_array("tokenizer.ggml.tokens")? {
                Array::String(t) => t,
                _ => return Ok(()),
            },
            None => return Ok(()),
        };
        let pick = |key: &str| -> Result<Option<u32>> {
            Ok(file.opt_u64(key)?.and_then(|id| {
                let text = texts.get(usize::try_from(id).ok()?)?;
                let id = u32::try_from(id).ok()?;
                (self.vocab.text(id) == Some(text.as_str())).then_some(id)
            }))
        };
        let (bos, eos, unk, pad) = (
            pick("tokenizer.ggml.bos_token_id")?,
            pick("tokenizer.ggml.eos_token_id")?,
            pick("tokenizer.ggml.unknown_token_id")?,
            pick("tokenizer.ggml.padding_token_id")?,
        );
        self.fill_special([bos, eos, unk, pad]);
        Ok(())
    }

    /// The special ids a converted checkpoint's GGUF names (the file has no token texts to
    /// check them against: the conversion took them from the checkpoint of this very
    /// tokenizer), where they are inside the vocabulary.
    fn fill_special_ids(&mut self, file: &GgufFile) -> Result<()> {
        let n = self.vocab.len() as u64;
        let pick = |key: &str| -> Result<Option<u32>> {
            Ok(file.opt_u64(key)?.filter(|&id| id < n).map(|id| id as u32))
        };
        self.fill_special([
            pick("tokenizer.ggml.bos_token_id")?,
            pick("tokenizer.ggml.eos_token_id")?,
            pick("tokenizer.ggml.unknown_token_id")?,
            pick("tokenizer.ggml.padding_token_id")?,
        ]);
        Ok(())
    }

    /// Sets the special ids (BOS, EOS, unknown, padding) the tokenizer lacks; a new EOS also
    /// ends generations.
    fn fill_special(&mut self, [bos, eos, unk, pad]: [Option<u32>; 4]) {
        let special = &mut self.vocab.special;
        for (slot, found) in [
            (&mut special.bos, bos),
            (&mut special.unk, unk),
            (&mut special.pad, pad),
        ] {
            if slot.is_none() {
                *slot = found;
            }
        }
        if special.eos.is_none() {
            special.eos = eos;
            if let Some(eos) = eos.filter(|e| !self.vocab.eog.contains(e)) {
                self.vocab.eog.insert(0, eos);
            }
        }
    }

    /// The length the tokenizer's file says inputs are truncated to, if it says one.
    pub fn truncation(&self) -> Option<usize> {
        self.truncation
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Encodes `text`.
    ///
    /// - `add_special`: add BOS (and EOS) as the model's file asks (`add_bos_token`).
    /// - `parse_special`: turn control-token text such as `<|im_start|>` into its token. When
    ///   off, such text is tokenized as plain text. User-defined tokens are always matched,
    ///   except those llama.cpp makes control by their text (Gemma 3's `</s>`; see `vocab.rs`).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let special = &self.vocab.special;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && special.add_bos {
            out.extend(special.bos);
        }
        if let Model::HfBpe(pipeline) = &self.model {
            pipeline.encode(&self.vocab, text, parse_special, &mut out);
            if add_special && special.add_eos {
                out.extend(special.eos);
            }
            return out;
        }
        let mut prev_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    match &self.model {
                        Model::Bpe(bpe) => bpe.encode(&self.vocab, t, &mut out),
                        Model::Spm { add_space_prefix } => {
                            let prefix = if *add_space_prefix && prev_special {
                                " "
                            } else {
                                ""
                            };
                            let escaped = spm::escape_spaces(&format!("{prefix}{t}"));
                            spm::encode(&self.vocab, &escaped, &mut out);
                        }
                        Model::WordPiece(bert) => bert.encode(t, &mut out),
                        Model::HfBpe(_) => {}
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && special.add_eos {
            out.extend(special.eos);
        }
        out
    }

    /// Cuts special tokens out of `text`, longest token first, as llama.cpp's
    /// `tokenizer_st_partition` does.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut fragments = vec![Fragment::Text(text)];
        if text.is_empty() {
            return Vec::new();
        }
        for &id in &self.vocab.specials_by_length {
            let ty = self.vocab.types[id as usize];
            if !parse_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
                continue;
            }
            let needle = self.vocab.texts[id as usize].as_str();
            if !fragments
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Appends the bytes of token `id` to `out`. Control tokens are rendered as their text
    /// only when `render_special` is set.
    pub fn append_piece(&self, id: u32, render_special: bool, out: &mut Vec<u8>) -> Result<()> {
        let (Some(text), Some(ty)) = (self.vocab.text(id), self.vocab.token_type(id)) else {
            return Err(Error::TokenOutOfRange {
                id,
                vocab_size: self.vocab.len(),
            });
        };
        match ty {
            TokenType::Control if render_special => out.extend_from_slice(text.as_bytes()),
            TokenType::Control | TokenType::Unused => {}
            TokenType::UserDefined => out.extend_from_slice(text.as_bytes()),
            TokenType::Normal => match &self.model {
                Model::Bpe(bpe) => bpe.bytes.decode_into(text, out),
                Model::Spm { .. } => {
                    out.extend_from_slice(text.replace(spm::SPACE, " ").as_bytes())
                }
                // A word-continuing piece joins the previous one; others start a new word.
                Model::WordPiece(bert) => match text.strip_prefix(&bert.continuing_prefix) {
                    Some(rest) => out.extend_from_slice(rest.as_bytes()),
                    None => {
                        out.push(b' ');
                        out.extend_from_slice(text.as_bytes());
                    }
                },
                Model::HfBpe(p) => p.decoding.append(&p.bytes, text, out),
            },
            TokenType::Byte => match &self.model {
                Model::Spm { .. } => out.push(parse_byte_token(text).unwrap_or(b'?')),
                Model::Bpe(bpe) => bpe.bytes.decode_into(text, out),
                Model::WordPiece(_) => out.extend_from_slice(text.as_bytes()),
                Model::HfBpe(p) => p.decoding.append(&p.bytes, text, out),
            },
            TokenType::Unknown => match &self.model {
                Model::Spm { .. } => out.extend_from_slice("\u{2585}".as_bytes()),
                Model::WordPiece(_) => out.extend_from_slice(text.as_bytes()),
                Model::HfBpe(p) => p.decoding.append(&p.bytes, text, out),
                Model::Bpe(_) if render_special => out.extend_from_slice(text.as_bytes()),
                Model::Bpe(_) => {}
            },
        }
        Ok(())
    }

    /// The text of one token (lossy for a token that is part of a multi-byte character).
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        self.append_piece(id, render_special, &mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Decodes ids to text, as llama.cpp's detokenizer with special tokens rendered: a leading
    /// BOS (and trailing EOS) that encoding would have added is dropped, every other control
    /// token appears as its text, and invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, true)
    }

    /// [`decode`](Tokenizer::decode), with control tokens rendered as their text or, when
    /// `render_special` is false, left out (transformers' `skip_special_tokens`).
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> Result<String> {
        let special = &self.vocab.special;
        let mut ids = ids;
        if special.add_bos && special.bos.is_some() && ids.first() == special.bos.as_ref() {
            ids = &ids[1..];
        }
        if special.add_eos && special.eos.is_some() && ids.last() == special.eos.as_ref() {
            ids = &ids[..ids.len() - 1];
        }
        let mut bytes = Vec::new();
        for &id in ids {
            self.append_piece(id, render_special, &mut bytes)?;
        }
        // The leading space the encoder would have added, or the decoder's `Strip`.
        let strip = match &self.model {
            Model::Spm {
                add_space_prefix: true,
            }
            | Model::WordPiece(_) => Some((' ', 1)),
            Model::HfBpe(p) => p.decoding.strip_start,
            _ => None,
        };
        if let Some((c, n)) = strip {
            let mut buf = [0u8; 4];
            let c = c.encode_utf8(&mut buf).as_bytes();
            let mut start = 0;
            while start / c.len() < n && bytes[start..].starts_with(c) {
                start += c.len();
            }
            bytes.drain(..start);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A decoder that turns ids into text deltas one token at a time, never splitting a
    /// UTF-8 character. Control tokens are rendered when `render_special` is set.
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, render_special)
    }
}

/// `<0x0A>` → 0x0A.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}
