//! What both generation endpoints share: admitting a job and running it on its own task,
//! the SSE stream, and the per-request log line.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, Sse};
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use weft::Engine;

use crate::error::ApiError;
use crate::generate::{self, Event, Finish, Job};
use crate::params::GenParams;
use crate::state::State;
use crate::text::TokenLogprob;

/// Events a job may have in flight before the response reads them.
const CHANNEL: usize = 256;

/// Admits `job` (waiting in the queue if needed) and starts it on its own task. The task
/// ends when the job does or when the receiver is dropped (the client went away).
pub async fn start(
    state: &Arc<State>,
    engine: &Engine,
    job: Job,
    id: &str,
) -> Result<mpsc::Receiver<Event>, ApiError> {
    let prompt: usize = job.prompts.iter().map(Vec::len).sum();
    let need = prompt + job.params.n * job.prompts.len() * weft::kv::PAGE_SIZE;
    let permit = state.admission.admit(Some(engine), need).await?;
    state
        .metrics
        .prompt_tokens
        .fetch_add(prompt as u64, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel(CHANNEL);
    let (state, engine, id) = (state.clone(), engine.clone(), id.to_string());
    tokio::spawn(async move {
        let _permit = permit;
        let arrived = job.arrived;
        let s = guarded(generate::run(state.clone(), engine, job, tx.clone()), tx).await;
        let m = &state.metrics;
        let outcome = if let Some(e) = &s.error {
            m.requests_failed.fetch_add(1, Ordering::Relaxed);
            format!("error: {e}")
        } else if s.cancelled {
            m.requests_cancelled.fetch_add(1, Ordering::Relaxed);
            "cancelled".to_string()
        } else {
            m.requests_ok.fetch_add(1, Ordering::Relaxed);
            m.e2e.observe(arrived.elapsed());
            let f: Vec<&str> = s.finishes.iter().map(|f| f.as_str()).collect();
            f.join(",")
        };
        let ttft = s.first_token.map(|t| t - arrived);
        let gen_secs = s.first_token.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let tps = if gen_secs > 0.0 && s.tokens > 1 {
            (s.tokens - 1) as f64 / gen_secs
        } else {
            0.0
        };
        tracing::info!(
            target: "weft_server",
            "{id}: prompt {} tokens, generated {} tokens, ttft {} ms, {tps:.1} tokens/s, {outcome}",
            s.prompt_tokens,
            s.tokens,
            ttft.map_or(0, |t| t.as_millis()),
        );
    });
    Ok(rx)
}

/// Runs a job to its summary. A panic inside it (a bug in weft) ends the answer with a 500
/// (an error chunk when streaming): otherwise the channel would just close, which reads as a
/// finished job, and the client would get a 200 with part of the text.
async fn guarded(
    run: impl Future<Output = generate::Summary> + Send + 'static,
    tx: mpsc::Sender<Event>,
) -> generate::Summary {
    match tokio::spawn(run).await {
        Ok(summary) => summary,
        Err(e) => {
            let what = match e.try_into_panic() {
                Ok(panic) => panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_string()),
                // Only when the runtime shuts down, which ends this task too.
                Err(_) => "the server is shutting down".to_string(),
            };
            let e = ApiError::internal(format!("The generation failed inside weft: {what}"));
            let _ = tx.send(Event::Failed(e.clone())).await;
            generate::Summary {
                error: Some(e.message),
                ..generate::Summary::default()
            }
        }
    }
}

/// Turns a job's events into the JSON chunks of one endpoint's stream.
pub trait Chunker: Send + 'static {
    /// Chunks for one event (none, one or several).
    fn event(&mut self, e: Event) -> Vec<Value>;
    /// Chunks after the last event (the usage chunk).
    fn end(&mut self) -> Vec<Value>;
}

/// The SSE response: `first` chunks, then the chunker's, then `data: [DONE]`. A job that
/// ends before all its `choices` finished, without an error, stopped because the client left
/// the stream unread: the stream ends with that error, not as if it were complete.
pub fn sse<C: Chunker>(
    first: Vec<Value>,
    rx: mpsc::Receiver<Event>,
    chunker: C,
    choices: usize,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    struct S<C> {
        out: VecDeque<String>,
        rx: Option<mpsc::Receiver<Event>>,
        chunker: C,
        unfinished: usize,
    }
    let init = S {
        out: first.iter().map(Value::to_string).collect(),
        rx: Some(rx),
        chunker,
        unfinished: choices,
    };
    let stream = futures_util::stream::unfold(init, |mut s| async move {
        loop {
            if let Some(data) = s.out.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), s));
            }
            let rx = s.rx.as_mut()?;
            match rx.recv().await {
                Some(e) => {
                    if matches!(e, Event::Finish { .. }) {
                        s.unfinished = s.unfinished.saturating_sub(1);
                    }
                    let failed = matches!(e, Event::Failed(_));
                    s.out
                        .extend(s.chunker.event(e).iter().map(Value::to_string));
                    if failed {
                        s.rx = None;
                        s.out.push_back("[DONE]".into());
                    }
                }
                None => {
                    s.rx = None;
                    let end = match s.unfinished {
                        0 => s.chunker.end(),
                        _ => {
                            let e = ApiError::stalled(generate::STALL.as_secs());
                            s.chunker.event(Event::Failed(e))
                        }
                    };
                    s.out.extend(end.iter().map(Value::to_string));
                    s.out.push_back("[DONE]".into());
                }
            }
        }
    });
    Sse::new(stream)
}

/// A request's id, creation time and model: the same in every chunk of its answer.
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// A non-streamed answer: every choice's text, log-probabilities and finish reason, and
/// the tokens generated over all choices.
pub struct Gathered {
    pub text: Vec<String>,
    pub logprobs: Vec<Vec<TokenLogprob>>,
    pub finish: Vec<Finish>,
    pub completion_tokens: usize,
}

