//! `POST /v1/completions`: raw text completion of one or several prompts (strings or token
//! ids), streaming and not.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State as Extract;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::body::Body;
use crate::error::ApiError;
use crate::generate::{Event, Job};
use crate::params::{GenParams, MAX_N, MAX_TOP_LOGPROBS};
use crate::respond::{self, usage, Chunker, Gathered, Meta};
use crate::state::{unix_time, State};
use crate::text::TokenLogprob;

/// `max_tokens` when a request gives none (OpenAI's default for this endpoint).
const DEFAULT_MAX_TOKENS: usize = 16;

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
    // `best_of` beyond the choices returned would need ranking by log-probability, which
    // this server does not do: refused rather than ignored.
    if let Some(best_of) = body.integer("best_of", 1, MAX_N)? {
        let n = body.integer("n", 1, MAX_N)?.unwrap_or(1);
        if best_of != n {
            return Err(ApiError::param(
                "best_of",
                format!(
                    "'best_of' ({best_of}) other than 'n' ({n}) is not supported by this server."
                ),
            ));
        }
    }
    if body.raw("suffix").is_some() {
        return Err(ApiError::param(
            "suffix",
            "'suffix' (fill-in-the-middle) is not supported by this server.",
        ));
    }
    // `max_tokens` 0 with `echo` and `logprobs` scores a prompt (lm-eval-harness asks so).
    let mut params = GenParams::parse(&body, engine.info().vocab_size, 0)?;
    params.adapter = adapter;
    params.logprobs = body
        .integer("logprobs", 0, MAX_TOP_LOGPROBS)?
        .map(|k| k as usize);
    let echo = body.flag("echo")?;
    let prompts = prompts(&body, &engine)?;
    if prompts.len() * params.n > MAX_N as usize {
        return Err(ApiError::param(
            "n",
            format!(
                "{} prompts × n = {} choices is more than the {MAX_N} a request may ask for.",
                prompts.len(),
                prompts.len() * params.n
            ),
        ));
    }
    for (ids, _) in &prompts {
        if ids.is_empty() {
            return Err(ApiError::param(
                "prompt",
                "A prompt must hold at least one token (this model adds no BOS to an empty string).",
            ));
        }
        respond::check_length("prompt", ids.len(), &params, engine.n_ctx())?;
    }
    // OpenAI's legacy endpoint writes 16 tokens unless asked for more (without a limit, a
    // base model given a short prompt wrote 8,188 tokens, two minutes on 2 cores); chat's
    // answers end at the end of a turn, and there the context is the limit.
    if params.max_tokens.is_none() {
        if params.min_tokens > DEFAULT_MAX_TOKENS {
            return Err(ApiError::param(
                "min_tokens",
                format!(
                    "'min_tokens' ({}) must not exceed 'max_tokens' ({DEFAULT_MAX_TOKENS}, its \
                     default here): set 'max_tokens' too.",
                    params.min_tokens
                ),
            ));
        }
        params.max_tokens = Some(DEFAULT_MAX_TOKENS);
    }
    respond::check_schema(&engine, params.schema.as_ref(), false)?;
    let id = state.new_id("cmpl");
    let prompt_tokens = prompts.iter().map(|p| p.0.len()).sum();
    let n = params.n;
    // A scored prompt's echo comes from the job, with its tokens' log-probabilities.
    let score_prompt = params.logprobs.filter(|_| echo);
    let echoes: Vec<String> = prompts
        .iter()
        .flat_map(|(_, text)| {
            let echoed = echo && score_prompt.is_none();
            std::iter::repeat_n(if echoed { text.clone() } else { String::new() }, n)
        })
        .collect();
    // A text prompt got the model's BOS (`prompts`), which its text does not hold; one of
    // token ids shows its own BOS, as `detokenize` renders it.
    let bos = engine.tokenizer().vocab().special().bos;
    let bos_text = bos.and_then(|b| engine.tokenizer().token_to_piece(b, true).ok());
    let added_bos = prompts
        .iter()
        .map(|(ids, text)| {
            ids.first().is_some_and(|&t| Some(t) == bos)
                && !bos_text
                    .as_ref()
                    .is_some_and(|b| text.starts_with(b.as_str()))
        })
        .collect();
    let job = Job {
        prompts: prompts.into_iter().map(|p| p.0).collect(),
        added_bos,
        seed: params.seed.unwrap_or_else(|| state.random()),
        params: params.clone(),
        arrived,
        score_prompt,
    };
    let rx = respond::start(&state, &engine, job, &id).await?;
    let meta = Meta {
        id,
        created: unix_time(),
        model: state.reported_model(asked),
    };
    if params.stream {
        let mut chunker = CompletionChunker {
            offsets: vec![0; echoes.len()],
            meta,
            include_usage: params.include_usage,
            prompt_tokens,
            completion_tokens: 0,
        };
        let first = echoes
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.is_empty())
            .map(|(i, e)| chunker.chunk(i, e.clone(), Value::Null, None))
            .collect::<Vec<_>>();
        let choices = echoes.len();
        Ok(respond::sse(first, rx, chunker, choices).into_response())
    } else {
        collect(rx, echoes, &meta, prompt_tokens, params.logprobs.is_some()).await
    }
}

