//! `POST /v1/chat/completions`: messages rendered with the model's chat template, tools,
//! streaming and not.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State as Extract;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::body::Body;
use crate::error::ApiError;
use crate::generate::{Event, Finish, Job};
use crate::params::{GenParams, MAX_TOP_LOGPROBS};
use crate::respond::{self, chat_logprob, usage, Chunker, Gathered, Meta};
use crate::state::{unix_time, State};
use crate::text::TokenLogprob;
use crate::tools::{may_be_call, partial_calls, tag_start, CallDelta, CallStream, ToolCall, Tools};

/// The handler.
pub async fn handle(
    Extract(state): Extract<Arc<State>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let engine = state.engine()?.clone();
    let body = Body::read(body)?;
    let asked = body.get::<String>("model", "a string")?;
    let adapter = state.check_model(asked.as_deref())?;
    let mut params = GenParams::parse(&body, engine.info().vocab_size, 1)?;
    params.adapter = adapter;
    let logprobs = body.flag("logprobs")?;
    let top = body.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::param(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs': true.",
        ));
    }
    params.logprobs = logprobs.then_some(top.unwrap_or(0) as usize);
    let tools = Tools::parse(&body)?;
    let forced = tools.as_ref().is_some_and(Tools::forced);
    if let Some(t) = tools.as_ref().filter(|t| t.forced()) {
        if params.schema.is_some() {
            return Err(ApiError::param(
                "tool_choice",
                "A forced tool call cannot be combined with 'response_format', 'grammar' or 'regex'.",
            ));
        }
        params.schema = Some(weft::Schema::JsonSchema(t.schema()?));
        // A forced answer is calls, not text: a stop string would cut its arguments into
        // JSON that does not parse, reported as a finished call. The constraint ends it.
        params.stop.clear();
    }
    let prompt = render(&engine, &body, tools.as_ref())?;
    respond::check_length("messages", prompt.len(), &params, engine.n_ctx())?;
    respond::check_schema(&engine, params.schema.as_ref(), forced)?;
    if let Some(t) = tools.as_ref().filter(|t| !t.forced()) {
        // Under `auto` nothing constrains the calls, but a tool schema that does not compile
        // is a 400 as it is when a call is forced.
        let calls = weft::Schema::JsonSchema(t.schema()?);
        respond::check_schema(&engine, Some(&calls), true)?;
    }
    let id = state.new_id("chatcmpl");
    let job = Job {
        prompts: vec![prompt],
        seed: params.seed.unwrap_or_else(|| state.random()),
        params: params.clone(),
        arrived,
        score_prompt: None,
        added_bos: Vec::new(),
    };
    let prompt_tokens = job.prompts[0].len();
    let rx = respond::start(&state, &engine, job, &id).await?;
    let meta = Meta {
        id,
        created: unix_time(),
        model: state.reported_model(asked),
    };
    if params.stream {
        let forced = tools.as_ref().is_some_and(Tools::forced);
        // A forced answer is calls, never content: `null`, as OpenAI sends before calls. Under
        // `auto` the answer may be either, so the first delta names the role only (a client
        // that gathers the deltas then has `content` null for calls, text for text).
        let delta = match (&tools, forced) {
            (_, true) => json!({"role": "assistant", "content": null}),
            (Some(_), false) => json!({"role": "assistant"}),
            (None, _) => json!({"role": "assistant", "content": ""}),
        };
        let first = (0..params.n)
            .map(|i| {
                meta.chunk(
                    json!([{"index": i, "delta": delta,
                "logprobs": null, "finish_reason": null}]),
                    params.include_usage,
                )
            })
            .collect();
        let chunker = ChatChunker {
            choices: (0..params.n)
                .map(|_| Streamed {
                    calls: forced.then(|| (CallStream::default(), Vec::new())),
                    ..Streamed::default()
                })
                .collect(),
            tools,
            meta,
            include_usage: params.include_usage,
            prompt_tokens,
            completion_tokens: 0,
        };
        Ok(respond::sse(first, rx, chunker, params.n).into_response())
    } else {
        let logprobs = params.logprobs.is_some();
        collect(rx, params.n, tools.as_ref(), &meta, prompt_tokens, logprobs).await
    }
}

