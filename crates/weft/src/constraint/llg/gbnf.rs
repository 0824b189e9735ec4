//! llama.cpp's GBNF syntax translated to llguidance's Lark dialect, following llama.cpp's
//! `grammar-parser` (rules `name ::= ...` ending at a newline outside parentheses; literals,
//! character classes, `.`, groups, `* + ? {m} {m,} {m,n} {,n}`, `#` comments, token
//! references `<name>`, `<[id]>` and `!<[id]>`).
//!
//! GBNF is a character-level grammar while Lark's terminals are lexed greedily, so every
//! literal is split into one terminal per character: `("a" | "ab") "bc"` then accepts `abc`
//! as GBNF does. Rule names are mapped injectively to lowercase Lark rule names (`Foo-bar`
//! → `g__foo-bar`) and `start: g_root` is added.

use std::fmt::Write;

/// Translates a GBNF grammar (start rule `root`) to Lark (start rule `start`).
pub(super) fn to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser {
        s: src.as_bytes(),
        src,
        pos: 0,
        refs: Vec::new(),
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    loop {
        p.space(true);
        if p.pos >= p.s.len() {
            break;
        }
        let (name, body) = p.rule()?;
        match rules.iter_mut().find(|(n, _)| *n == name) {
            Some(r) => r.1 = body,
            None => rules.push((name, body)),
        }
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err("the grammar has no `root` rule".into());
    }
    if let Some(r) = p.refs.iter().find(|r| !rules.iter().any(|(n, _)| n == *r)) {
        return Err(format!("undefined rule `{r}`"));
    }
    let mut out = format!("start: {}\n", lark_name("root"));
    for (name, body) in &rules {
        let _ = writeln!(out, "{}: {body}", lark_name(name));
    }
    Ok(out)
}