/// The prompts with their text: a string, a list of strings, a list of token ids, or a list
/// of such lists. Strings get the model's BOS like llama-server's; ids are used as given.
fn prompts(body: &Body, engine: &weft::Engine) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let bad = |m: &str| ApiError::param("prompt", m.to_string());
    let vocab = engine.info().vocab_size;
    let from_text = |s: &str| (engine.tokenizer().encode(s, true, true), s.to_string());
    let from_ids = |ids: &[Value]| -> Result<(Vec<u32>, String), ApiError> {
        let ids = ids
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&i| (i as usize) < vocab)
                    .map(|i| i as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad(&format!("Token ids must be integers below {vocab}.")))?;
        if ids.is_empty() {
            return Err(bad("A prompt of token ids must not be empty."));
        }
        let text = engine.detokenize(&ids).unwrap_or_default();
        Ok((ids, text))
    };
    let out = match body.raw("prompt") {
        None => return Err(bad("'prompt' is required.")),
        Some(Value::String(s)) => vec![from_text(s)],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("'prompt' must not be empty.")),
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|v| {
                    v.as_str().map(from_text).ok_or_else(|| {
                        bad("A list of prompts must be all strings or all lists of token ids.")
                    })
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![from_ids(a)?],
            Value::Array(_) => a
                .iter()
                .map(|v| match v {
                    Value::Array(ids) => from_ids(ids),
                    _ => Err(bad(
                        "A list of prompts must be all strings or all lists of token ids.",
                    )),
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(bad(
                    "'prompt' must be a string, a list of strings or token ids.",
                ))
            }
        },
        Some(_) => {
            return Err(bad(
                "'prompt' must be a string, a list of strings or token ids.",
            ))
        }
    };
    Ok(out)
}

/// Log-probabilities in the legacy completions shape; offsets count characters from `start`.
/// Each `top_logprobs` map holds the sampled token besides the most likely ones (so up to
/// `logprobs + 1` entries, as OpenAI documents), under its name in `tokens`.
fn legacy_logprobs(lps: &[TokenLogprob], start: usize) -> Value {
    let mut offset = start;
    let mut offsets = Vec::with_capacity(lps.len());
    for t in lps {
        offsets.push(offset);
        offset += t.text_chars;
    }
    // An echoed prompt's first token has no log-probability (NaN) and no alternatives.
    let unscored = |t: &TokenLogprob| t.logprob.is_nan();
    json!({
        "tokens": lps.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|t| (!unscored(t)).then_some(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|t| {
            if unscored(t) {
                return Value::Null;
            }
            let mut m = Map::new();
            for (tok, _, lp) in &t.top {
                m.entry(tok.clone()).or_insert(json!(lp));
            }
            m.entry(t.token.clone()).or_insert(json!(t.logprob));
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

async fn collect(
    rx: mpsc::Receiver<Event>,
    echoes: Vec<String>,
    meta: &Meta,
    prompt_tokens: usize,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let n = echoes.len();
    let Gathered {
        text,
        logprobs: lps,
        finish,
        completion_tokens: completion,
    } = respond::gather(rx, echoes.clone()).await?;
    let choices: Vec<Value> = (0..n)
        .map(|i| {
            let lp = if logprobs {
                legacy_logprobs(&lps[i], echoes[i].chars().count())
            } else {
                Value::Null
            };
            json!({"index": i, "text": text[i], "logprobs": lp, "finish_reason": finish[i].as_str()})
        })
        .collect();
    Ok(Json(json!({
        "id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
        "system_fingerprint": null, "choices": choices, "usage": usage(prompt_tokens, completion),
    }))
    .into_response())
}

struct CompletionChunker {
    /// Per choice, characters of text sent so far (for `text_offset`).
    offsets: Vec<usize>,
    meta: Meta,
    include_usage: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl CompletionChunker {
    fn chunk(&mut self, i: usize, text: String, logprobs: Value, finish: Option<&str>) -> Value {
        self.offsets[i] += text.chars().count();
        let mut v = json!({
            "id": self.meta.id, "object": "text_completion", "created": self.meta.created,
            "model": self.meta.model, "system_fingerprint": null,
            "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

impl Chunker for CompletionChunker {
    fn event(&mut self, e: Event) -> Vec<Value> {
        match e {
            Event::Delta { choice, delta } => {
                let lp = if delta.logprobs.is_empty() {
                    Value::Null
                } else {
                    legacy_logprobs(&delta.logprobs, self.offsets[choice])
                };
                vec![self.chunk(choice, delta.text, lp, None)]
            }
            Event::Finish {
                choice,
                finish,
                tokens,
            } => {
                self.completion_tokens += tokens;
                vec![self.chunk(choice, String::new(), Value::Null, Some(finish.as_str()))]
            }
            Event::Failed(e) => vec![e.body_json()],
        }
    }

    fn end(&mut self) -> Vec<Value> {
        if !self.include_usage {
            return Vec::new();
        }
        let mut v = json!({
            "id": self.meta.id, "object": "text_completion", "created": self.meta.created,
            "model": self.meta.model, "system_fingerprint": null, "choices": [],
        });
        v["usage"] = usage(self.prompt_tokens, self.completion_tokens);
        vec![v]
    }
}
