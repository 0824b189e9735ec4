//! llguidance-backed constraints: a [`Schema`] compiled into an Earley parser over weft's own
//! tokenizer.
//!
//! The token trie (every token's exact bytes; control, unknown and unused tokens and the stop
//! tokens behind llguidance's `0xFF` special-token marker so no grammar produces them as
//! text) and llguidance's `ParserFactory` are built once per engine, on the first
//! [`compile`]. Tokenization is not treated as canonical: the mask allows every token that
//! keeps the output inside the grammar, and nothing is forced.

mod gbnf;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{
    SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv, INVALID_TOKEN,
};
use llguidance::{Matcher, ParserFactory};
use weft_core::tokenizer::{TokenType, Tokenizer};

use super::{Constraint, Schema, TokenMask};
use crate::engine::Engine;
use crate::error::{Error, Result};

/// `kind` of the errors about generated tokens (as opposed to the schema itself).
const OUTPUT: &str = "constrained output";

/// A constraint compiled from a [`Schema`] by [`compile`]: an llguidance parser that follows
/// the accepted tokens (rolling back when they are rewound) and masks the next token.
///
/// The mask allows the model's stop tokens (EOS, end of turn) exactly when the output so far
/// is complete; [`Constraint::is_terminal`] is true once the grammar admits no continuation
/// (or a stop token was accepted).
pub struct GrammarConstraint {
    matcher: Matcher,
    /// The matcher before any token, to replay from when a rollback is refused.
    initial: Matcher,
    /// Accepted tokens followed so far.
    tokens: Vec<u32>,
    /// How many of `tokens` the matcher consumed; the rest are stop tokens after it stopped.
    fed: usize,
    /// The mask of the current state, while no token was consumed or rolled back.
    mask: Option<SimpleVob>,
    stop_tokens: Arc<[u32]>,
    /// Ids below this are in both the tokenizer and the model.
    n_tokens: usize,
    engine: Engine,
}

impl std::fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarConstraint")
            .field("tokens", &self.tokens.len())
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint for GrammarConstraint {
    fn allowed(&mut self, accepted: &[u32], vocab_size: usize) -> Result<TokenMask> {
        self.sync(accepted)?;
        let mask = match self.mask.take() {
            Some(m) => m,
            None => self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| grammar_error(OUTPUT, e))?,
        };
        let out = TokenMask::from_u32_words(mask.as_slice(), vocab_size);
        self.mask = Some(mask);
        Ok(out)
    }

    fn is_terminal(&mut self, accepted: &[u32]) -> Result<bool> {
        self.sync(accepted)?;
        match self.matcher.get_error() {
            Some(e) => Err(grammar_error(OUTPUT, e)),
            None => Ok(self.matcher.is_stopped()),
        }
    }
}

impl GrammarConstraint {
    /// Brings the matcher to `accepted`: rolls back past the first difference, then consumes
    /// the new tail.
    fn sync(&mut self, accepted: &[u32]) -> Result<()> {
        let common = self
            .tokens
            .iter()
            .zip(accepted)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.tokens.len() {
            self.rewind(common)?;
        }
        for (i, &t) in accepted.iter().enumerate().skip(common) {
            self.push(i, t)?;
        }
        Ok(())
    }

    /// Forgets every token from index `n` on.
    fn rewind(&mut self, n: usize) -> Result<()> {
        self.mask = None;
        if n < self.fed {
            if self.matcher.rollback(self.fed - n).is_err() {
                // Grammars with token limits (and a matcher in error) refuse rollback: replay.
                self.matcher = self.initial.clone();
                if let Err(e) = self.matcher.consume_tokens(&self.tokens[..n]) {
                    self.matcher = self.initial.clone();
                    self.tokens.clear();
                    self.fed = 0;
                    return Err(grammar_error(OUTPUT, e));
                }
            }
            self.fed = n;
        }
        self.tokens.truncate(n);
        Ok(())
    }

