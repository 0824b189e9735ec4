//! Constrained generation: a [`Constraint`] says which tokens may come next; the generator
//! ANDs the masks of all its constraints and the engine applies the result before sampling.
//!
//! Built-in constraints compile a [`Schema`] (JSON Schema, any JSON, a regular expression, a
//! Lark or GBNF grammar) with llguidance over weft's own tokenizer; see [`compile`].

mod llg;
mod mask;

pub use llg::{compile, GrammarConstraint};
pub use mask::TokenMask;

use crate::error::Result;

/// A rule over the generated tokens: which token may come next, and when the output is
/// complete.
///
/// Both methods receive every token accepted so far in this generation (not the prompt), so
/// a constraint may be written without state; stateful ones (parsers) can keep their own and
/// advance by the new tail (after speculative decoding rewinds, the slice can also be shorter
/// than last time).
pub trait Constraint: Send {
    /// The tokens allowed after `accepted`, as a mask over the vocabulary (`vocab_size`
    /// entries).
    fn allowed(&mut self, accepted: &[u32], vocab_size: usize) -> Result<TokenMask>;

    /// Whether `accepted` completes the constraint: generation then stops.
    fn is_terminal(&mut self, accepted: &[u32]) -> Result<bool>;
}

/// A description of the output that llguidance compiles into a [`Constraint`].
#[derive(Debug, Clone, PartialEq)]
pub enum Schema {
    /// A JSON document valid under this JSON Schema, printed on one line (`", "`, `": "`;
    /// the schema's `x-guidance` options override). An integer the schema leaves unbounded stays
    /// within ±(2^53 - 1), the integers a double holds exactly (16 digits; llama.cpp's schema
    /// grammars allow 16 digits too).
    JsonSchema(serde_json::Value),
    /// Any JSON value.
    AnyJson,
    /// Text matching this regular expression (whole output).
    Regex(String),
    /// A context-free grammar in llguidance's Lark syntax (start rule `start`).
    Lark(String),
    /// A context-free grammar in llama.cpp's GBNF syntax (start rule `root`).
    Gbnf(String),
}
