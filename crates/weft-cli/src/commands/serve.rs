//! `weft serve`: the OpenAI-compatible HTTP server (`weft-server`) on one model.
//!
//! The socket is bound first (and its address printed), then the model loads in the
//! background: `/health` answers 503 until it is ready, like llama-server's.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use weft_server::{ServerConfig, State};

use crate::model_arg::{ModelArg, ThreadsArg};
use crate::progress::Bar;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on the API (`/health`, `/v1/models` and `/metrics`
    /// stay open).
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// KV cache capacity in tokens, shared by all requests (default 16384). A request's
    /// context is at most this long (and at most the model's training context). `-c` and
    /// `--ctx-size` as llama-server's, whose context is shared by its slots the same way.
    #[arg(short = 'c', long, visible_alias = "ctx-size", value_name = "N")]
    kv_tokens: Option<usize>,
    /// Requests that may wait for admission; one more gets 429.
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_queue: usize,
    /// Requests generating at once; the engine batches all of them into shared model calls.
    #[arg(long, value_name = "N", default_value_t = 64)]
    parallel: usize,
    /// Largest request body in MiB; a larger one gets 413.
    #[arg(long, value_name = "MIB", default_value_t = 8)]
    max_body_mib: usize,
    /// Serve a LoRA adapter (GGUF file or PEFT directory) as NAME (repeatable): requests pick
    /// it with `"model": "BASE:NAME"` (or `"NAME"`); `/v1/models` lists it.
    #[arg(long, value_name = "NAME=PATH", value_parser = parse_lora)]
    lora: Vec<(String, std::path::PathBuf)>,
    /// Serve this embedding model on /v1/embeddings (a known name such as all-minilm-l6-v2, a
    /// sentence-transformers folder, or a GGUF file); without it /v1/embeddings pools the chat
    /// model's hidden states.
    #[arg(long, value_name = "MODEL")]
    embedding_model: Option<String>,
}

