//! The sampling and stopping fields both endpoints share, checked and turned into what the
//! `weft` generator takes.

use weft::{Penalties, Sampler, Schema, StopRules};

use crate::body::Body;
use crate::error::ApiError;

/// Most stop strings a request may give (OpenAI's limit).
const MAX_STOP: usize = 4;
/// Longest stop string in bytes (each is checked against the text's end at every token).
const MAX_STOP_LEN: usize = 512;
/// Most choices per request.
pub const MAX_N: i64 = 128;
/// Most alternatives per token in `top_logprobs`.
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Everything a request asks of the generation, checked.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// `max_tokens` / `max_completion_tokens` (`None`: up to the context's end).
    pub max_tokens: Option<usize>,
    /// Which of the two the request gave (what an error about it names).
    pub max_tokens_param: &'static str,
    pub min_tokens: usize,
    pub n: usize,
    pub sampler: Sampler,
    pub penalties: Option<Penalties>,
    pub bias: Vec<(u32, f32)>,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    /// Top alternatives per token when log-probabilities are asked for (`Some(0)`: only
    /// the chosen token's).
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// The output's shape, when constrained (`response_format`, `grammar`, `regex`).
    pub schema: Option<Schema>,
    pub stream: bool,
    pub include_usage: bool,
    /// The LoRA adapter the request's `model` names (`None`: the base model).
    pub adapter: Option<weft::Adapter>,
}

impl GenParams {
    /// Reads the shared fields of `body` for a model with `vocab` tokens; `max_tokens` may
    /// be as low as `min_max_tokens` (0 where an echoed prompt is an answer in itself).
    pub fn parse(body: &Body, vocab: usize, min_max_tokens: i64) -> Result<GenParams, ApiError> {
        let limit = i64::from(u32::MAX);
        let (max_tokens, max_tokens_param) =
            match body.integer("max_completion_tokens", min_max_tokens, limit)? {
                Some(m) => (Some(m), "max_completion_tokens"),
                None => (
                    body.integer("max_tokens", min_max_tokens, limit)?,
                    "max_tokens",
                ),
            };
        let n = body.integer("n", 1, MAX_N)?.unwrap_or(1) as usize;
        let temperature = body.number("temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
        let top_p = body.number("top_p", 0.0, 1.0)?;
        let top_k = body.integer("top_k", -1, i64::from(u32::MAX))?;
        let min_p = body.number("min_p", 0.0, 1.0)?;
        // Zero, and values that pass as f64 but vanish as f32 (1e-300), keep no token.
        if let Some(p) = top_p.filter(|&p| p as f32 <= 0.0) {
            return Err(ApiError::param(
                "top_p",
                format!("'top_p' must be greater than 0 and at most 1, got {p}."),
            ));
        }
        // The library checks every range once (the CLI shares it); -1 and 0 turn top-k off.
        let sampler = Sampler::from_params(
            temperature,
            top_k.filter(|&k| k > 0).map(|k| k as usize),
            top_p.map(|p| p as f32),
            min_p.map(|p| p as f32),
            vocab,
        )
        .map_err(|e| ApiError::invalid(e.to_string()))?;
        let presence = body.number("presence_penalty", -2.0, 2.0)?;
        let frequency = body.number("frequency_penalty", -2.0, 2.0)?;
        let repetition = body.number("repetition_penalty", 1e-3, 10.0)?;
        let penalties =
            (presence.is_some() || frequency.is_some() || repetition.is_some()).then(|| {
                Penalties {
                    repetition: repetition.unwrap_or(1.0) as f32,
                    presence: presence.unwrap_or(0.0) as f32,
                    frequency: frequency.unwrap_or(0.0) as f32,
                    ..Penalties::default()
                }
            });
        // -1 asks for a random seed, as llama-server's default seed does.
        let seed = match body.raw("seed") {
            None => None,
            Some(v) if v.as_i64() == Some(-1) => None,
            Some(v) => Some(
                v.as_i64()
                    .map(|s| s as u64)
                    .or_else(|| v.as_u64())
                    .ok_or_else(|| ApiError::param("seed", "'seed' must be an integer."))?,
            ),
        };
        let min_tokens = body
            .integer("min_tokens", 0, i64::from(u32::MAX))?
            .unwrap_or(0) as usize;
        if let Some(m) = max_tokens {
            if min_tokens as i64 > m {
                return Err(ApiError::param(
                    "min_tokens",
                    format!("'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({m})."),
                ));
            }
        }
        let stream = body.flag("stream")?;
        let include_usage = match body.raw("stream_options") {
            None | Some(serde_json::Value::Null) => false,
            Some(_) if !stream => {
                return Err(ApiError::param(
                    "stream_options",
                    "'stream_options' is only allowed when 'stream' is true.",
                ))
            }
            Some(serde_json::Value::Object(o)) => match o.get("include_usage") {
                None | Some(serde_json::Value::Null) => false,
                Some(serde_json::Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::param(
                        "stream_options",
                        "'stream_options.include_usage' must be a boolean.",
                    ))
                }
            },
            Some(_) => {
                return Err(ApiError::param(
                    "stream_options",
                    "'stream_options' must be an object.",
                ))
            }
        };
        Ok(GenParams {
            max_tokens: max_tokens.map(|m| m as usize),
            max_tokens_param,
            min_tokens,
            n,
            sampler,
            penalties,
            bias: logit_bias(body, vocab)?,
            stop: stop(body)?,
            seed,
            logprobs: None,
            ignore_eos: body.flag("ignore_eos")?,
            schema: extra_schema(body)?,
            stream,
            include_usage,
            adapter: None,
        })
    }
}

