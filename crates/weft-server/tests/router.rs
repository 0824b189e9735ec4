//! The router driven in-process (no socket) on the real SmolLM2 model: answers equal what
//! the library itself generates, streams equal non-streamed answers, and errors come in
//! OpenAI's shape with the right status. The wire-level conformance suite with the official
//! `openai` client is `crates/weft-cli/tests/serve_openai.rs`.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use weft::{Engine, EngineConfig, Message, Sampler};
use weft_server::{router, ServerConfig, State};

/// One engine for every test (loading it per test would be wasted time).
fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let hub = weft_hub::Hub::from_env().expect("WEFT_HOME or HOME must be set");
            let path = hub
                .resolve("smollm2-135m", &mut weft_hub::NoProgress)
                .expect("fetch smollm2-135m");
            let config = EngineConfig {
                n_threads: 2,
                kv_tokens: 4096,
                ..EngineConfig::default()
            };
            Engine::open(&path, config).expect("load smollm2-135m")
        })
        .clone()
}

fn state(config: ServerConfig) -> Arc<State> {
    let s = Arc::new(State::new(config));
    s.set_engine(engine());
    s
}

fn config() -> ServerConfig {
    ServerConfig {
        model_id: "smollm2-135m".into(),
        ..ServerConfig::default()
    }
}

async fn call(state: &Arc<State>, method: &str, path: &str, body: &str) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = router(state.clone())
        .oneshot(req)
        .await
        .expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, bytes.to_vec())
}

async fn post(state: &Arc<State>, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, bytes) = call(state, "POST", path, &body.to_string()).await;
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

/// Asserts OpenAI's error shape and returns (param, code).
fn error_shape(v: &Value) -> (Value, Value) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    (e["param"].clone(), e["code"].clone())
}

/// A runtime for one test. The tests share one engine and check that its KV pages are all
/// back at the end, so they run one at a time (the guard is held by the runtime's caller).
fn rt() -> (tokio::runtime::Runtime, std::sync::MutexGuard<'static, ()>) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    (rt, guard)
}

#[test]
fn loading_server_is_503_but_health_shape_and_models_answer() {
    let (rt, _one) = rt();
    rt.block_on(async {
        let s = Arc::new(State::new(config()));
        let (st, body) = call(&s, "GET", "/health", "").await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        error_shape(&serde_json::from_slice(&body).expect("json"));
        let (st, v) = post(&s, "/v1/chat/completions", json!({"messages": []})).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        error_shape(&v);
        let (st, body) = call(&s, "GET", "/v1/models", "").await;
        assert_eq!(st, StatusCode::OK);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["data"][0]["id"], "smollm2-135m");
        s.set_load_error("no such file".into());
        let (st, v) = post(&s, "/v1/completions", json!({"prompt": "x"})).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert!(v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no such file"));
    });
}

#[test]
fn chat_answer_equals_the_library_generation_and_the_stream() {
    let (rt, _one) = rt();
    let engine = engine();
    // The library's own answer: the same template, greedy, 24 tokens.
    let mut ctx = engine.context();
    ctx.fill_chat(&[Message::user("Name three colors.")])
        .expect("fill");
    let expected = weft::block_on(ctx.generate(Sampler::Argmax).max_tokens(24).collect_text())
        .expect("generate");
    drop(ctx);
    rt.block_on(async {
        let s = state(config());
        let body = json!({"model": "smollm2-135m", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three colors."}]});
        let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], expected.as_str());
        let usage = &v["usage"];
        assert_eq!(
            usage["total_tokens"].as_u64(),
            Some(
                usage["prompt_tokens"].as_u64().unwrap_or(0)
                    + usage["completion_tokens"].as_u64().unwrap_or(0)
            )
        );
        // The same request streamed: SSE chunks whose deltas concatenate to the same text.
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let (st, bytes) = call(&s, "POST", "/v1/chat/completions", &streamed.to_string()).await;
        assert_eq!(st, StatusCode::OK);
        let text = String::from_utf8(bytes).expect("utf-8");
        let events: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"));
        let mut content = String::new();
        let mut ids = Vec::new();
        for e in &events[..events.len() - 1] {
            let chunk: Value = serde_json::from_str(e).expect("chunk json");
            ids.push(chunk["id"].as_str().unwrap_or("").to_string());
            if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
                content.push_str(c);
            }
        }
        assert!(ids.iter().all(|i| i == &ids[0]), "one id across chunks");
        assert_eq!(content, expected);
        assert_eq!(engine.metrics().kv_pages_used, 0);
    });
}