    /// Consumes token `t`, the `i`-th of the output.
    fn push(&mut self, i: usize, t: u32) -> Result<()> {
        let is_stop = self.stop_tokens.contains(&t);
        if self.matcher.is_stopped() && is_stop {
            self.tokens.push(t);
            return Ok(());
        }
        let ok = (t as usize) < self.n_tokens
            && !self.matcher.is_stopped()
            && self
                .matcher
                .try_consume_tokens(&[t])
                .map_err(|e| grammar_error(OUTPUT, e))?
                == 1;
        if !ok {
            let piece = self
                .engine
                .tokenizer()
                .token_to_piece(t, true)
                .unwrap_or_default();
            return Err(Error::Grammar {
                kind: OUTPUT,
                message: format!(
                    "token {t} ({piece:?}) at output position {i} does not fit the grammar"
                ),
            });
        }
        self.mask = None;
        self.tokens.push(t);
        self.fed += 1;
        Ok(())
    }
}

/// Compiles `schema` for `engine`'s tokenizer.
///
/// The grammar covers exactly the generated text (from the first token after the prompt), so
/// e.g. no whitespace is allowed before a JSON value. JSON is generated on one line with `", "`
/// and `": "` separators; an `"x-guidance"` object in the schema (llguidance's
/// `JsonCompileOptions`, e.g. `{"whitespace_flexible": true}`) overrides that. Regular
/// expressions must match the whole output; Lark grammars use llguidance's dialect (special
/// tokens can be written `<|im_end|>`), GBNF grammars are translated to it.
///
/// Errors in the schema or grammar are [`Error::Grammar`] with kind `"JSON schema"`,
/// `"regular expression"`, `"Lark grammar"` or `"GBNF grammar"`, raised here (the parser
/// and its first mask are built before returning). The first call on an engine also builds the
/// token trie over the vocabulary.
pub fn compile(engine: &Engine, schema: &Schema) -> Result<GrammarConstraint> {
    let factory = factory(engine)?;
    let (kind, grammar) = match schema {
        Schema::JsonSchema(v) => ("JSON schema", TopLevelGrammar::from_json_schema(json(v))),
        Schema::AnyJson => (
            "JSON schema",
            TopLevelGrammar::from_json_schema(json(&serde_json::json!({}))),
        ),
        Schema::Regex(rx) => ("regular expression", TopLevelGrammar::from_regex(rx)),
        Schema::Lark(g) => ("Lark grammar", TopLevelGrammar::from_lark(g.clone())),
        Schema::Gbnf(g) => {
            let lark = gbnf::to_lark(g).map_err(|message| Error::Grammar {
                kind: "GBNF grammar",
                message,
            })?;
            ("GBNF grammar", TopLevelGrammar::from_lark(lark))
        }
    };
    let parser = factory.create_parser(grammar).map_err(|e| {
        let message = e.to_string();
        // A regex is compiled as the Lark rule `start: /.../`: its position means nothing.
        match (kind, message.strip_prefix("at 1(8): ")) {
            ("regular expression", Some(m)) => grammar_error(kind, m),
            _ => grammar_error(kind, message),
        }
    })?;
    let mut matcher = Matcher::new(Ok(parser));
    let initial = matcher.clone();
    let mask = matcher
        .compute_mask_or_eos()
        .map_err(|e| first_mask_error(kind, e))?;
    Ok(GrammarConstraint {
        matcher,
        initial,
        tokens: Vec::new(),
        fed: 0,
        mask: Some(mask),
        stop_tokens: engine.stop_tokens().into(),
        n_tokens: engine
            .tokenizer()
            .vocab_size()
            .min(engine.info().vocab_size),
        engine: engine.clone(),
    })
}

/// The JSON schema with weft's defaults for llguidance's JSON options (one line, `", "` and
/// `": "`) under any `x-guidance` options the schema sets itself, and integers capped at 16
/// digits where the schema leaves them unbounded (see [`cap_integers`]).
fn json(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    cap_integers(&mut schema);
    if let Some(obj) = schema.as_object_mut() {
        let opts = obj
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(opts) = opts.as_object_mut() {
            for (k, v) in [
                ("whitespace_flexible", serde_json::json!(false)),
                ("item_separator", serde_json::json!(", ")),
                ("key_separator", serde_json::json!(": ")),
            ] {
                opts.entry(k).or_insert(v);
            }
        }
    }
    schema
}

