//! weft's OpenAI-compatible HTTP server: an [axum] router over the public `weft` API.
//!
//! The engine's scheduler already batches the passes of every live request into shared model
//! calls; the server adds no scheduler of its own. Each request becomes a task that owns its
//! contexts (forked per choice) and generators and streams its output over a channel; a
//! client that goes away drops the channel, the task ends at its next step, and the contexts
//! give their KV pages back. Admission under KV pressure is described in [`admission`].
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
//! `GET /v1/models`,
//! `GET /health`, `GET /metrics`, `POST /tokenize`, `POST /detokenize`.
//!
//! Embedding the router in another axum application:
//!
//! ```no_run
//! use std::sync::Arc;
//! use weft_server::{router, ServerConfig, State};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let state = Arc::new(State::new(ServerConfig::default()));
//! state.set_engine(weft::Engine::load("smollm2-135m")?);
//! let app = axum::Router::new().nest("/llm", router(state));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

mod admin;
pub mod admission;
mod body;
mod chat;
mod completions;
mod embeddings;
mod error;
mod generate;
mod metrics;
mod params;
mod respond;
mod state;
mod text;
mod tools;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State as Extract};
use axum::http::{header, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use error::ApiError;
pub use state::{ServerConfig, State};

/// The server's routes over `state`. Requests get 503 until [`State::set_engine`] is called.
pub fn router(state: Arc<State>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/embeddings", post(embeddings::handle))
        // Without `/v1`, as llama-server also answers (a client's base URL without it).
        .route("/chat/completions", post(chat::handle))
        .route("/completions", post(completions::handle))
        .route("/embeddings", post(embeddings::handle))
        .route("/tokenize", post(admin::tokenize))
        .route("/detokenize", post(admin::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(api)
        .route("/health", get(admin::health))
        .route("/v1/models", get(admin::models))
        .route("/v1/models/{id}", get(admin::model))
        .route("/models", get(admin::models))
        .route("/models/{id}", get(admin::model))
        .route("/metrics", get(admin::metrics))
        .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(&method, uri.path())
        })
        .layer(DefaultBodyLimit::max(state.config.body_limit))
        .layer(cors())
        .with_state(state)
}

/// Browsers may call the server from any page (as llama-server and vLLM allow by default):
/// preflight `OPTIONS` requests are answered, and responses say any origin may read them. An
/// API key still guards the endpoints that run the model.
fn cors() -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowHeaders, Any, CorsLayer};
    CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::POST])
        // The headers a preflight asks for, named back: the `*` wildcard never covers
        // `Authorization`, so a browser sending an API key would be refused.
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([header::RETRY_AFTER])
}

/// Serves `router(state)` on `listener` until Ctrl-C, SIGTERM or `stop` completes (the front
/// end's signal that the model failed to load), then lets the requests in flight finish; a
/// second Ctrl-C or SIGTERM stops them (as llama-server's second interrupt does): it returns
/// an `Interrupted` error, and dropping the server drops their connections, which cancels
/// their generations and gives their KV pages back.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (signalled, first_signal) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        tokio::select! {
            _ = shutdown_signal() => {
                tracing::warn!(target: "weft_server",
                    "shutting down: finishing the requests in flight (signal again to stop them)");
                let _ = signalled.send(());
            }
            _ = stop => {}
        }
    });
    let second_signal = async move {
        match first_signal.await {
            Ok(()) => shutdown_signal().await,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        done = server => done,
        () = second_signal => Err(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "stopped by a second signal before the requests in flight finished",
        )),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Checks `Authorization: Bearer KEY` when the server has a key.
async fn auth(Extract(state): Extract<Arc<State>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // The scheme's name is case-insensitive (RFC 7235).
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim());
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares two keys in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