impl Meta {
    fn chunk(&self, choices: Value, include_usage: bool) -> Value {
        let mut v = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": null, "choices": choices,
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

/// Renders the conversation to prompt tokens.
fn render(engine: &weft::Engine, body: &Body, tools: Option<&Tools>) -> Result<Vec<u32>, ApiError> {
    let template = engine
        .chat_template()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let native = tools.is_some() && template.supports_tools();
    let mut messages = messages(body, !native)?;
    if let (Some(t), false) = (tools, native) {
        let text = t.instruction();
        match messages.first_mut() {
            Some(m) if m["role"] == "system" => {
                let content = m["content"].as_str().unwrap_or_default().to_string();
                m["content"] = Value::String(format!("{content}\n\n{text}"));
            }
            _ => messages.insert(0, json!({"role": "system", "content": text})),
        }
    }
    let tools_json = tools.filter(|_| native).map(Tools::as_json);
    let text = template
        .render_json(&messages, tools_json.as_deref(), true)
        .map_err(|e| ApiError::param("messages", e.to_string()))?;
    Ok(engine.tokenize(&text))
}

/// The messages as the template reads them: `content` always a string. Without native tool
/// support, tool calls and results are written as text in the built-in format.
fn messages(body: &Body, fold_tools: bool) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::param("messages", m);
    let list = match body.raw("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("'messages' must not be empty.".into())),
        None => return Err(bad("'messages' is required.".into())),
        Some(_) => return Err(bad("'messages' must be a list of messages.".into())),
    };
    let mut out: Vec<Value> = Vec::with_capacity(list.len());
    let mut folded_tool_last = false;
    for (i, m) in list.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| bad(format!("messages[{i}] must be an object.")))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("messages[{i}] needs a 'role' string.")))?;
        let role = match role {
            "developer" => "system",
            "system" | "user" | "assistant" | "tool" => role,
            _ => return Err(bad(format!("messages[{i}] has an unknown role '{role}'."))),
        };
        // No calls at all: absent, null or (as some clients send) an empty list.
        let tool_calls = obj
            .get("tool_calls")
            .filter(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" && tool_calls.is_some() => {
                String::new()
            }
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => s.push_str(t),
                        _ => {
                            return Err(bad(format!(
                                "messages[{i}].content: only text parts are supported."
                            )))
                        }
                    }
                }
                s
            }
            _ => return Err(bad(format!("messages[{i}] needs a 'content' string."))),
        };
        let mut msg = json!({"role": role, "content": content});
        if let Some(calls) = tool_calls {
            let calls = calls
                .as_array()
                .ok_or_else(|| bad(format!("messages[{i}].tool_calls must be a list.")))?;
            for (k, c) in calls.iter().enumerate() {
                if !c.get("function").is_some_and(Value::is_object) {
                    return Err(bad(format!(
                        "messages[{i}].tool_calls[{k}] needs a 'function' object."
                    )));
                }
            }
            if fold_tools {
                let listed: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        let f = &c["function"];
                        // JSON text (as OpenAI sends them) is read; an object is taken as it
                        // is, and text that is not JSON is kept as text: nothing is dropped.
                        let args = match &f["arguments"] {
                            Value::Null => json!({}),
                            Value::String(a) => serde_json::from_str::<Value>(a)
                                .unwrap_or_else(|_| Value::String(a.clone())),
                            v => v.clone(),
                        };
                        json!({"name": f["name"], "arguments": args})
                    })
                    .collect();
                let text = format!("{content}<tool_call>{}</tool_call>", Value::from(listed));
                msg["content"] = Value::String(text);
            } else {
                // Templates write arguments with `tojson`: give them objects, not JSON text.
                let mut calls = calls.clone();
                for c in &mut calls {
                    let args = &mut c["function"]["arguments"];
                    if let Some(parsed) = args.as_str().and_then(|a| serde_json::from_str(a).ok()) {
                        *args = parsed;
                    }
                }
                msg["tool_calls"] = Value::Array(calls);
            }
        }
        if role == "tool" {
            if fold_tools {
                let response = format!("<tool_response>\n{content}\n</tool_response>");
                // The results of one turn's parallel calls go back as one user turn (two user
                // turns in a row break templates that check roles alternate, as Gemma's).
                if folded_tool_last {
                    if let Some(Value::String(prev)) = out
                        .last_mut()
                        .and_then(|m: &mut Value| m.get_mut("content"))
                    {
                        prev.push('\n');
                        prev.push_str(&response);
                        continue;
                    }
                }
                msg = json!({"role": "user", "content": response});
            } else if let Some(id) = obj.get("tool_call_id") {
                msg["tool_call_id"] = id.clone();
            }
        }
        folded_tool_last = fold_tools && role == "tool";
        out.push(msg);
    }
    Ok(out)
}