/// The largest magnitude of an integer the schema leaves unbounded: 2^53 - 1, JavaScript's
/// `Number.MAX_SAFE_INTEGER` (16 digits; llama.cpp's schema grammars allow 16 digits too).
/// Without a cap a sampled number can run on until `max_tokens` cuts the JSON short (seen at
/// temperature 1: ages of 60 digits), and past 2^53 JSON readers that hold numbers as doubles
/// lose digits (so does llguidance, which reads bounds as `f64`: 10^16 - 1 would become 10^16).
const INTEGER_CAP: i64 = (1 << 53) - 1;

/// Gives every integer subschema the bounds it lacks, `minimum: -INTEGER_CAP` and
/// `maximum: INTEGER_CAP`, unless the bound it has lies beyond the cap (then the schema means
/// larger numbers and keeps them). Values under `const`, `enum`, `default` and `examples` are data,
/// not schemas, and stay as they are.
fn cap_integers(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Array(items) => items.iter_mut().for_each(cap_integers),
        Value::Object(obj) => {
            let integer = match obj.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            if integer {
                let bound = |keys: [&str; 2]| {
                    keys.iter()
                        .filter_map(|k| obj.get(*k).and_then(Value::as_f64))
                        .reduce(f64::max)
                };
                let cap = INTEGER_CAP as f64;
                let (low, high) = (
                    bound(["minimum", "exclusiveMinimum"]),
                    bound(["maximum", "exclusiveMaximum"]),
                );
                if low.is_none() && high.is_none_or(|h| h >= -cap) {
                    obj.insert("minimum".into(), (-INTEGER_CAP).into());
                }
                if high.is_none() && low.is_none_or(|l| l <= cap) {
                    obj.insert("maximum".into(), INTEGER_CAP.into());
                }
            }
            for (key, value) in obj.iter_mut() {
                if !matches!(key.as_str(), "const" | "enum" | "default" | "examples") {
                    cap_integers(value);
                }
            }
        }
        _ => {}
    }
}

/// The error of the first mask of a compiled grammar: llguidance's message is its first line
/// (a dump of the parser's state follows it); `NoExtensionBias` there means that no token can
/// start an output the grammar accepts, not even an end of text.
fn first_mask_error(kind: &'static str, e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default().trim();
    let message = match first {
        "NoExtensionBias" => "no text matches it (not even an empty output): check for a rule \
             that never ends, a reference to itself, or a set that excludes everything"
            .to_string(),
        _ => first.to_string(),
    };
    Error::Grammar { kind, message }
}

fn grammar_error(kind: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Grammar {
        kind,
        message: e.to_string(),
    }
}

/// The engine's parser factory, built on first use (once, even when many contexts compile
/// their first constraints at the same time).
fn factory(engine: &Engine) -> Result<Arc<ParserFactory>> {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let cell = &engine.inner.llg;
    if let Some(f) = cell.get() {
        return Ok(f.clone());
    }
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = cell.get() {
        return Ok(f.clone());
    }
    let env: TokEnv = Arc::new(WeftTokEnv {
        trie: token_trie(
            engine.tokenizer(),
            engine.info().vocab_size,
            engine.stop_tokens(),
        ),
    });
    let mut f = ParserFactory::new_simple(&env).map_err(|e| grammar_error("token trie", e))?;
    f.quiet();
    let f = Arc::new(f);
    Ok(cell.get_or_init(|| f).clone())
}

