//! `POST /v1/embeddings` in OpenAI's shape: `input` as a string, a list of strings, a list of
//! token ids or a list of such lists; `encoding_format` `float` (default) or `base64` (the
//! little-endian f32 bytes); `dimensions` accepted only when it is the model's own.
//!
//! The vectors come from the embedding model given with `weft serve --embedding-model` (an
//! encoder such as all-MiniLM-L6-v2), or — named by the chat model's id, or when no embedding
//! model is served — from the chat model's pooled hidden states, like llama-server's
//! `--embedding`. Vectors are pooled as the model was trained and L2-normalized.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State as Extract;
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Value};
use weft::kv::PAGE_SIZE;
use weft::{EmbedOptions, EmbeddingModel};

use crate::body::Body;
use crate::error::ApiError;
use crate::state::{Embedding, State};

/// Most inputs one request may carry (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// What a request asks to embed.
enum Inputs {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

/// Reads `input`, naming what is wrong with it.
fn inputs(body: &Body) -> Result<Inputs, ApiError> {
    let bad = |m: &str| ApiError::param("input", m);
    let input = body
        .raw("input")
        .ok_or_else(|| bad("'input' is required."))?;
    let as_ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&n| n <= u64::from(u32::MAX))
                    .map(|n| n as u32)
            })
            .collect()
    };
    let parsed = match input {
        Value::String(s) => Inputs::Texts(vec![s.clone()]),
        Value::Array(items) if items.is_empty() => {
            return Err(bad("'input' must not be an empty list."))
        }
        Value::Array(items) if items.iter().all(Value::is_string) => Inputs::Texts(
            items
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
        ),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Inputs::Ids(vec![as_ids(input).ok_or_else(|| {
                bad("'input' token ids must be integers from 0 to 4294967295.")
            })?])
        }
        Value::Array(items) if items.iter().all(Value::is_array) => Inputs::Ids(
            items
                .iter()
                .map(as_ids)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("'input' token id lists must hold integer ids only."))?,
        ),
        _ => {
            return Err(bad(
                "'input' must be a string, a list of strings, a list of token ids or a list of token id lists.",
            ))
        }
    };
    let (count, empty) = match &parsed {
        Inputs::Texts(t) => (t.len(), t.iter().any(String::is_empty)),
        Inputs::Ids(i) => (i.len(), i.iter().any(Vec::is_empty)),
    };
    if empty {
        return Err(bad("'input' cannot contain an empty string or list."));
    }
    if count > MAX_INPUTS {
        return Err(bad(&format!(
            "'input' holds {count} items; at most {MAX_INPUTS} are allowed per request."
        )));
    }
    Ok(parsed)
}

/// `POST /v1/embeddings`.
pub async fn handle(
    Extract(state): Extract<Arc<State>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = Body::read(body)?;
    let asked = body.string("model")?;
    let Embedding {
        id: model_id,
        model,
        kv,
    } = state.embedding_model(asked.as_deref())?;
    let inputs = inputs(&body)?;
    let base64 = match body.string("encoding_format")?.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("'encoding_format' must be \"float\" or \"base64\", not {other:?}."),
            ))
        }
    };
    let dims = model.dimensions();
    if let Some(d) = body.integer("dimensions", 1, i64::from(u32::MAX))? {
        if d as usize != dims {
            return Err(ApiError::param(
                "dimensions",
                format!("This model's embeddings have {dims} dimensions and cannot be shortened to {d}."),
            ));
        }
    }
    let opts = EmbedOptions {
        pooling: model.default_pooling(),
        normalize: true,
        // Admission and preemption below wait for pages (a wait inside would hold a blocking
        // thread past the client's leaving, and let new requests take the pages meanwhile).
        wait_for_pages: false,
    };
    let count = match &inputs {
        Inputs::Texts(t) => t.len(),
        Inputs::Ids(i) => i.len(),
    };
    let mut log = RequestLog {
        state: &state,
        id: state.new_id("embd"),
        count,
        arrived: Instant::now(),
        outcome: None,
    };
    let result = run(&state, model, kv, inputs, opts).await;
    log.outcome = Some(match &result {
        Ok((_, tokens)) => Outcome::Done(*tokens),
        Err(e) if e.status == axum::http::StatusCode::TOO_MANY_REQUESTS => Outcome::Refused,
        Err(e) => Outcome::Failed(e.message.clone()),
    });
    let (vectors, tokens) = result?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// The vectors and the number of tokens the model read, computed off the async workers.
