//! Tool calling: the `tools` a request lists go into the prompt (through the chat template's
//! `tools` variable, or a built-in instruction where the template has none), and the
//! model's answer is parsed back into `tool_calls`.
//!
//! The format of a call is `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`
//! (SmolLM2's and Hermes' format; several calls in one list). With `tool_choice` `required`
//! or a named function, the output is *constrained* to a JSON list of calls whose names are
//! listed tools and whose arguments match each tool's JSON Schema, so it always parses.

use serde_json::{json, Map, Value};

use crate::body::Body;
use crate::error::ApiError;

/// Most calls in one answer when parallel calls are allowed (a bound keeps a sampling
/// model from listing calls until it runs out of tokens).
const MAX_PARALLEL_CALLS: usize = 8;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tools of a request and how they may be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: Choice,
    pub parallel: bool,
}

/// A call parsed from the model's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl Tools {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tool may be
    /// called (no tools, or `tool_choice: "none"`).
    pub fn parse(body: &Body) -> Result<Option<Tools>, ApiError> {
        let list = match body.raw("tools") {
            None => Vec::new(),
            Some(Value::Array(a)) => a.iter().map(tool).collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(ApiError::param("tools", "'tools' must be a list of tools.")),
        };
        let choice = match body.raw("tool_choice") {
            None if list.is_empty() => Choice::None,
            None => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => Choice::None,
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                _ => {
                    return Err(ApiError::param(
                        "tool_choice",
                        "'tool_choice' must be 'none', 'auto', 'required' or a function.",
                    ))
                }
            },
            Some(v) => Choice::Named(
                v.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::param(
                            "tool_choice",
                            "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                        )
                    })?
                    .to_string(),
            ),
        };
        if let Some((i, t)) = list
            .iter()
            .enumerate()
            .find(|(i, t)| list[..*i].iter().any(|u| u.name == t.name))
        {
            return Err(ApiError::param(
                "tools",
                format!("tools[{i}] is named '{}', as an earlier tool is.", t.name),
            ));
        }
        let parallel = body
            .get::<bool>("parallel_tool_calls", "a boolean")?
            .unwrap_or(true);
        match &choice {
            Choice::None => return Ok(None),
            Choice::Required | Choice::Named(_) if list.is_empty() => {
                return Err(ApiError::param(
                    "tool_choice",
                    "'tool_choice' asks for a tool call but 'tools' is empty.",
                ))
            }
            Choice::Named(n) if !list.iter().any(|t| &t.name == n) => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("'tool_choice' names '{n}', which is not in 'tools'."),
                ))
            }
            _ => {}
        }
        if list.is_empty() {
            return Ok(None);
        }
        Ok(Some(Tools {
            tools: list,
            choice,
            parallel,
        }))
    }

    /// Whether the answer must be a call (and is constrained to one).
    pub fn forced(&self) -> bool {
        matches!(self.choice, Choice::Required | Choice::Named(_))
    }

    /// The tools in OpenAI's shape, for a template's `tools` variable.
    pub fn as_json(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect()
    }

    /// The built-in instruction listing the tools, for templates without tool support.
    pub fn instruction(&self) -> String {
        let mut s = String::from(
            "You have access to the following tools. To call one or more of them, answer with \
             only a list of calls in this format:\n<tool_call>[{\"name\": \"tool name\", \
             \"arguments\": {\"argument\": \"value\"}}]</tool_call>\n\nTools:\n",
        );
        for t in &self.tools {
            let line =
                json!({"name": t.name, "description": t.description, "parameters": t.parameters});
            s.push_str(&line.to_string());
            s.push('\n');
        }
        s
    }

    /// The JSON Schema a forced answer is constrained to: a list of calls of the allowed
    /// tools, each with arguments valid under that tool's parameters. Each tool's `$defs`
    /// (and `definitions`) move to the root, where its `#/$defs/...` references point; two
    /// tools defining one name differently are a 400.
    pub fn schema(&self) -> Result<Value, ApiError> {
        let mut defs: Map<String, Value> = Map::new();
        let mut calls = Vec::new();
        let allowed = self.tools.iter().filter(|t| match &self.choice {
            Choice::Named(n) => &t.name == n,
            _ => true,
        });
        for t in allowed {
            let mut params = t.parameters.clone();
            for key in ["$defs", "definitions"] {
                let Some(Value::Object(d)) = params.as_object_mut().and_then(|p| p.remove(key))
                else {
                    continue;
                };
                let root = defs
                    .entry(key.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                let Value::Object(root) = root else { continue };
                for (name, def) in d {
                    if root.get(&name).is_some_and(|old| old != &def) {
                        return Err(ApiError::param(
                            "tools",
                            format!("Two tools define '{key}/{name}' differently."),
                        ));
                    }
                    root.insert(name, def);
                }
            }
            // The arguments hold the function's parameters and nothing else, unless its
            // schema says otherwise: a function has no use for keys it does not declare, and
            // a small model asked for `city` also wrote `"type"` and `"properties"` keys,
            // copying the schema it was shown.
            if let Some(p) = params.as_object_mut() {
                let is_object = p.get("type").and_then(Value::as_str) == Some("object")
                    || p.contains_key("properties");
                if is_object && !p.contains_key("additionalProperties") {
                    p.insert("additionalProperties".into(), Value::Bool(false));
                }
            }
            calls.push(json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            }));
        }
        // A named function is one call of it (as OpenAI answers `tool_choice: {"function":
        // ...}`): repeating the same call would only repeat it.
        let one = !self.parallel || matches!(self.choice, Choice::Named(_));
        let max = if one { 1 } else { MAX_PARALLEL_CALLS };
        let mut schema =
            json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1, "maxItems": max});
        for (k, v) in defs {
            schema[k] = v;
        }
        Ok(schema)
    }

    /// The content and the calls of an answer that makes calls: the whole answer as calls
    /// ([`Tools::parse_output`], no content), or text followed by `<tool_call>` blocks (the
    /// text before the first block is the content, as vLLM's Hermes parser and llama-server
    /// answer). `None`: the answer is plain content.
    pub fn answer(&self, text: &str) -> Option<(String, Vec<ToolCall>)> {
        if let Some(calls) = self.parse_output(text) {
            return Some((String::new(), calls));
        }
        let k = text.find(TAG).filter(|&k| k > 0)?;
        let calls = self.parse_output(&text[k..])?;
        Some((text[..k].to_string(), calls))
    }

    /// The calls in a model's answer, if the whole answer is calls: a JSON list of calls
    /// (what a forced answer is) or a call object, or one or more `<tool_call>…</tool_call>`
    /// blocks holding them. Calls must name listed tools; with `parallel_tool_calls: false`
    /// only the first is kept (as vLLM does).
    pub fn parse_output(&self, text: &str) -> Option<Vec<ToolCall>> {
        let t = text.trim();
        let mut items = Vec::new();
        if t.starts_with(TAG) {
            let mut rest = t;
            while let Some(after) = rest.trim_start().strip_prefix(TAG) {
                let end = after.find(END_TAG).unwrap_or(after.len());
                items.extend(json_calls(&after[..end])?);
                rest = after.get(end + END_TAG.len()..).unwrap_or("");
            }
            if !rest.trim().is_empty() {
                return None;
            }
        } else {
            items = json_calls(t)?;
        }
        let mut calls = Vec::with_capacity(items.len());
        for (item, raw) in items {
            let name = item.get("name")?.as_str()?;
            if !self.tools.iter().any(|t| t.name == name) {
                return None;
            }
            let args = item.get("arguments").cloned().unwrap_or_else(|| json!({}));
            calls.push(ToolCall {
                name: name.to_string(),
                arguments: raw
                    .filter(|r| serde_json::from_str::<Value>(r).ok() == Some(args.clone()))
                    .unwrap_or_else(|| args.to_string()),
            });
        }
        if !self.parallel {
            calls.truncate(1);
        }
        (!calls.is_empty()).then_some(calls)
    }
}