/// The token trie: `vocab_size` entries (the model's), each token's exact bytes; control,
/// unknown and unused tokens and the stop tokens as `0xFF` + their text (special); ids past
/// the tokenizer empty (never allowed).
fn token_trie(tok: &Tokenizer, vocab_size: usize, stop: &[u32]) -> TokTrie {
    let vocab = tok.vocab();
    let words: Vec<Vec<u8>> = (0..vocab_size as u32)
        .map(|id| {
            let (Some(ty), Some(text)) = (vocab.token_type(id), vocab.text(id)) else {
                return Vec::new();
            };
            let special = stop.contains(&id)
                || matches!(
                    ty,
                    TokenType::Control | TokenType::Unknown | TokenType::Unused
                );
            let mut w = Vec::with_capacity(text.len() + 1);
            if special {
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(text.as_bytes());
            } else if tok.append_piece(id, false, &mut w).is_err() {
                w.clear();
            }
            w
        })
        .collect();
    let n = vocab_size as u32;
    let special = vocab.special();
    let valid = |t: Option<u32>| t.filter(|&t| t < n);
    let stop: Vec<TokenId> = stop.iter().copied().filter(|&t| t < n).collect();
    let info = TokRxInfo {
        vocab_size: n,
        tok_eos: valid(special.eos)
            .or(stop.first().copied())
            .unwrap_or(INVALID_TOKEN),
        tok_bos: valid(special.bos),
        tok_pad: valid(special.pad),
        tok_unk: valid(special.unk),
        tok_end_of_turn: None,
    };
    let trie = TokTrie::from(&info, &words);
    if stop.is_empty() {
        trie
    } else {
        trie.with_eos_tokens(&stop)
    }
}

/// llguidance's view of weft's tokenizer: the trie, tokenized greedily (not canonical, so
/// llguidance never forces a tokenization of its own).
struct WeftTokEnv {
    trie: TokTrie,
}