#[test]
fn completions_with_n_choices_and_token_prompts() {
    let (rt, _one) = rt();
    rt.block_on(async {
        let s = state(config());
        let ids = engine()
            .tokenizer()
            .encode("The capital of France is", true, true);
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"prompt": [ids.clone(), ids], "n": 2, "max_tokens": 6, "temperature": 0}),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let choices = v["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 4);
        // Greedy: all four choices of the same prompt agree.
        for c in choices {
            assert_eq!(c["text"], choices[0]["text"]);
        }
        assert_eq!(v["usage"]["completion_tokens"], 24);
        assert_eq!(engine().metrics().kv_pages_used, 0);
    });
}

/// The `data:` chunks of a stream, `[DONE]` checked and left out.
fn chunks(bytes: Vec<u8>) -> Vec<Value> {
    let text = String::from_utf8(bytes).expect("utf-8");
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let events = &events[..events.len() - 1];
    events
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect()
}

/// Streamed log-probabilities where a stop string holds text back: every chunk with text
/// carries its tokens' entries (none `null`), and the streamed `text_offset`s are the
/// non-streamed ones. A chat answer without tokens has an empty list, not `null`.
#[test]
fn streamed_logprobs_match_their_text_and_the_answer() {
    let (rt, _one) = rt();
    rt.block_on(async {
        let s = state(config());
        // " canvas" is the first token greedy writes after "The sky is"; the stop string
        // may begin inside it ("s X"), so part of its text was shown before its entry.
        let body = json!({"prompt": "The sky is", "max_tokens": 6, "logprobs": 0,
            "temperature": 0, "stop": ["s X", "e X", "n X"]});
        let (st, whole) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(st, StatusCode::OK, "{whole}");
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let (st, bytes) = call(&s, "POST", "/v1/completions", &streamed.to_string()).await;
        assert_eq!(st, StatusCode::OK);
        let (mut text, mut offsets, mut tokens) = (String::new(), Vec::new(), Vec::new());
        for c in chunks(bytes) {
            let choice = &c["choices"][0];
            let t = choice["text"].as_str().unwrap_or("");
            let lp = &choice["logprobs"];
            if !t.is_empty() {
                assert!(lp.is_object(), "text without its log-probabilities: {c}");
                let named: String = lp["tokens"]
                    .as_array()
                    .expect("tokens")
                    .iter()
                    .map(|t| t.as_str().unwrap_or(""))
                    .collect();
                assert_eq!(named, t, "{c}");
            }
            text.push_str(t);
            if lp.is_object() {
                offsets.extend(lp["text_offset"].as_array().expect("offsets").clone());
                tokens.extend(lp["tokens"].as_array().expect("tokens").clone());
            }
        }
        let lp = &whole["choices"][0]["logprobs"];
        assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap_or(""));
        assert_eq!(Value::from(tokens), lp["tokens"]);
        assert_eq!(Value::from(offsets), lp["text_offset"]);

        // End of turn forced at once: no tokens, an empty list.
        let eos = engine().tokenizer().vocab().special().eos.expect("an EOS");
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
            "logit_bias": {eos.to_string(): 100}});
        let (st, v) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "");
        assert_eq!(v["choices"][0]["logprobs"], json!({"content": []}), "{v}");
        assert_eq!(engine().metrics().kv_pages_used, 0);
    });
}

