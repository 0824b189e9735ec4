//! [`Rewindable`]: "go back to n tokens" as a trait (seed 004), so speculative decoding, tree
//! search or backtracking code can be written once for anything that keeps a token history.

use crate::context::Context;
use crate::error::Result;

/// A token history that can be cut back to an earlier length: a [`Context`] (its KV pages
/// past the cut go back to the pool), or a caller's own type (a draft model's state, a
/// mock in a test).
///
/// ```no_run
/// use weft::{Rewindable, Result};
///
/// /// Runs `attempt`; if it fails, puts the history back where it was.
/// fn try_or_rewind<R: Rewindable>(
///     r: &mut R,
///     attempt: impl FnOnce(&mut R) -> Result<bool>,
/// ) -> Result<bool> {
///     let mark = r.len();
///     let ok = attempt(r)?;
///     if !ok {
///         r.truncate(mark)?;
///     }
///     Ok(ok)
/// }
///
/// # fn main() -> Result<()> {
/// let engine = weft::Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("The answer is")?;
/// weft::block_on(ctx.flush_logits())?;
/// try_or_rewind(&mut ctx, |c| {
///     weft::block_on(c.prefill(&engine.tokenize(" maybe")))?;
///     Ok(false) // rejected: `ctx` is back to "The answer is"
/// })?;
/// # Ok(()) }
/// ```
pub trait Rewindable {
    /// Tokens in the history (for a [`Context`]: tokens already run).
    fn len(&self) -> usize;

    /// Whether the history is empty (for a [`Context`], as [`Context::is_empty`]: nothing run
    /// or filled).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the first `n` tokens and drops the rest; `n` past the end is an error.
    fn truncate(&mut self, n: usize) -> Result<()>;
}

impl Rewindable for Context {
    fn len(&self) -> usize {
        Context::len(self)
    }

    fn is_empty(&self) -> bool {
        Context::is_empty(self)
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        Context::truncate(self, n)
    }
}