impl TokenizerEnv for WeftTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llguidance::toktrie::ApproximateTokEnv;

    /// A matcher over a one-byte-per-token vocabulary (EOS is the last token).
    fn matcher(lark: &str) -> std::result::Result<(Matcher, TokEnv), String> {
        let env = ApproximateTokEnv::single_byte_env();
        let f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        let p = f
            .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| e.to_string())?;
        let mut m = Matcher::new(Ok(p));
        m.compute_mask().map_err(|e| e.to_string())?;
        Ok((m, env))
    }

    /// Whether the GBNF grammar accepts exactly `text` (and can end there).
    fn gbnf_accepts(gbnf: &str, text: &str) -> bool {
        let lark = gbnf::to_lark(gbnf).unwrap_or_else(|e| panic!("{gbnf}: {e}"));
        let (mut m, env) = matcher(&lark).unwrap_or_else(|e| panic!("{lark}: {e}"));
        let mut toks = env.tok_trie().greedy_tokenize(text.as_bytes());
        toks.push(env.tok_trie().eos_token());
        m.validate_tokens(&toks).unwrap_or(0) == toks.len()
    }

    #[test]
    fn gbnf_translation_accepts_what_gbnf_accepts() {
        let g = r#"root ::= "a"+ "b""#;
        assert!(gbnf_accepts(g, "ab") && gbnf_accepts(g, "aaab"));
        assert!(!gbnf_accepts(g, "b") && !gbnf_accepts(g, "aba"));

        // Literals that are prefixes of each other are matched byte by byte, as GBNF does.
        let g = "root ::= (\"a\" | \"ab\") \"bc\"   # comment\n";
        assert!(gbnf_accepts(g, "abc") && gbnf_accepts(g, "abbc"));

        let g = r#"
root   ::= greeting ws Name-Part{1,2} "!"?
greeting ::= "hi" | "hello"
ws ::= [ \t]+
Name-Part ::= [A-Z] [a-z]* ( "-" | )
"#;
        assert!(gbnf_accepts(g, "hi Bob"));
        assert!(gbnf_accepts(g, "hello \tAnn-Lee!"));
        assert!(!gbnf_accepts(g, "hi bob"));

        let g = r#"root ::= [^"\\\x00-\x1F]{2,3} "\u00e9" . "\n""#;
        assert!(gbnf_accepts(g, "ab\u{e9}x\n"));
        assert!(gbnf_accepts(g, "ab\u{e9}\n\n"));
        assert!(!gbnf_accepts(g, "a\"b\u{e9}x\n"));
        assert!(!gbnf_accepts(g, "a\u{e9}x\n"));
    }

    /// Whether the JSON schema (with weft's options) accepts exactly `text`.
    fn json_accepts(schema: serde_json::Value, text: &str) -> bool {
        let env = ApproximateTokEnv::single_byte_env();
        let f = ParserFactory::new_simple(&env).expect("factory");
        let p = f
            .create_parser(TopLevelGrammar::from_json_schema(json(&schema)))
            .unwrap_or_else(|e| panic!("{schema}: {e}"));
        let mut m = Matcher::new(Ok(p));
        let mut toks = env.tok_trie().greedy_tokenize(text.as_bytes());
        toks.push(env.tok_trie().eos_token());
        m.validate_tokens(&toks).unwrap_or(0) == toks.len()
    }

    #[test]
    fn unbounded_integers_stop_at_max_safe_integer() {
        use serde_json::json;
        let int = json!({"type": "integer"});
        assert!(json_accepts(int.clone(), "9007199254740991"));
        assert!(json_accepts(int.clone(), "-9007199254740991"));
        assert!(json_accepts(int.clone(), "0"));
        assert!(!json_accepts(int.clone(), "9007199254740992"));
        assert!(!json_accepts(int.clone(), "10000000000000000"));
        assert!(!json_accepts(int, "-9007199254740992"));

        // Nested, and beside a type list; a property named like a keyword is still a schema.
        let person = json!({"type": "object", "properties": {
            "age": {"type": ["integer", "null"]},
            "type": {"type": "array", "items": {"type": "integer"}}},
            "required": ["age", "type"]});
        assert!(json_accepts(
            person.clone(),
            r#"{"age": 42, "type": [1, 2]}"#
        ));
        assert!(!json_accepts(
            person.clone(),
            r#"{"age": 12345678901234567, "type": []}"#
        ));
        assert!(!json_accepts(
            person,
            r#"{"age": 1, "type": [12345678901234567]}"#
        ));

        // The schema's own bounds win: beyond the cap, or on one side only.
        let big = json!({"type": "integer", "minimum": 100000000000000000_i64});
        assert!(json_accepts(big, "123456789012345678"));
        let natural = json!({"type": "integer", "minimum": 0});
        assert!(json_accepts(natural.clone(), "9007199254740991"));
        assert!(!json_accepts(natural.clone(), "9007199254740992"));
        assert!(!json_accepts(natural, "-1"));
        let below = json!({"type": "integer", "exclusiveMaximum": -5});
        assert!(json_accepts(below.clone(), "-9007199254740991"));
        assert!(!json_accepts(below, "-9007199254740992"));

        // Data is not rewritten: a `const` object with a "type" key stays what it says.
        let data = json!({"const": {"type": "integer"}});
        assert!(json_accepts(data, r#"{"type": "integer"}"#));
        // Numbers (not integers) keep llguidance's grammar.
        assert!(json_accepts(
            json!({"type": "number"}),
            "123456789012345678.5"
        ));
    }

    #[test]
    fn gbnf_token_references() {
        // The one-byte vocabulary has special tokens 256 `<|tool|>` … 261 `<|end|>` (EOS).
        let accepts = |gbnf: &str, toks: &[u32]| {
            let lark = gbnf::to_lark(gbnf).unwrap_or_else(|e| panic!("{gbnf}: {e}"));
            let (mut m, _) = matcher(&lark).unwrap_or_else(|e| panic!("{lark}: {e}"));
            let toks = [toks, &[261]].concat();
            m.validate_tokens(&toks).unwrap_or(0) == toks.len()
        };
        assert!(accepts(r#"root ::= "a" <|tool|>"#, &[97, 256]));
        assert!(accepts(r#"root ::= "a" <[256]>"#, &[97, 256]));
        assert!(!accepts(r#"root ::= "a" <[256]>"#, &[97, 98]));
        assert!(accepts(r#"root ::= "a" !<[256]>"#, &[97, 98]));
        assert!(!accepts(r#"root ::= "a" !<[256]>"#, &[97, 256]));
        assert!(gbnf::to_lark(r#"root ::= !<|tool|>"#).is_err());
    }

    #[test]
    fn gbnf_errors() {
        for bad in [
            "root ::= \"a",
            "root ::= [a-",
            "root = \"a\"",
            "root ::= (\"a\"",
            "root ::= \"\\q\"",
            "",
        ] {
            assert!(gbnf::to_lark(bad).is_err(), "{bad:?} should not translate");
        }
        let lark = gbnf::to_lark("root ::= undefined-rule").unwrap_or_default();
        assert!(matcher(&lark).is_err());
    }
}