/// The API's paths without `/v1` answer as with it (llama-server's do: a client's base URL
/// without `/v1`), and /v1/completions checks `min_tokens` against its default `max_tokens`.
#[test]
fn paths_without_v1_and_min_tokens_against_the_default() {
    let (rt, _one) = rt();
    rt.block_on(async {
        let s = state(config());
        let body = json!({"messages": [{"role": "user", "content": "Name a color."}],
            "max_tokens": 4, "temperature": 0});
        let (st, with) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, StatusCode::OK, "{with}");
        let (st, without) = post(&s, "/chat/completions", body).await;
        assert_eq!(st, StatusCode::OK, "{without}");
        assert_eq!(with["choices"], without["choices"]);
        let body = json!({"prompt": "Hi", "max_tokens": 3, "temperature": 0});
        let (st, with) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(st, StatusCode::OK, "{with}");
        let (st, without) = post(&s, "/completions", body).await;
        assert_eq!(st, StatusCode::OK, "{without}");
        assert_eq!(with["choices"], without["choices"]);
        let (st, models) = call(&s, "GET", "/models", "").await;
        assert_eq!(st, StatusCode::OK);
        let models: Value = serde_json::from_slice(&models).expect("json");
        assert_eq!(models["data"][0]["id"], "smollm2-135m");
        let (st, _) = call(&s, "GET", "/models/smollm2-135m", "").await;
        assert_eq!(st, StatusCode::OK);

        // 50 tokens at least, of a default 16 at most: refused, as when both are given.
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"prompt": "Hi", "min_tokens": 50}),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(error_shape(&v).0, "min_tokens");
        assert_eq!(engine().metrics().kv_pages_used, 0);
    });
}

#[test]
fn bad_requests_get_openai_errors_naming_the_parameter() {
    let (rt, _one) = rt();
    rt.block_on(async {
        let s = state(config());
        let msgs = json!([{"role": "user", "content": "Hi"}]);
        let cases = [
            (json!({"messages": msgs, "temperature": -1}), "temperature"),
            (json!({"messages": msgs, "top_p": 2}), "top_p"),
            (json!({"messages": msgs, "n": 0}), "n"),
            (json!({"messages": msgs, "max_tokens": "ten"}), "max_tokens"),
            (
                json!({"messages": msgs, "logit_bias": {"x": 1}}),
                "logit_bias",
            ),
            (
                json!({"messages": msgs, "stop": ["a", "b", "c", "d", "e"]}),
                "stop",
            ),
            (
                json!({"messages": msgs, "logprobs": true, "top_logprobs": 50}),
                "top_logprobs",
            ),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"content": "no role"}]}), "messages"),
            (
                json!({"messages": msgs, "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": msgs, "response_format": {"type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
                "response_format",
            ),
            (json!({"messages": msgs, "regex": "("}), "regex"),
        ];
        for (body, param) in cases {
            let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{body} -> {v}");
            let (p, _) = error_shape(&v);
            assert_eq!(p, json!(param), "{body} -> {v}");
        }
        // The range is said as a person would (not as the smallest positive double).
        for top_p in [0.0, 2.0] {
            let body = json!({"messages": msgs, "top_p": top_p});
            let (_, v) = post(&s, "/v1/chat/completions", body).await;
            let message = v["error"]["message"].as_str().expect("message");
            assert!(message.len() < 80, "{message}");
            assert!(message.contains("'top_p'"), "{message}");
        }
        let (st, v) = post(&s, "/v1/completions", json!({"prompt": "x", "best_of": 3})).await;
        assert_eq!(
            (st, error_shape(&v).0),
            (StatusCode::BAD_REQUEST, json!("best_of"))
        );
        let (st, v) = post(&s, "/v1/completions", json!({"prompt": "x", "suffix": "y"})).await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
        assert_eq!(error_shape(&v).0, "suffix");
        // Prompts × n choices are bounded.
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"prompt": ["a", "b"], "n": 100}),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(error_shape(&v).0, "n");
        // A prompt longer than the context: 400 with both numbers, for streams too.
        let long = "word ".repeat(9000);
        for stream in [false, true] {
            let (st, v) = post(
                &s,
                "/v1/completions",
                json!({"prompt": long, "stream": stream}),
            )
            .await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
            assert_eq!(error_shape(&v).1, "context_length_exceeded");
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(msg.contains(&engine().n_ctx().to_string()), "{msg}");
        }
        let (st, v) = post(
            &s,
            "/v1/chat/completions",
            json!({"model": "gpt-4", "messages": msgs}),
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        assert_eq!(error_shape(&v).1, "model_not_found");
        for raw in ["{", "[1,2]", "", "\u{0}"] {
            let (st, body) = call(&s, "POST", "/v1/chat/completions", raw).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{raw:?}");
            error_shape(&serde_json::from_slice(&body).expect("json"));
        }
        let (st, body) = call(&s, "GET", "/v1/nothing", "").await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        error_shape(&serde_json::from_slice(&body).expect("json"));
        assert_eq!(engine().metrics().kv_pages_used, 0);
    });
}

