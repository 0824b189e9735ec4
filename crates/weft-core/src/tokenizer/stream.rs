//! Incremental detokenization: text deltas that never split a UTF-8 character.

use super::Tokenizer;
use crate::error::Result;

/// Turns a stream of token ids into text deltas.
///
/// One character may span several tokens (byte-fallback tokens, or byte-level BPE pieces of
/// an emoji). The decoder holds back an incomplete trailing sequence until the token that
/// completes it arrives; a byte sequence that can never become valid UTF-8 is emitted as U+FFFD.
///
/// ```no_run
/// # fn demo(tok: &weft_core::tokenizer::Tokenizer, ids: &[u32]) -> weft_core::Result<()> {
/// let mut stream = tok.stream_decoder(false);
/// for &id in ids {
///     print!("{}", stream.push(id)?);
/// }
/// print!("{}", stream.finish());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    bytes: Utf8Buffer,
    render_special: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(crate) fn new(tokenizer: &'t Tokenizer, render_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            bytes: Utf8Buffer::default(),
            render_special,
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.tokenizer
            .append_piece(id, self.render_special, self.bytes.pending_mut())?;
        Ok(self.bytes.take_complete())
    }

    /// Ends the stream: whatever is held back is emitted, invalid bytes as U+FFFD.
    pub fn finish(&mut self) -> String {
        self.bytes.finish()
    }
}

/// The byte half of [`StreamDecoder`], owning no tokenizer: bytes go in (appended to
/// [`Utf8Buffer::pending_mut`]), complete UTF-8 text comes out, an incomplete trailing
/// character waits for the bytes that complete it, and bytes that can never be valid become
/// U+FFFD.
///
/// ```
/// let mut b = weft_core::tokenizer::Utf8Buffer::default();
/// b.pending_mut().extend_from_slice(&[b'a', 0xC3]);
/// assert_eq!(b.take_complete(), "a");
/// b.pending_mut().push(0xA9);
/// assert_eq!(b.take_complete(), "é");
/// ```
#[derive(Debug, Clone, Default)]
pub struct Utf8Buffer {
    pending: Vec<u8>,
}

impl Utf8Buffer {
    /// The bytes not yet emitted; append new bytes here.
    pub fn pending_mut(&mut self) -> &mut Vec<u8> {
        &mut self.pending
    }

    /// Emits whatever is held back, invalid bytes as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// The text that is complete so far; an incomplete trailing character stays pending.
    pub fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is the prefix from_utf8 just checked, so this cannot fail.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes: replace them and go on.
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &after[n..];
                        }
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }
}