/// Where a content stream must pause: the start of a `<tool_call>` tag in `text` (`Ok`), or
/// else the start of a tail that may begin one (`Err`; `text.len()` when none can).
pub fn tag_start(text: &str) -> Result<usize, usize> {
    if let Some(k) = text.find(TAG) {
        return Ok(k);
    }
    // TAG is ASCII and starts with '<', so the tail starts on a character boundary.
    let tail = (1..TAG.len())
        .rev()
        .find(|&n| text.ends_with(&TAG[..n]))
        .unwrap_or(0);
    Err(text.len() - tail)
}

/// The calls a forced answer cut short (by `max_tokens`) had begun: each with its name and
/// the arguments text written so far, as a stream of it would have sent them.
pub fn partial_calls(text: &str) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for d in CallStream::default().push(text) {
        match d {
            CallDelta::Start { name, .. } => calls.push(ToolCall {
                name,
                arguments: String::new(),
            }),
            CallDelta::Arguments { index, text } => {
                if let Some(c) = calls.get_mut(index) {
                    c.arguments.push_str(&text);
                }
            }
        }
    }
    calls
}

const TAG: &str = "<tool_call>";
const END_TAG: &str = "</tool_call>";

/// Whether a streamed answer that starts with `text` may still turn out to be calls (the
/// same rule as [`Tools::parse_output`]: calls are the whole answer, a tagged block or a
/// JSON call or list of calls). A JSON answer is held back only while it can still be a call:
/// an object whose first key is `name` or `arguments`, or a list of such objects; any other
/// JSON (`{"answer": 4}`) streams as content as soon as its first key shows it.
pub fn may_be_call(text: &str) -> bool {
    let t = text.trim_start();
    if t.is_empty() || TAG.starts_with(t) || t.starts_with(TAG) {
        return true;
    }
    let t = match t.strip_prefix('[') {
        Some(rest) => rest.trim_start(),
        None => t,
    };
    let Some(rest) = t.strip_prefix('{') else {
        return t.is_empty();
    };
    let rest = rest.trim_start();
    ["\"name\"", "\"arguments\""]
        .iter()
        .any(|key| key.starts_with(rest) || rest.starts_with(key))
}