/// Reads a job's events to the end; `text` starts as each choice's prefix (an echo).
pub async fn gather(
    mut rx: mpsc::Receiver<Event>,
    text: Vec<String>,
) -> Result<Gathered, ApiError> {
    let n = text.len();
    let mut g = Gathered {
        text,
        logprobs: vec![Vec::new(); n],
        finish: vec![Finish::Stop; n],
        completion_tokens: 0,
    };
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta { choice, delta } => {
                g.text[choice].push_str(&delta.text);
                g.logprobs[choice].extend(delta.logprobs);
            }
            Event::Finish {
                choice,
                finish,
                tokens,
            } => {
                g.finish[choice] = finish;
                g.completion_tokens += tokens;
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Ok(g)
}

/// A token's log-probability in the chat shape.
pub fn chat_logprob(t: &TokenLogprob) -> Value {
    json!({
        "token": t.token,
        "logprob": t.logprob,
        "bytes": t.bytes,
        "top_logprobs": t.top.iter().map(|(tok, bytes, lp)| json!({
            "token": tok, "logprob": lp, "bytes": bytes,
        })).collect::<Vec<_>>(),
    })
}

/// Usage counts in OpenAI's shape.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// Checks that a prompt (the request's `param`) leaves room in the context for the
/// completion: 400 `context_length_exceeded` if not, naming the field to lower.
pub fn check_length(
    param: &str,
    prompt: usize,
    params: &GenParams,
    n_ctx: usize,
) -> Result<(), ApiError> {
    if prompt >= n_ctx {
        return Err(ApiError::context_length(param, prompt, None, n_ctx));
    }
    if let Some(m) = params.max_tokens {
        if prompt + m > n_ctx {
            // The prompt fits: what to lower is the completion asked for.
            return Err(ApiError::context_length(
                params.max_tokens_param,
                prompt,
                Some(m),
                n_ctx,
            ));
        }
    }
    Ok(())
}

/// Compiles the request's constraint once up front, so an invalid schema, grammar or regex
/// is a 400 before anything runs. `from_tools`: the schema is the forced tool call's, made
/// from the tools' parameters (so the error names `tools`).
pub fn check_schema(
    engine: &Engine,
    schema: Option<&weft::Schema>,
    from_tools: bool,
) -> Result<(), ApiError> {
    let Some(schema) = schema else { return Ok(()) };
    weft::constraint::compile(engine, schema).map_err(|e| {
        let param = match schema {
            _ if from_tools => "tools",
            weft::Schema::Regex(_) => "regex",
            weft::Schema::Lark(_) | weft::Schema::Gbnf(_) => "grammar",
            _ => "response_format",
        };
        ApiError::param(param, e.to_string())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_that_panics_ends_with_a_500() {
        let (tx, rx) = mpsc::channel(4);
        let job_tx = tx.clone();
        let summary = guarded(
            async move {
                let delta = crate::text::Delta {
                    text: "partial".into(),
                    logprobs: Vec::new(),
                };
                let _ = job_tx.send(Event::Delta { choice: 0, delta }).await;
                panic!("a bug");
            },
            tx,
        )
        .await;
        assert!(summary
            .error
            .as_deref()
            .is_some_and(|e| e.contains("a bug")));
        let gathered = gather(rx, vec![String::new()]).await;
        let e = gathered
            .err()
            .expect("the answer is an error, not the partial text");
        assert_eq!(e.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        assert!(e.message.contains("a bug"), "{}", e.message);
    }

    /// Events as JSON: `{"text": ...}`, `{"finish": ...}`, the error's body; "end" last.
    struct Plain;

    impl Chunker for Plain {
        fn event(&mut self, e: Event) -> Vec<Value> {
            match e {
                Event::Delta { delta, .. } => vec![json!({"text": delta.text})],
                Event::Finish { finish, .. } => vec![json!({"finish": finish.as_str()})],
                Event::Failed(e) => vec![e.body_json()],
            }
        }
        fn end(&mut self) -> Vec<Value> {
            vec![json!("end")]
        }
    }

    /// The stream of `events` for a job of `choices`, as the client reads it.
    async fn streamed(events: Vec<Event>, choices: usize) -> String {
        use axum::response::IntoResponse;
        let (tx, rx) = mpsc::channel(events.len().max(1));
        for e in events {
            tx.send(e).await.expect("send");
        }
        drop(tx);
        let body = sse(Vec::new(), rx, Plain, choices)
            .into_response()
            .into_body();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    /// A job that ends before every choice finished (its client left the stream unread, and
    /// the job stopped) ends the stream with that error, not as a complete answer; one whose
    /// choices all finished ends as usual.
    #[tokio::test]
    async fn a_stream_cut_short_ends_with_an_error() {
        let delta = |t: &str| Event::Delta {
            choice: 0,
            delta: crate::text::Delta {
                text: t.into(),
                logprobs: Vec::new(),
            },
        };
        let finish = |choice| Event::Finish {
            choice,
            finish: Finish::Length,
            tokens: 1,
        };
        let whole = streamed(vec![delta("a"), finish(0), finish(1)], 2).await;
        assert!(
            whole.ends_with("data: \"end\"\n\ndata: [DONE]\n\n"),
            "{whole}"
        );
        assert!(!whole.contains("error"), "{whole}");
        let cut = streamed(vec![delta("a"), finish(1)], 2).await;
        assert!(cut.contains("\"code\":\"stream_stalled\""), "{cut}");
        assert!(!cut.contains("\"end\""), "{cut}");
        assert!(cut.ends_with("data: [DONE]\n\n"), "{cut}");
    }
}