/// `NAME=PATH` of `--lora`.
fn parse_lora(s: &str) -> Result<(String, std::path::PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() && !name.contains(':') => {
            Ok((name.to_string(), path.into()))
        }
        _ => Err(format!(
            "expected NAME=PATH (a name without ':'), got {s:?}"
        )),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let api_key = match (&args.api_key, &args.api_key_file) {
        (Some(k), _) => {
            // An empty key would lock every client out.
            anyhow::ensure!(!k.trim().is_empty(), "--api-key is empty");
            Some(k.clone())
        }
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the API key file {}", f.display()))?;
            let key = text.lines().next().unwrap_or("").trim().to_string();
            anyhow::ensure!(!key.is_empty(), "the API key file {} is empty", f.display());
            Some(key)
        }
        (None, None) => None,
    };
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    anyhow::ensure!(args.max_body_mib >= 1, "--max-body-mib must be at least 1");
    let body_limit = args
        .max_body_mib
        .checked_mul(1 << 20)
        .context("--max-body-mib is larger than this machine can address")?;
    if let Some(k) = args.kv_tokens {
        anyhow::ensure!(k >= 32, "--kv-tokens (-c) must be at least 32");
    }
    let mut engine_cfg = args.threads.engine_config()?;
    engine_cfg.checkpoint_weights = args.model.weights;
    if let Some(k) = args.kv_tokens {
        engine_cfg.kv_tokens = k;
    }
    // Names and paths are checked before the port opens; fetching and loading happen after,
    // while `/health` answers "loading".
    weft::Hub::check(&args.model.model)?;
    let name = &args.model.model;
    let encoder = match weft::hub::find(name) {
        Some(spec) => spec.is_encoder(),
        None => weft::checkpoint::encoder_folder(std::path::Path::new(name)).is_some(),
    };
    anyhow::ensure!(
        !encoder,
        "{name} is an encoder model, which embeds text but does not generate it: serve it beside a chat model with `--embedding-model {name}`"
    );
    if let Some(name) = &args.embedding_model {
        weft::Hub::check(name).with_context(|| format!("--embedding-model {name}"))?;
    }
    for (name, path) in &args.lora {
        anyhow::ensure!(
            path.is_file() || path.is_dir(),
            "cannot load adapter {name}={}: no such file or directory",
            path.display()
        );
    }
    let model_id = served_name(&args.model.model);
    let config = ServerConfig {
        model_id,
        api_key,
        parallel: args.parallel,
        max_queue: args.max_queue,
        body_limit,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let served = runtime.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        outln!("weft serve: listening on http://{local}")?;
        use std::io::Write;
        std::io::stdout().flush()?;
        let state = Arc::new(State::new(config));
        let loading = state.clone();
        let model = args.model.clone();
        let loras = args.lora.clone();
        let embedding = args.embedding_model.clone();
        // A model that fails to load ends the server (exit status 1), as llama-server does:
        // a supervisor sees the failure instead of a server answering 503 forever.
        let (failed, load_failed) = tokio::sync::oneshot::channel::<()>();
        tokio::task::spawn_blocking(move || {
            let loaded = model.path().and_then(|path| {
                if let Some(name) = &embedding {
                    let path = weft::Hub::resolve_from_env(name, &mut Bar::default())?;
                    let embedder = weft::open_embedding_model(&path, engine_cfg.clone())
                        .with_context(|| {
                            format!("cannot load embedding model {}", path.display())
                        })?;
                    loading.set_embedding_model(embedding_name(name), embedder);
                }
                let engine = weft::Engine::open(&path, engine_cfg)
                    .with_context(|| format!("cannot load model {}", path.display()))?;
                let adapters = loras
                    .iter()
                    .map(|(name, p)| {
                        let a = engine.load_adapter(p).with_context(|| {
                            format!("cannot load adapter {name}={}", p.display())
                        })?;
                        anyhow::Ok((name.clone(), a))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                loading.set_adapters(adapters);
                anyhow::Ok(engine)
            });
            match loaded {
                Ok(engine) => {
                    if engine.chat_template().is_ok_and(|t| t.is_builtin()) {
                        // Such as gemma3-270m: /v1/completions is what it is for.
                        tracing::warn!(
                            target: "weft_server",
                            "the model has no chat template of its own (a base model?): \
                             /v1/chat/completions uses its family's built-in format, and a \
                             pretrained model answers a chat poorly"
                        );
                    }
                    tracing::info!(target: "weft_server", "model loaded: ready");
                    loading.set_engine(engine);
                }
                Err(e) => {
                    loading.set_load_error(crate::message(&e));
                    let _ = failed.send(());
                }
            }
        });
        // A dropped sender means the model loaded: serve until a signal.
        let stop = async move {
            if load_failed.await.is_err() {
                std::future::pending::<()>().await
            }
        };
        weft_server::serve(listener, state.clone(), stop).await?;
        match state.load_error() {
            Some(e) => Err(anyhow::anyhow!("{e}")),
            None => anyhow::Ok(()),
        }
    });
    // A model still being fetched or loaded when a signal stopped the server is not waited
    // for (dropping the runtime would wait for its task: minutes of download, deaf to a
    // second Ctrl-C); the process ends, and pip with it. A second lets the last requests'
    // log lines and metrics be written.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}

/// The id an embedding model is served under: a known model by its name, a model folder (or
/// its `model.safetensors`) by the folder's name, a GGUF file by its file name.
fn embedding_name(model: &str) -> String {
    if weft::hub::find(model).is_some() {
        return served_name(model);
    }
    let p = std::path::Path::new(model.trim_end_matches('/'));
    let folder = if p.file_name().is_some_and(|n| n == "model.safetensors") {
        p.parent()
    } else {
        Some(p)
    };
    match folder.and_then(|f| f.file_name()) {
        Some(n) if !model.ends_with(".gguf") => n.to_string_lossy().into_owned(),
        _ => served_name(model),
    }
}

/// The id a model is served under: a known model by its name (for any of its aliases), a
/// file path by its file name.
fn served_name(model: &str) -> String {
    if let Some(known) = weft::hub::find(model) {
        return known.name.to_string();
    }
    let p = std::path::Path::new(model);
    if model.ends_with(".gguf") || p.components().count() > 1 {
        p.file_name()
            .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned())
    } else {
        model.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_are_served_by_name_files_by_file_name() {
        assert_eq!(served_name("smollm2"), "smollm2-135m");
        assert_eq!(served_name("smollm2-135m"), "smollm2-135m");
        assert_eq!(served_name("/models/tiny.gguf"), "tiny.gguf");
        assert_eq!(embedding_name("minilm"), "all-minilm-l6-v2");
        assert_eq!(embedding_name("/m/my-encoder/"), "my-encoder");
        assert_eq!(
            embedding_name("/m/my-encoder/model.safetensors"),
            "my-encoder"
        );
    }
}