/// The call objects of a JSON list or object.
/// The calls of a JSON call or list of calls, each with its arguments' text as the model
/// wrote it when the calls are a list (the form a forced answer takes, whose arguments a
/// stream sends as they are written: the same text whether streamed or not).
fn json_calls(s: &str) -> Option<Vec<(Value, Option<String>)>> {
    match serde_json::from_str(s.trim()).ok()? {
        Value::Array(a) => {
            let raw = partial_calls(s);
            let raw: Vec<Option<String>> = if raw.len() == a.len() {
                raw.into_iter().map(|c| Some(c.arguments)).collect()
            } else {
                vec![None; a.len()]
            };
            Some(a.into_iter().zip(raw).collect())
        }
        v @ Value::Object(_) => Some(vec![(v, None)]),
        _ => None,
    }
}

/// One entry of `tools`.
fn tool(v: &Value) -> Result<Tool, ApiError> {
    let bad = |m: &str| ApiError::param("tools", m.to_string());
    if v.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("Each tool must have \"type\": \"function\"."));
    }
    let f = v
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("Each tool needs a 'function' object."))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| {
            !n.is_empty()
                && n.len() <= 64
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .ok_or_else(|| {
            bad("Each function needs a 'name' of 1 to 64 letters, digits, '_' or '-'.")
        })?;
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("A function's 'description' must be a string.")),
    };
    let parameters = match f.get("parameters") {
        // No parameters: the arguments are `{}` (an open object let a forced call's
        // arguments run on with keys the model made up).
        None | Some(Value::Null) => {
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        }
        // Arguments are an object (clients parse them into one): a schema of anything else
        // is refused, as OpenAI refuses it.
        Some(Value::Object(p)) if !may_be_object(p.get("type")) => {
            return Err(bad(
                "A function's 'parameters' must be the JSON Schema of an object (\"type\": \"object\").",
            ))
        }
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(bad(
                "A function's 'parameters' must be a JSON Schema object.",
            ))
        }
    };
    Ok(Tool {
        name: name.to_string(),
        description,
        parameters,
    })
}

/// Whether a schema's `type` allows an object: none given, `"object"`, or a list with it.
fn may_be_object(ty: Option<&Value>) -> bool {
    match ty {
        None => true,
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        Some(t) => t == "object",
    }
}

/// A piece of a streamed tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallDelta {
    /// Call `index` begins: its name is known.
    Start { index: usize, name: String },
    /// More of call `index`'s arguments text.
    Arguments { index: usize, text: String },
}

/// Follows a forced answer (a JSON list of `{"name": ..., "arguments": {...}}` objects, name
/// first, as the constraint's schema orders them) as it is generated, so that each call's
/// name is sent as soon as its arguments begin and the arguments as they grow. Only JSON
/// structure outside strings is tracked: depth 1 is the list, 2 a call, 3 and deeper its
/// arguments.
#[derive(Debug, Default)]
pub struct CallStream {
    text: String,
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    calls: usize,
    call_start: usize,
    /// Where the current call's arguments start, and how much of them was sent.
    args: Option<(usize, usize)>,
}

impl CallStream {
    /// Takes the next piece of the answer; returns what became known.
    pub fn push(&mut self, piece: &str) -> Vec<CallDelta> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        let mut i = self.scanned;
        while i < self.text.len() {
            let c = self.text.as_bytes()[i];
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
            } else {
                match c {
                    b'"' => self.in_string = true,
                    b'[' | b'{' => {
                        self.depth += 1;
                        if self.depth == 2 {
                            self.call_start = i;
                        } else if self.depth == 3 && self.args.is_none() {
                            // The arguments begin: the header before them holds the name.
                            let head = format!("{}null}}", &self.text[self.call_start..i]);
                            let name = serde_json::from_str::<Value>(&head)
                                .ok()
                                .and_then(|v| v.get("name")?.as_str().map(str::to_string))
                                .unwrap_or_default();
                            out.push(CallDelta::Start {
                                index: self.calls,
                                name,
                            });
                            self.args = Some((i, i));
                        }
                    }
                    b']' | b'}' => {
                        if self.depth == 3 {
                            if let Some((_, sent)) = self.args {
                                out.extend(self.args_delta(sent, i + 1));
                                self.args = None;
                                self.calls += 1;
                            }
                        }
                        self.depth = self.depth.saturating_sub(1);
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        self.scanned = self.text.len();
        if let Some((_, sent)) = self.args {
            let end = self.text.len();
            out.extend(self.args_delta(sent, end));
        }
        out
    }

    /// How many calls were completed.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Arguments text `sent..end` of the current call, and marks it sent.
    fn args_delta(&mut self, sent: usize, end: usize) -> Option<CallDelta> {
        let (start, _) = self.args?;
        self.args = Some((start, end));
        (end > sent).then(|| CallDelta::Arguments {
            index: self.calls,
            text: self.text[sent..end].to_string(),
        })
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
