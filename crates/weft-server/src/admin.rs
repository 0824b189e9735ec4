//! The small endpoints: `/health`, `/v1/models`, `/metrics`, `/tokenize`, `/detokenize`
//! (the last two in llama-server's shapes).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State as Extract};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::body::Body;
use crate::error::ApiError;
use crate::state::State;

/// `GET /health`: 200 once the model is loaded, 503 before.
pub async fn health(Extract(state): Extract<Arc<State>>) -> Result<Json<Value>, ApiError> {
    state.engine()?;
    Ok(Json(json!({"status": "ok"})))
}

/// `GET /v1/models`: the model served, its adapters and the embedding model.
pub async fn models(Extract(state): Extract<Arc<State>>) -> Json<Value> {
    Json(json!({"object": "list", "data": model_list(&state)}))
}

/// `GET /v1/models/{id}`: one of them (what the OpenAI client's `models.retrieve` asks).
pub async fn model(
    Extract(state): Extract<Arc<State>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let list = model_list(&state);
    // A known model answers to its alias too (`alias`, `alias:ADAPTER`), as it does in requests;
    // so does the embedding model.
    let id = match state.embedding_id() {
        Some(e) if crate::state::canonical(&id) == e => e.to_string(),
        _ => state.reported_model(Some(id)),
    };
    match list.iter().find(|m| m["id"] == id.as_str()) {
        Some(m) => Ok(Json(m.clone())),
        None => {
            let served: Vec<&str> = list.iter().filter_map(|m| m["id"].as_str()).collect();
            Err(ApiError::model_not_found(&id, &served.join(", ")))
        }
    }
}

/// Every model object `/v1/models` lists.
fn model_list(state: &State) -> Vec<Value> {
    let mut model = json!({
        "id": state.config.model_id, "object": "model", "created": state.started, "owned_by": "weft",
    });
    if let Ok(engine) = state.engine() {
        model["meta"] = json!({
            "n_ctx": engine.n_ctx(),
            "n_vocab": engine.info().vocab_size,
            "architecture": engine.info().arch,
        });
    }
    let base = &state.config.model_id;
    let mut data = vec![model];
    for (name, _) in state.adapters() {
        data.push(json!({
            "id": format!("{base}:{name}"), "object": "model", "created": state.started,
            "owned_by": "weft", "parent": base, "root": name,
        }));
    }
    if let Some(id) = state.embedding_id() {
        data.push(json!({
            "id": id, "object": "model", "created": state.started, "owned_by": "weft",
        }));
    }
    data
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(Extract(state): Extract<Arc<State>>) -> Response {
    // The engine's counters are exact once its queued context operations are applied,
    // which may take until the end of the current step: read them off the async workers.
    let s = state.clone();
    let gauges = tokio::task::spawn_blocking(move || s.gauges())
        .await
        .unwrap_or_else(|_| state.gauges());
    let text = state.metrics.render(&gauges);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The model whose tokenizer `/tokenize` and `/detokenize` use: the served model the body's
/// `model` names (the embedding model's, say), by default the chat model, as llama-server has
/// one.
fn tokenizer_model(state: &State, body: &Body) -> Result<Arc<dyn weft::EmbeddingModel>, ApiError> {
    Ok(match body.string("model")? {
        Some(m) => state.embedding_model(Some(&m))?.model,
        None => Arc::new(state.engine()?.clone()),
    })
}

/// `POST /tokenize`: `{"content", "add_special"?, "with_pieces"?}` → `{"tokens": [...]}`.
pub async fn tokenize(
    Extract(state): Extract<Arc<State>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = Body::read(body)?;
    let model = tokenizer_model(&state, &body)?;
    let tokenizer = model.tokenizer();
    let content = body
        .string("content")?
        .ok_or_else(|| ApiError::param("content", "'content' is required."))?;
    let add_special = body.flag("add_special")?;
    let parse_special = body
        .get::<bool>("parse_special", "a boolean")?
        .unwrap_or(true);
    let ids = tokenizer.encode(&content, add_special, parse_special);
    let tokens: Vec<Value> = if body.flag("with_pieces")? {
        ids.iter()
            .map(|&id| {
                let piece = tokenizer.token_to_piece(id, true).unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })))
}

/// `POST /detokenize`: `{"tokens": [...]}` → `{"content"}`.
pub async fn detokenize(
    Extract(state): Extract<Arc<State>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = Body::read(body)?;
    let model = tokenizer_model(&state, &body)?;
    let tokenizer = model.tokenizer();
    let vocab = tokenizer.vocab_size();
    let ids = body
        .get::<Vec<u32>>("tokens", "a list of token ids")?
        .ok_or_else(|| ApiError::param("tokens", "'tokens' is required."))?;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::param(
            "tokens",
            format!("Token id {bad} is not below the vocabulary size {vocab}."),
        ));
    }
    let content = tokenizer.decode(&ids).map_err(weft::Error::from)?;
    Ok(Json(json!({ "content": content })))
}