///
/// On the chat engine (`kv`) the inputs run as contexts of its KV pool, as generations do,
/// and are admitted as one is: the request waits (or gets 429) until the pool has room for
/// its longest input. Generations admitted before it may still take that room before its
/// passes run; then it waits for pages as a preempted generation does, and runs again
/// (nothing of a failed run is kept).
async fn run(
    state: &State,
    model: Arc<dyn EmbeddingModel>,
    kv: Option<weft::Engine>,
    inputs: Inputs,
    opts: EmbedOptions,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    // Set when this future is dropped (the client went away, or a second signal stopped the
    // server): the work off the async workers stops at its next group of inputs.
    let gone = GoneOnDrop::default();
    let Some(engine) = kv else {
        // An encoder holds no KV pages: only a slot of `--parallel` (or a place in the queue),
        // held by the work itself, which may outlive this future by a group of inputs.
        let permit = state.admission.admit(None, 0).await?;
        let flag = gone.flag();
        return blocking(move || {
            let _permit = permit;
            embed(&*model, &inputs, opts, &flag)
        })
        .await?
        .map_err(api_error);
    };
    let ids = match inputs {
        Inputs::Ids(ids) => ids,
        Inputs::Texts(texts) => {
            let model = model.clone();
            blocking(move || texts.iter().map(|t| model.input_ids(t)).collect()).await?
        }
    };
    let need = ids
        .iter()
        .map(|i| i.len().next_multiple_of(PAGE_SIZE))
        .max();
    let need = need.unwrap_or(0);
    let permit = Arc::new(state.admission.admit(Some(&engine), need).await?);
    let inputs = Arc::new(Inputs::Ids(ids));
    let mut _preempted = None;
    loop {
        let (model, inputs, flag) = (model.clone(), inputs.clone(), gone.flag());
        let permit = permit.clone();
        let work = move || {
            let _permit = permit;
            embed(&*model, &inputs, opts, &flag)
        };
        match blocking(work).await? {
            Err(e) if e.is_kv_full() => _preempted = Some(state.preempted(&engine, need).await),
            done => return done.map_err(api_error),
        }
    }
}

/// `f` run off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("the embedding task failed: {e}")))
}

/// How an embedding request ended.
enum Outcome {
    /// Answered, after reading this many tokens.
    Done(usize),
    /// Turned away with 429 (the queue was full): never admitted, so not counted.
    Refused,
    /// Failed after admission.
    Failed(String),
}

/// Logs a request's line and counts it in the metrics as it ends: done (with the tokens read),
/// failed, or cancelled (dropped before an outcome, as when the client goes away).
struct RequestLog<'a> {
    state: &'a State,
    id: String,
    count: usize,
    arrived: Instant,
    outcome: Option<Outcome>,
}

impl Drop for RequestLog<'_> {
    fn drop(&mut self) {
        let m = &self.state.metrics;
        let took = self.arrived.elapsed();
        let outcome = match &self.outcome {
            Some(Outcome::Refused) => "refused: the queue is full".to_string(),
            Some(Outcome::Done(tokens)) => {
                m.requests_ok.fetch_add(1, Ordering::Relaxed);
                m.prompt_tokens.fetch_add(*tokens as u64, Ordering::Relaxed);
                m.e2e.observe(took);
                format!("{tokens} tokens, ok")
            }
            Some(Outcome::Failed(e)) => {
                m.requests_failed.fetch_add(1, Ordering::Relaxed);
                format!("error: {e}")
            }
            None => {
                m.requests_cancelled.fetch_add(1, Ordering::Relaxed);
                "cancelled".to_string()
            }
        };
        tracing::info!(
            target: "weft_server",
            "{}: embeddings of {} inputs, {} ms, {outcome}",
            self.id,
            self.count,
            took.as_millis()
        );
    }
}

/// A flag set when the request's future is dropped.
#[derive(Default)]
struct GoneOnDrop(Arc<AtomicBool>);

impl GoneOnDrop {
    fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The vectors and the number of tokens the model read; a request dropped meanwhile (`gone`)
/// stops between groups of inputs, with an error nobody reads.
fn embed(
    model: &dyn EmbeddingModel,
    inputs: &Inputs,
    opts: EmbedOptions,
    gone: &AtomicBool,
) -> weft::Result<(Vec<Vec<f32>>, usize)> {
    let tokenized: Vec<Vec<u32>>;
    let ids = match inputs {
        Inputs::Texts(texts) => {
            tokenized = texts.iter().map(|t| model.input_ids(t)).collect();
            &tokenized
        }
        Inputs::Ids(ids) => ids,
    };
    let vectors = model.embed_ids_watched(ids, opts, &mut |_| !gone.load(Ordering::Relaxed))?;
    Ok((vectors, ids.iter().map(Vec::len).sum()))
}

/// An embedding's error, naming `input` where the input is at fault.
fn api_error(e: weft::Error) -> ApiError {
    match e {
        weft::Error::ContextTooLong { len, n_ctx } => {
            ApiError::context_length("input", len, None, n_ctx)
        }
        weft::Error::TokenOutOfVocab { .. } | weft::Error::EmptyPass => {
            ApiError::param("input", e.to_string())
        }
        e => ApiError::from(e),
    }
}