/// The `tool_calls` list of a message or delta.
fn calls_json(calls: &[ToolCall], ids: &[String], with_index: bool) -> Value {
    calls
        .iter()
        .zip(ids)
        .enumerate()
        .map(|(i, (c, id))| {
            let mut v = json!({"id": id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}});
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

fn call_ids(n: usize) -> Vec<String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    (0..n)
        .map(|_| {
            format!(
                "call_{:016x}",
                NEXT.fetch_add(1, Ordering::Relaxed) ^ unix_time().rotate_left(40)
            )
        })
        .collect()
}

/// A non-streaming answer: every event gathered into one response.
async fn collect(
    rx: mpsc::Receiver<Event>,
    n: usize,
    tools: Option<&Tools>,
    meta: &Meta,
    prompt_tokens: usize,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let Gathered {
        text,
        logprobs: lps,
        finish,
        completion_tokens: completion,
    } = respond::gather(rx, vec![String::new(); n]).await?;
    let choices: Vec<Value> = (0..n)
        .map(|i| {
            // Asked for, an answer without tokens has an empty list (OpenAI's), not `null`.
            let logprobs = match want_logprobs {
                true => logprobs_content(&lps[i]),
                false => Value::Null,
            };
            let call = tools.and_then(|t| t.answer(&text[i]));
            // A forced answer cut short is still calls, with the arguments written so far
            // (as streamed), not the calls' JSON as content.
            let cut = tools
                .filter(|t| t.forced() && call.is_none())
                .map(|_| partial_calls(&text[i]));
            let (message, reason) = match (call, cut) {
                (Some((content, calls)), _) => {
                    let ids = call_ids(calls.len());
                    let content = Some(content).filter(|c| !c.is_empty());
                    (
                        json!({"role": "assistant", "content": content,
                            "tool_calls": calls_json(&calls, &ids, false)}),
                        "tool_calls",
                    )
                }
                // Cut before any call's arguments began: nothing (a stream sends nothing).
                (None, Some(calls)) if calls.is_empty() => (
                    json!({"role": "assistant", "content": null}),
                    finish[i].as_str(),
                ),
                (None, Some(calls)) => {
                    let ids = call_ids(calls.len());
                    (
                        json!({"role": "assistant", "content": null,
                            "tool_calls": calls_json(&calls, &ids, false)}),
                        finish[i].as_str(),
                    )
                }
                (None, None) => (
                    json!({"role": "assistant", "content": text[i]}),
                    finish[i].as_str(),
                ),
            };
            json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason})
        })
        .collect();
    Ok(Json(json!({
        "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
        "system_fingerprint": null, "choices": choices, "usage": usage(prompt_tokens, completion),
    }))
    .into_response())
}

/// How a streamed choice's text is being shown.
#[derive(Debug, Default)]
struct Streamed {
    /// Text (and its log-probabilities) held back because it may be a tool call, or the
    /// start of a `<tool_call>` tag after content.
    held: String,
    held_logprobs: Vec<TokenLogprob>,
    /// The text is plain content: stream it as it comes, up to a tag.
    content: bool,
    /// A forced call, followed as it is generated; the ids of its calls.
    calls: Option<(CallStream, Vec<String>)>,
}