impl GenParams {
    /// The request's stop rules, with `max_tokens` already fitted to the context.
    pub fn stop_rules(&self, max_tokens: usize) -> StopRules {
        let mut rules = StopRules::new()
            .max_tokens(max_tokens)
            .min_tokens(self.min_tokens);
        if self.ignore_eos {
            rules = rules.ignore_eos();
        }
        self.stop.iter().fold(rules, |r, s| r.stop_string(s))
    }
}

/// `stop`: a string or a list of up to four strings.
fn stop(body: &Body) -> Result<Vec<String>, ApiError> {
    let list = match body.raw("stop") {
        None => Vec::new(),
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(_) => body
            .get::<Vec<String>>("stop", "a string or a list of strings")?
            .unwrap_or_default(),
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::param(
            "stop",
            format!(
                "'stop' takes at most {MAX_STOP} strings, got {}.",
                list.len()
            ),
        ));
    }
    if list.iter().any(|s| s.len() > MAX_STOP_LEN) {
        return Err(ApiError::param(
            "stop",
            format!("Stop strings may be at most {MAX_STOP_LEN} bytes long."),
        ));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// `logit_bias`: token id (as a string) → bias in `[-100, 100]`, added to the logit.
fn logit_bias(body: &Body, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = body.get::<serde_json::Map<String, serde_json::Value>>(
        "logit_bias",
        "an object mapping token ids to biases",
    )?
    else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in &map {
        let id = k
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab)
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!("'logit_bias' key {k:?} is not a token id below {vocab}."),
                )
            })?;
        let b = v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!(
                        "'logit_bias' values must be numbers between -100 and 100 (token {k})."
                    ),
                )
            })?;
        out.push((id, b as f32));
    }
    Ok(out)
}

/// The constraint a request asks for: `response_format` (`json_object`, `json_schema`) or
/// the extra fields `grammar` (Lark, or GBNF when it defines `root ::=`) and `regex`.
fn extra_schema(body: &Body) -> Result<Option<Schema>, ApiError> {
    let mut found = Vec::new();
    if let Some(rf) = body.raw("response_format") {
        let obj = rf.as_object().ok_or_else(|| {
            ApiError::param("response_format", "'response_format' must be an object.")
        })?;
        match obj.get("type").and_then(|t| t.as_str()) {
            Some("text") => {}
            // OpenAI's JSON mode promises an object, not any JSON value (a bare number
            // could run on digit after digit to the token limit).
            Some("json_object") => {
                found.push(Schema::JsonSchema(serde_json::json!({"type": "object"})))
            }
            Some("json_schema") => {
                let schema = obj
                    .get("json_schema")
                    .and_then(|j| j.as_object())
                    .and_then(|j| j.get("schema"))
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| {
                        ApiError::param(
                            "response_format",
                            "'response_format.json_schema.schema' must be a JSON Schema object.",
                        )
                    })?;
                found.push(Schema::JsonSchema(schema.clone()));
            }
            _ => {
                return Err(ApiError::param(
                    "response_format",
                    "'response_format.type' must be 'text', 'json_object' or 'json_schema'.",
                ))
            }
        }
    }
    if let Some(g) = body.string("grammar")? {
        if g.contains("::=") {
            found.push(Schema::Gbnf(g));
        } else {
            found.push(Schema::Lark(g));
        }
    }
    if let Some(r) = body.string("regex")? {
        found.push(Schema::Regex(r));
    }
    if found.len() > 1 {
        return Err(ApiError::param(
            "response_format",
            "Give only one of 'response_format' (json), 'grammar' and 'regex'.",
        ));
    }
    Ok(found.pop())
}