#[test]
fn api_key_guards_the_api_but_not_health_or_models() {
    let (rt, _one) = rt();
    rt.block_on(async {
        let s = state(ServerConfig {
            api_key: Some("sesame".into()),
            body_limit: 1024,
            ..config()
        });
        let (st, v) = post(&s, "/v1/chat/completions", json!({"messages": []})).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        assert_eq!(error_shape(&v).1, "invalid_api_key");
        assert_eq!(call(&s, "GET", "/health", "").await.0, StatusCode::OK);
        assert_eq!(call(&s, "GET", "/v1/models", "").await.0, StatusCode::OK);
        let req = Request::builder()
            .method("POST")
            .uri("/tokenize")
            .header("authorization", "Bearer sesame")
            .body(Body::from(json!({"content": "x".repeat(2000)}).to_string()))
            .expect("request");
        let resp = router(s.clone()).oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        error_shape(&serde_json::from_slice(&bytes).expect("json"));
        // The scheme's name in any case; a key given without it is not one.
        for (header, want) in [
            ("bearer sesame", StatusCode::OK),
            ("BEARER sesame", StatusCode::OK),
            ("sesame", StatusCode::UNAUTHORIZED),
            ("Basic sesame", StatusCode::UNAUTHORIZED),
        ] {
            let req = Request::builder()
                .method("POST")
                .uri("/tokenize")
                .header("authorization", header)
                .body(Body::from(json!({"content": "x"}).to_string()))
                .expect("request");
            let resp = router(s.clone()).oneshot(req).await.expect("infallible");
            assert_eq!(resp.status(), want, "{header}");
        }
        // A browser's preflight needs no key and is answered; answers (errors included) say
        // any origin may read them.
        let req = Request::builder()
            .method("OPTIONS")
            .uri("/v1/chat/completions")
            .header("origin", "http://localhost:3000")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .body(Body::empty())
            .expect("request");
        let resp = router(s.clone()).oneshot(req).await.expect("infallible");
        assert!(resp.status().is_success(), "{}", resp.status());
        let h = resp.headers();
        assert_eq!(h["access-control-allow-origin"], "*");
        assert!(h["access-control-allow-methods"]
            .to_str()
            .is_ok_and(|m| m.contains("POST")));
        // Named, not `*`: browsers never let the wildcard cover `Authorization`.
        let allowed = h["access-control-allow-headers"].to_str().unwrap_or("");
        assert!(
            allowed.to_ascii_lowercase().contains("authorization"),
            "{allowed}"
        );
        let req = Request::builder()
            .method("POST")
            .uri("/tokenize")
            .header("origin", "http://localhost:3000")
            .body(Body::from(json!({"content": "x"}).to_string()))
            .expect("request");
        let resp = router(s.clone()).oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()["access-control-allow-origin"], "*");
    });
}