struct ChatChunker {
    choices: Vec<Streamed>,
    tools: Option<Tools>,
    meta: Meta,
    include_usage: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl ChatChunker {
    fn delta(&self, i: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        self.meta.chunk(
            json!([{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]),
            self.include_usage,
        )
    }

    fn content(&self, i: usize, text: String, lps: &[TokenLogprob]) -> Value {
        self.delta(i, json!({"content": text}), logprobs_json(lps), None)
    }
}

/// A chunk's `logprobs`: `null` when it carries no token's.
fn logprobs_json(lps: &[TokenLogprob]) -> Value {
    match lps.is_empty() {
        true => Value::Null,
        false => logprobs_content(lps),
    }
}

/// `{"content": [...]}`: the tokens' entries in chat's shape.
fn logprobs_content(lps: &[TokenLogprob]) -> Value {
    json!({"content": lps.iter().map(chat_logprob).collect::<Vec<_>>()})
}

impl Chunker for ChatChunker {
    fn event(&mut self, e: Event) -> Vec<Value> {
        match e {
            Event::Delta { choice: i, delta } => {
                if self.tools.is_none() {
                    return vec![self.content(i, delta.text, &delta.logprobs)];
                }
                let c = &mut self.choices[i];
                if let Some((calls, ids)) = &mut c.calls {
                    // A forced call: its name and arguments as they are generated, the
                    // tokens' log-probabilities with the next chunk that goes out.
                    c.held_logprobs.extend(delta.logprobs);
                    let pieces = calls.push(&delta.text);
                    let mut out = Vec::new();
                    for p in pieces {
                        let v = match p {
                            CallDelta::Start { index, name } => {
                                ids.extend(call_ids(1));
                                json!({"tool_calls": [{"index": index, "id": ids[index],
                                    "type": "function", "function": {"name": name, "arguments": ""}}]})
                            }
                            CallDelta::Arguments { index, text } => json!({"tool_calls": [
                                {"index": index, "function": {"arguments": text}}]}),
                        };
                        out.push(v);
                    }
                    let mut lps = if out.is_empty() {
                        Vec::new()
                    } else {
                        std::mem::take(&mut c.held_logprobs)
                    };
                    return out
                        .into_iter()
                        .map(|d| self.delta(i, d, logprobs_json(&std::mem::take(&mut lps)), None))
                        .collect();
                }
                c.held.push_str(&delta.text);
                c.held_logprobs.extend(delta.logprobs);
                if !c.content {
                    if may_be_call(&c.held) {
                        return Vec::new();
                    }
                    c.content = true;
                }
                // Content, up to a `<tool_call>` tag: calls may follow text (which is then
                // their content), so what may begin a tag waits, and from a tag on the rest
                // is held until the end shows whether it is calls.
                let (send, tag) = match tag_start(&c.held) {
                    Ok(k) => (k, true),
                    Err(k) => (k, false),
                };
                let rest = c.held.split_off(send);
                let text = std::mem::replace(&mut c.held, rest);
                c.content = !tag;
                if text.is_empty() {
                    return Vec::new();
                }
                let lps = std::mem::take(&mut c.held_logprobs);
                vec![self.content(i, text, &lps)]
            }
            Event::Finish {
                choice: i,
                finish,
                tokens,
            } => {
                self.completion_tokens += tokens;
                let mut lps = std::mem::take(&mut self.choices[i].held_logprobs);
                if let Some((calls, _)) = &self.choices[i].calls {
                    let reason = if finish == Finish::Stop && calls.calls() > 0 {
                        "tool_calls"
                    } else {
                        finish.as_str()
                    };
                    return vec![self.delta(i, json!({}), logprobs_json(&lps), Some(reason))];
                }
                let mut out = Vec::new();
                let held = std::mem::take(&mut self.choices[i].held);
                let call = self.tools.as_ref().and_then(|t| t.parse_output(&held));
                match call {
                    Some(calls) => {
                        let ids = call_ids(calls.len());
                        for (k, (c, id)) in calls.iter().zip(&ids).enumerate() {
                            // The call's header, then its arguments as a delta to append.
                            let head = json!({"tool_calls": [{"index": k, "id": id, "type": "function",
                                "function": {"name": c.name, "arguments": ""}}]});
                            // The answer's log-probabilities with the first call.
                            let lps = logprobs_json(&std::mem::take(&mut lps));
                            out.push(self.delta(i, head, lps, None));
                            let args = json!({"tool_calls": [{"index": k,
                                "function": {"arguments": c.arguments}}]});
                            out.push(self.delta(i, args, Value::Null, None));
                        }
                        out.push(self.delta(i, json!({}), Value::Null, Some("tool_calls")));
                    }
                    None => {
                        if !held.is_empty() {
                            out.push(self.content(i, held, &lps));
                        }
                        out.push(self.delta(i, json!({}), Value::Null, Some(finish.as_str())));
                    }
                }
                out
            }
            Event::Failed(e) => vec![e.body_json()],
        }
    }

    fn end(&mut self) -> Vec<Value> {
        if !self.include_usage {
            return Vec::new();
        }
        let mut v = self.meta.chunk(json!([]), true);
        v["usage"] = usage(self.prompt_tokens, self.completion_tokens);
        vec![v]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_results_of_one_turn_make_one_user_turn() {
        let body = Body::parse(
            json!({"messages": [
                {"role": "user", "content": "Paris and Rome?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "sunny"},
                {"role": "tool", "tool_call_id": "b", "content": "rainy"},
                {"role": "user", "content": "Thanks"}]})
            .to_string()
            .as_bytes(),
        )
        .expect("body");
        let folded = messages(&body, true).expect("messages");
        let roles: Vec<&str> = folded.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "user", "user"]);
        assert_eq!(
            folded[2]["content"],
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response>"
        );
        // A template that reads tool messages gets each, with its call's id.
        let native = messages(&body, false).expect("messages");
        assert_eq!(native.len(), 5);
        assert_eq!(native[3]["tool_call_id"], "b");
    }

    fn with_calls(calls: Value) -> Body {
        Body::parse(
            json!({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "tool_calls": calls},
                {"role": "user", "content": "go"}]})
            .to_string()
            .as_bytes(),
        )
        .expect("body")
    }

    #[test]
    fn malformed_tool_calls_are_a_400_and_an_empty_list_is_none() {
        for calls in [json!(["oops"]), json!([{"function": "x"}]), json!([{}])] {
            for fold in [true, false] {
                let e = messages(&with_calls(calls.clone()), fold).unwrap_err();
                assert_eq!(e.status.as_u16(), 400, "{calls}");
                assert!(
                    e.message.contains("tool_calls[0]"),
                    "{calls}: {}",
                    e.message
                );
            }
        }
        for fold in [true, false] {
            let m = messages(&with_calls(json!([])), fold).expect("messages");
            assert_eq!(m[1], json!({"role": "assistant", "content": "hello"}));
        }
    }
}