/// `Foo-bar` → `g__foo-bar`: lowercase letters, digits and `-` kept, an uppercase letter
/// becomes `_` and its lowercase (GBNF names have no `_`, so the map is injective).
fn lark_name(name: &str) -> String {
    let mut out = String::from("g_");
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// A Lark string literal for one character (JSON escapes; control characters as `\u00XX`).
fn lark_char(c: char) -> String {
    match c {
        '"' => "\"\\\"\"".into(),
        '\\' => "\"\\\\\"".into(),
        c if (c as u32) < 0x20 || c == '\x7f' => format!("\"\\u{:04x}\"", c as u32),
        c => format!("\"{c}\""),
    }
}

/// Lark's way to write the empty sequence.
const EMPTY: &str = "\"\"";

struct Parser<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
    /// Every rule name referenced.
    refs: Vec<String>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn err(&self, what: &str) -> String {
        let line = self.src[..self.pos.min(self.src.len())]
            .matches('\n')
            .count()
            + 1;
        let rest: String = self
            .src
            .get(self.pos..)
            .unwrap_or("")
            .chars()
            .take(20)
            .collect();
        if rest.is_empty() {
            format!("{what} at the end of the grammar")
        } else {
            format!("{what} at line {line}, before {rest:?}")
        }
    }

    /// Skips blanks and comments (and newlines when `newlines`).
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\n' | b'\r')) {
                        self.pos += 1;
                    }
                }
                b' ' | b'\t' => self.pos += 1,
                b'\n' | b'\r' if newlines => self.pos += 1,
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-')
        {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err("expected a rule name"));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn rule(&mut self) -> Result<(String, String), String> {
        let name = self.name()?;
        self.space(false);
        if !self.s[self.pos..].starts_with(b"::=") {
            return Err(self.err("expected `::=`"));
        }
        self.pos += 3;
        self.space(true);
        let body = self.alternates(false)?;
        match self.peek() {
            None | Some(b'\n' | b'\r') => Ok((name, body)),
            Some(_) => Err(self.err("expected a newline or the end")),
        }
    }

    fn alternates(&mut self, nested: bool) -> Result<String, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, String> {
        // Each item with whether it already carries a repetition.
        let mut items: Vec<(String, bool)> = Vec::new();
        while let Some(c) = self.peek() {
            let item = match c {
                b'"' => {
                    self.pos += 1;
                    let mut chars = Vec::new();
                    while self.peek() != Some(b'"') {
                        if self.peek().is_none() {
                            return Err(self.err("unterminated string literal"));
                        }
                        chars.push(lark_char(self.char()?));
                    }
                    self.pos += 1;
                    match chars.len() {
                        0 => EMPTY.to_string(),
                        1 => chars.remove(0),
                        _ => format!("({})", chars.join(" ")),
                    }
                }
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                b'(' => {
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternates(true)?;
                    if self.peek() != Some(b')') {
                        return Err(self.err("expected `)`"));
                    }
                    self.pos += 1;
                    format!("({inner})")
                }
                b'<' => {
                    let start = self.pos;
                    while !matches!(self.peek(), None | Some(b'>' | b'\n')) {
                        self.pos += 1;
                    }
                    if self.peek() != Some(b'>') {
                        return Err(self.err("unterminated token reference"));
                    }
                    self.pos += 1;
                    self.src[start..self.pos].to_string()
                }
                b'!' if self.s[self.pos..].starts_with(b"!<[") => {
                    let start = self.pos + 3;
                    let Some(len) = self.src[start..].find("]>") else {
                        return Err(self.err("unterminated token reference"));
                    };
                    self.pos = start + len + 2;
                    format!("<[^{}]>", &self.src[start..start + len])
                }
                b'!' => return Err(self.err("only token ids can be negated (`!<[id]>`)")),
                b'*' | b'+' | b'?' | b'{' => {
                    let Some((last, repeated)) = items.pop() else {
                        return Err(self.err("a repetition without an item before it"));
                    };
                    let op = if c == b'{' {
                        self.braces()?
                    } else {
                        self.pos += 1;
                        (c as char).to_string()
                    };
                    let item = match (op.as_str(), repeated) {
                        ("", _) => EMPTY.to_string(),
                        (_, true) => format!("({last}){op}"),
                        _ => format!("{last}{op}"),
                    };
                    self.space(nested);
                    items.push((item, true));
                    continue;
                }
                c if c.is_ascii_alphanumeric() || c == b'-' => {
                    let name = self.name()?;
                    let lark = lark_name(&name);
                    self.refs.push(name);
                    lark
                }
                _ => break,
            };
            self.space(nested);
            items.push((item, false));
        }
        Ok(if items.is_empty() {
            EMPTY.to_string()
        } else {
            items
                .into_iter()
                .map(|(s, _)| s)
                .collect::<Vec<_>>()
                .join(" ")
        })
    }

    /// `{m}`, `{m,}`, `{m,n}`, `{,n}` → the Lark suffix (`""` for zero repetitions).
    fn braces(&mut self) -> Result<String, String> {
        self.pos += 1;
        self.space(true);
        let min = self.int()?.unwrap_or(0);
        self.space(true);
        let max = if self.peek() == Some(b',') {
            self.pos += 1;
            self.space(true);
            let max = self.int()?;
            self.space(true);
            max
        } else {
            Some(min)
        };
        if self.peek() != Some(b'}') {
            return Err(self.err("expected `}`"));
        }
        self.pos += 1;
        Ok(match max {
            Some(0) => String::new(),
            Some(max) if max < min => {
                return Err(self.err(&format!("repetition {{{min},{max}}} has max < min")))
            }
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        })
    }

    /// A repetition count: `None` where no digits are (an open bound), an error where they
    /// do not fit a `u32` (rather than a silently different grammar).
    fn int(&mut self) -> Result<Option<u32>, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits = &self.src[start..self.pos];
        match digits.is_empty() {
            true => Ok(None),
            false => digits
                .parse()
                .map(Some)
                .map_err(|_| self.err(&format!("repetition count {digits} is too large"))),
        }
    }

    /// `[...]` → a Lark regex over one character.
    fn class(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut rx = String::from("/[");
        if self.peek() == Some(b'^') {
            self.pos += 1;
            rx.push('^');
        }
        let mut empty = true;
        while self.peek() != Some(b']') {
            if self.peek().is_none() {
                return Err(self.err("unterminated character class"));
            }
            let lo = self.char()?;
            let _ = write!(rx, "\\x{{{:x}}}", lo as u32);
            if self.peek() == Some(b'-') && self.s.get(self.pos + 1) != Some(&b']') {
                self.pos += 1;
                if self.peek().is_none() {
                    return Err(self.err("unterminated character class"));
                }
                let hi = self.char()?;
                if hi < lo {
                    return Err(self.err("character range out of order"));
                }
                let _ = write!(rx, "-\\x{{{:x}}}", hi as u32);
            }
            empty = false;
        }
        self.pos += 1;
        if empty {
            return Err(self.err("empty character class"));
        }
        rx.push_str("]/");
        Ok(rx)
    }

    /// One character of a literal or class, with GBNF's escapes.
    fn char(&mut self) -> Result<char, String> {
        let rest = &self.src[self.pos..];
        let mut it = rest.chars();
        let c = it.next().ok_or_else(|| self.err("unexpected end"))?;
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let e = it.next().ok_or_else(|| self.err("unexpected end"))?;
        let hex_len = match e {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => {
                let c = match e {
                    't' => '\t',
                    'r' => '\r',
                    'n' => '\n',
                    '\\' | '"' | '[' | ']' => e,
                    _ => return Err(self.err("unknown escape")),
                };
                self.pos += 2;
                return Ok(c);
            }
        };
        let hex = rest.get(2..2 + hex_len).unwrap_or("");
        let c = u32::from_str_radix(hex, 16)
            .ok()
            .filter(|_| hex.len() == hex_len && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(char::from_u32)
            .ok_or_else(|| self.err("bad hex escape"))?;
        self.pos += 2 + hex_len;
        Ok(c)
    }
}