/// A small synthetic LoRA adapter for SmolLM2 (rank 4 on every layer's q and v projections).
fn adapter_file() -> std::path::PathBuf {
    use weft::gguf::{GgmlType, GgufWriter, Value as Meta};
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("router-lora.gguf");
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Meta::String("llama".into()));
    w.metadata("general.type", Meta::String("adapter".into()));
    w.metadata("adapter.type", Meta::String("lora".into()));
    w.metadata("adapter.lora.alpha", Meta::F32(8.0));
    let mut x = 0x2545_F491_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 2001) as f32 / 1000.0 - 1.0
    };
    let bytes = |v: Vec<f32>| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    for l in 0..30 {
        for (name, n_out) in [("attn_q", 576u64), ("attn_v", 192)] {
            let a: Vec<f32> = (0..4 * 576).map(|_| next() * 0.2).collect();
            let b: Vec<f32> = (0..n_out * 4).map(|_| next() * 0.2).collect();
            w.tensor(
                &format!("blk.{l}.{name}.weight.lora_a"),
                GgmlType::F32,
                &[576, 4],
                bytes(a),
            );
            w.tensor(
                &format!("blk.{l}.{name}.weight.lora_b"),
                GgmlType::F32,
                &[4, n_out],
                bytes(b),
            );
        }
    }
    std::fs::write(&path, w.to_bytes()).expect("write adapter");
    path
}

#[test]
fn an_adapter_is_chosen_by_model_name_and_listed() {
    let (rt, _one) = rt();
    let engine = engine();
    let adapter = engine.load_adapter(&adapter_file()).expect("adapter");
    let greedy = |a: Option<&weft::Adapter>| {
        let mut ctx = engine.context();
        ctx.fill("The history of weaving").expect("fill");
        let mut g = ctx.generate(Sampler::Argmax).max_tokens(16);
        if let Some(a) = a {
            g = g.adapter(a, 1.0);
        }
        weft::block_on(g.collect_text()).expect("generate")
    };
    let (base, adapted) = (greedy(None), greedy(Some(&adapter)));
    assert_ne!(base, adapted, "the adapter changes the continuation");
    rt.block_on(async {
        let s = Arc::new(State::new(config()));
        s.set_adapters(vec![("weaver".into(), adapter.clone())]);
        s.set_engine(engine.clone());
        let (st, body) = call(&s, "GET", "/v1/models", "").await;
        assert_eq!(st, StatusCode::OK);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["data"][1]["id"], "smollm2-135m:weaver");
        assert_eq!(v["data"][1]["parent"], "smollm2-135m");
        // The adapter by its name, not its file's path (the list answers without an API key).
        assert_eq!(v["data"][1]["root"], "weaver");
        assert_eq!(v["data"][0]["meta"]["architecture"], "llama");
        // `created`: when the server started, the same on every call.
        assert_eq!(v["data"][0]["created"], json!(s.started));
        // One model by id, as the OpenAI client's `models.retrieve` asks.
        let ids = [
            "smollm2-135m",
            "smollm2-135m:weaver",
            "smollm2",
            "smollm2:weaver",
            "smollm2-135m",
            "weaver",
        ];
        for (i, id) in ids.iter().enumerate() {
            let (st, body) = call(&s, "GET", &format!("/v1/models/{id}"), "").await;
            assert_eq!(st, StatusCode::OK, "{id}");
            let one: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(one["id"], v["data"][i % 2]["id"]);
        }
        let (st, body) = call(&s, "GET", "/v1/models/nope", "").await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(error_shape(&v).1, "model_not_found");
        for (model, want) in [
            ("smollm2-135m:weaver", &adapted),
            ("weaver", &adapted),
            ("smollm2-135m", &base),
            // The registry's alias names the same model.
            ("smollm2", &base),
            ("smollm2:weaver", &adapted),
        ] {
            let body = json!({"model": model, "prompt": "The history of weaving",
                "max_tokens": 16, "temperature": 0});
            let (st, v) = post(&s, "/v1/completions", body).await;
            assert_eq!(st, StatusCode::OK, "{v}");
            assert_eq!(
                v["choices"][0]["text"].as_str(),
                Some(want.as_str()),
                "{model}"
            );
            // Adapters answer as `/v1/models` lists them, the base model under its own name.
            let reported = match want == &adapted {
                true => "smollm2-135m:weaver",
                false => "smollm2-135m",
            };
            assert_eq!(v["model"], reported, "{model}");
        }
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"model": "smollm2-135m:nope", "prompt": "x"}),
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        error_shape(&v);
    });
}
