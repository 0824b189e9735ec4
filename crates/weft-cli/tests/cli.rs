//! The `weft` binary end to end: tokenize and inspect on the real default model, and clear
//! errors (no panic) for bad input.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::weft;
use weft_testkit::reference_dir;

fn reference_case(text: &str) -> serde_json::Value {
    let dir = reference_dir();
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("tokenize.json"))
            .expect("shared/reference/tokenize.json"),
    )
    .expect("json");
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["text"] == text)
        .cloned()
        .expect("case present in tokenize.json")
}

#[test]
fn tokenize_prints_llama_cpp_ids_as_json() {
    let text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let case = reference_case(text);
    for (flags, field) in [
        (&[][..], "smollm2_ids"),
        (&["--no-parse-special"][..], "smollm2_ids_no_special"),
    ] {
        let mut args = vec!["tokenize", "-m", "smollm2-135m"];
        args.extend_from_slice(flags);
        let out = weft(&args, text);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).expect("utf8");
        assert_eq!(stdout.lines().count(), 1, "one line of output: {stdout:?}");
        let ids: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON array");
        assert_eq!(ids, case[field], "{flags:?}");
    }
}

/// An encoder's tokenizer too: `weft tokenize -m all-minilm-l6-v2` gives the ids
/// sentence-transformers gave for the reference cases (`[CLS]` … `[SEP]`).
#[test]
fn tokenize_takes_an_encoder_and_gives_sentence_transformers_ids() {
    let text = std::fs::read_to_string(reference_dir().join("minilm.json")).expect("minilm.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    let cases = json["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let out = weft(
            &["tokenize", "-m", "all-minilm-l6-v2"],
            case["text"].as_str().expect("text"),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ids: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON array");
        assert_eq!(ids, case["ids"], "{}", case["text"]);
    }
}

#[test]
fn inspect_describes_the_model() {
    let summary = [
        "architecture: llama",
        "llama.block_count = 30",
        "llama.embedding_length = 576",
        "model gpt2, pre-tokenizer smollm, 49152 tokens, 48900 merges",
        "chat template: present",
        "tensors: 272",
        "token_embd.weight",
        "Q8_0",
        "[576, 49152]",
    ];
    // --all: every key (arrays by type and length) and the chat template in full.
    let all = [
        "general.quantization_version = 2",
        "tokenizer.ggml.tokens = [string; 49152]",
        "tokenizer.chat_template = ",
        "    ' }}{% endif %}",
    ];
    for (extra, needles) in [(None, &summary[..]), (Some("--all"), &all[..])] {
        let args: Vec<&str> = ["inspect", "-m", "smollm2-135m"]
            .into_iter()
            .chain(extra)
            .collect();
        let out = weft(&args, "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let s = String::from_utf8(out.stdout).expect("utf8");
        for needle in needles {
            assert!(s.contains(needle), "{args:?} lacks {needle:?}:\n{s}");
        }
    }
}

/// A sentence-embedding encoder's folder is described too: all-MiniLM-L6-v2 is a 6-layer BERT
/// of 384 dimensions.
#[test]
fn inspect_describes_an_encoder_folder() {
    let out = weft(&["inspect", "-m", "all-minilm-l6-v2"], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("encoder: bert, 384 dimensions"), "{stdout}");
    assert!(stdout.contains("num_hidden_layers = 6"), "{stdout}");
    assert!(
        stdout.contains("encoder.layer.5.output.dense.weight"),
        "{stdout}"
    );
    assert!(!stdout.contains("encoder.layer.6."), "{stdout}");
}

#[test]
fn bad_models_are_clear_errors_not_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let corrupt = dir.path().join("corrupt.gguf");
    // A valid start, then a metadata count no file could hold.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&corrupt, &bytes).expect("write");
    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, b"hello there, not a model").expect("write");

    let cases = [
        (
            corrupt.to_str().expect("path").to_string(),
            "cannot fit in the file",
        ),
        (
            not_gguf.to_str().expect("path").to_string(),
            "not a GGUF file",
        ),
        ("no-such-model".to_string(), "unknown model"),
    ];
    for (model, needle) in cases {
        let out = weft(&["inspect", "-m", &model], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{model}: {stderr}");
        assert!(!stderr.contains("panicked"), "{model}: {stderr}");
        assert!(stderr.contains(needle), "{model}: {stderr}");
        assert!(stderr.starts_with("error: "), "{model}: {stderr}");
        // A server whose model fails to load exits with the same error instead of answering
        // 503 forever.
        let (status, stderr) = serve_until_exit(&model);
        assert_eq!(status.code(), Some(1), "serve -m {model}: {stderr}");
        assert!(!stderr.contains("panicked"), "serve -m {model}: {stderr}");
        assert!(stderr.contains(needle), "serve -m {model}: {stderr}");
    }
}

#[test]
fn serve_refuses_settings_that_would_lock_out_every_request() {
    for (args, needle) in [
        (&["--api-key", ""][..], "--api-key is empty"),
        (
            &["--max-body-mib", "0"][..],
            "--max-body-mib must be at least 1",
        ),
        // llama-server's -c / --ctx-size: the KV tokens its slots share, as --kv-tokens.
        (&["-c", "16"][..], "--kv-tokens (-c) must be at least 32"),
        (
            &["--ctx-size", "16"][..],
            "--kv-tokens (-c) must be at least 32",
        ),
        // Names and paths are checked before the port opens.
        (
            &["-m", "no-such-model"][..],
            "unknown model `no-such-model`",
        ),
        (
            &["--embedding-model", "no-such-model"][..],
            "--embedding-model no-such-model: unknown model",
        ),
        (
            &["--lora", "a=/no/such/adapter.gguf"][..],
            "cannot load adapter a=/no/such/adapter.gguf: no such file",
        ),
        // An encoder is no chat model: the error names the option it belongs to.
        (
            &["-m", "minilm"][..],
            "serve it beside a chat model with `--embedding-model minilm`",
        ),
    ] {
        let out = weft(&[&["serve", "--port", "0"][..], args].concat(), "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} listened first");
    }
}

#[cfg(unix)]
#[test]
fn serve_stops_at_ctrl_c_while_its_model_is_being_fetched() {
    // The model's download hangs: pip asks an index (a socket here) that accepts and never
    // answers. A Ctrl-C then ends the server at once (it waited for the download, minutes,
    // and a second Ctrl-C did nothing).
    use std::io::BufRead;
    use std::process::Stdio;
    let index = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/simple", index.local_addr().expect("addr"));
    let home = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "-m", "smollm2-135m", "--port", "0"])
        .env("WEFT_HOME", home.path())
        .env("PIP_INDEX_URL", &url)
        .env("PIP_TIMEOUT", "300")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weft serve");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read");
    assert!(line.contains("listening on"), "{line:?}");
    // pip has connected to the silent index by now.
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "serve ended early"
    );
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(killed.success());
    let Some(status) = exit_within(&mut child, 20) else {
        panic!("weft serve still runs 20 s after a Ctrl-C while its model was fetched");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).ok();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(status.code().is_some(), "{status}: {stderr}");
    drop(index);
}

/// `child`'s exit status once it exits, within `seconds`; `None` (and the child killed) if
/// it still runs then.
fn exit_within(child: &mut std::process::Child, seconds: u64) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs `weft serve -m MODEL` on a free port and waits (at most a minute) for it to exit.
fn serve_until_exit(model: &str) -> (std::process::ExitStatus, String) {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "-m", model, "--port", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weft serve");
    let Some(status) = exit_within(&mut child, 60) else {
        panic!("weft serve -m {model} still runs a minute after its model failed to load");
    };
    let mut stderr = String::new();
    use std::io::Read;
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).ok();
    }
    (status, stderr)
}

/// llama-perplexity's figures for `shared/reference/perplexity-text.txt` at context 512.
const LLAMA_CPP_PERPLEXITY: [(&str, f64); 2] =
    [("smollm2-135m", 19.8777), ("gemma3-270m", 17.7719)];

/// `weft perplexity` of the reference text in chunks of `ctx` tokens, with extra options.
fn perplexity(model: &str, ctx: usize, extra: &[&str]) -> f64 {
    let text = reference_dir().join("perplexity-text.txt");
    let text = text.to_str().expect("utf-8 path");
    let ctx = ctx.to_string();
    let args = [&["perplexity", "-m", model, "-f", text, "-c", &ctx], extra].concat();
    let out = weft(&args, "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{model}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .split("PPL = ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{model}: no estimate in {stdout:?}"))
}

/// Perplexity's progress goes to standard error; a reader of it that leaves (`2>&1 | head
/// -c 3`) does not stop the run, whose estimate still reaches standard output (it panicked).
#[test]
fn perplexity_survives_a_closed_standard_error() {
    let text = reference_dir().join("perplexity-text.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["perplexity", "-m", "smollm2-135m", "-c", "128", "-f"])
        .arg(&text)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weft");
    drop(child.stderr.take());
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("PPL = "));
}

/// The f16 cache's perplexity is within 2% of llama.cpp's (whose cache is f16 too, context
/// 512), and a Q8_0 cache's within 0.5% of the f16 one's (issue #15's bar).
///
/// One perplexity of this text scores 1,024 tokens, and a change of rounding anywhere (the
/// scalar, AVX2 and AVX-512 kernels sum in different orders) moves it by up to 0.5% as
/// 8-bit activations round the other way, so the Q8_0 gap of a single run is mostly that
/// noise: for Gemma, chunks of 512 gave 0.15% on AVX-512 and 0.79% on AVX2 (so an AVX2-only
/// machine failed the bar on one draw). The gap is taken as the mean of its size over three
/// chunk sizes (256, 512, 1,024 tokens: the text scored in different windows, three draws of
/// the noise): the same bar, a steadier measure of what storing the cache as Q8_0 costs.
/// Measured (256 / 512 / 1,024, mean) on Zen 4 — SmolLM2: AVX-512 0.46 / 0.19 / 0.39, 0.34%;
/// AVX2 0.05 / 0.34 / 0.14, 0.18%. Gemma: AVX-512 0.39 / 0.15 / 0.45, 0.33%; AVX2 0.20 /
/// 0.79 / 0.45, 0.48% — Q8_0 costs Gemma about 0.3–0.5%, close to the bar.
#[test]
fn perplexity_is_within_two_percent_of_llama_cpp_and_q8_0_kv_within_half_a_percent() {
    for (model, reference) in LLAMA_CPP_PERPLEXITY {
        let (mut gaps, mut ppl) = (Vec::new(), f64::NAN);
        for ctx in [256, 512, 1024] {
            let f16 = perplexity(model, ctx, &[]);
            let q8 = perplexity(model, ctx, &["--kv-type", "q8_0"]);
            let gap = (q8 - f16).abs() / f16;
            eprintln!(
                "{model}, chunks of {ctx}: q8_0 KV perplexity {q8:.4}, f16 {f16:.4}, {:.3}% apart",
                gap * 100.0
            );
            gaps.push(gap);
            if ctx == 512 {
                ppl = f16;
            }
        }
        let q8_rel = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!(
            q8_rel < 0.005,
            "{model}: q8_0 KV perplexity is {:.3}% from f16's on average (bar 0.5%)",
            q8_rel * 100.0
        );
        let rel = (ppl - reference).abs() / reference;
        eprintln!(
            "{model}: perplexity {ppl:.4}, llama.cpp {reference}, {:.2}% apart",
            rel * 100.0
        );
        assert!(
            rel < 0.02,
            "{model}: perplexity {ppl} is not within 2% of llama.cpp's {reference}"
        );
    }
}

/// The Hugging Face checkpoint folder transformers makes from a known model's GGUF file (see
/// `weft_testkit::hf_checkpoint`), with its weights in `dtype`.
fn checkpoint(model: &str, dtype: &str) -> String {
    static MAKE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MAKE.lock().unwrap_or_else(|e| e.into_inner());
    let gguf = weft::Hub::from_env()
        .expect("hub")
        .resolve(model, &mut weft::NoProgress)
        .expect("fetch the model");
    let dir = weft_testkit::hf_checkpoint(&gguf, model, dtype);
    dir.to_str().expect("utf-8 path").to_string()
}

/// A Hugging Face checkpoint folder loads where a GGUF file does (`-m DIR`), its matrices
/// quantized to Q8_0 as it loads: the perplexity of the reference text is within 2% of
/// llama.cpp's on the GGUF file (the bar of the GGUF itself; the checkpoint holds the GGUF's
/// dequantized weights, see `weft_testkit::hf_checkpoint`).
#[test]
fn checkpoint_folders_run_and_score_within_two_percent_of_llama_cpp() {
    for ((model, reference), dtype) in LLAMA_CPP_PERPLEXITY.into_iter().zip(["f32", "f16"]) {
        let dir = checkpoint(model, dtype);
        let ppl = perplexity(&dir, 512, &[]);
        let rel = (ppl - reference).abs() / reference;
        eprintln!(
            "{model} from safetensors ({dtype}, loaded as q8_0): perplexity {ppl:.4}, llama.cpp {reference}, {:.2}% apart",
            rel * 100.0
        );
        assert!(
            rel < 0.02,
            "{model} from safetensors: perplexity {ppl} is not within 2% of llama.cpp's {reference}"
        );
    }
}

/// `weft embed` takes a generator's checkpoint folder as its help says (`-m DIR`), as it
/// takes the GGUF file: pooled hidden states (it read every folder as an encoder and refused
/// the architecture). With `--weights f32` the folder holds the GGUF's dequantized weights,
/// so its vectors are close to the GGUF's.
#[test]
fn embed_takes_a_decoder_checkpoint_folder() {
    let dir = checkpoint("smollm2-135m", "f32");
    let vector = |model: &str, extra: &[&str]| -> Vec<f64> {
        let args = [&["embed", "-m", model, "--pooling", "mean"], extra].concat();
        let out = weft(&args, "The cat sat on the mat.\n");
        assert!(
            out.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON array")
    };
    let folder = vector(&dir, &["--weights", "f32"]);
    let gguf = vector("smollm2-135m", &[]);
    assert_eq!(folder.len(), 576);
    let cos: f64 = folder.iter().zip(&gguf).map(|(a, b)| a * b).sum();
    assert!(cos > 0.99, "cosine {cos}");
}

/// `weft tokenize` on a checkpoint folder reads its tokenizer alone: the ids of the GGUF file
/// it was made from, and no conversion of its matrices in the cache (it converted them all).
#[test]
fn tokenize_reads_a_checkpoint_folders_tokenizer_without_converting_it() {
    let dir = checkpoint("smollm2-135m", "f32");
    let home = tempfile::tempdir().expect("tempdir");
    let text = "The history of weaving begins <|im_start|> here.";
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["tokenize", "-m", &dir])
        .env("WEFT_HOME", home.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run weft tokenize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gguf = weft(&["tokenize", "-m", "smollm2-135m"], text);
    assert_eq!(out.stdout, gguf.stdout);
    assert!(
        !home.path().join("converted").exists(),
        "tokenizing converted the checkpoint"
    );
}

/// A checkpoint folder is converted on its first load into `$WEFT_HOME/converted/`, mapped
/// from there on (the same output), and converted again, replacing the old file, when a file
/// of the folder changes.
#[test]
fn a_checkpoint_folder_is_converted_once_and_again_when_it_changes() {
    let source = checkpoint("smollm2-135m", "f32");
    // A folder of links to the fixture's files, so touching one leaves the fixture alone.
    let folder = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(&source).expect("read the checkpoint") {
        let e = e.expect("entry");
        std::os::unix::fs::symlink(e.path(), folder.path().join(e.file_name())).expect("link");
    }
    let home = tempfile::tempdir().expect("tempdir");
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["run", "-m"])
            .arg(folder.path())
            .args(["-n", "8", "--temp", "0", "The capital of France is"])
            .env("WEFT_HOME", home.path())
            .output()
            .expect("run weft");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let converted = || -> Vec<(std::path::PathBuf, std::time::SystemTime)> {
        std::fs::read_dir(home.path().join("converted"))
            .expect("the cache of conversions")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .map(|p| {
                let t = std::fs::metadata(&p)
                    .and_then(|m| m.modified())
                    .expect("mtime");
                (p, t)
            })
            .collect()
    };
    let first = run();
    assert!(first.contains("Paris"), "{first:?}");
    let cached = converted();
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert_eq!(run(), first);
    assert_eq!(converted(), cached, "the second load read the cached file");
    // A changed config.json (a new modification time) makes a new conversion.
    let config = folder.path().join("config.json");
    let text = std::fs::read_to_string(&config).expect("config.json");
    std::fs::remove_file(&config).expect("unlink");
    std::fs::write(&config, text).expect("write config.json");
    assert_eq!(run(), first);
    let again = converted();
    assert_eq!(again.len(), 1, "the older conversion is removed: {again:?}");
    assert_ne!(again[0].0, cached[0].0);
    // `weft inspect` names the cached file it describes, and the tokenizer.json it carries.
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .arg("inspect")
        .arg("-m")
        .arg(folder.path())
        .env("WEFT_HOME", home.path())
        .output()
        .expect("run weft inspect");
    let report = String::from_utf8_lossy(&out.stdout);
    let first_line = format!(
        "file: {}, converted to {} (",
        folder.path().display(),
        again[0].0.display()
    );
    assert!(report.starts_with(&first_line), "{report}");
    assert!(
        report.contains(
            "model tokenizer.json (Hugging Face), pre-tokenizer from tokenizer.json, 49152 tokens"
        ),
        "{report}"
    );
    // `weft models` counts the conversion; once its folder is gone, `--prune` removes it.
    let models = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_weft"))
            .arg("models")
            .args(args)
            .env("WEFT_HOME", home.path())
            .output()
            .expect("run weft models");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = models(&[]);
    assert!(listed.contains("conversions: 1 in "), "{listed}");
    assert!(!listed.contains("will not be used again"), "{listed}");
    assert_eq!(models(&["--prune"]), "0 files removed, 0 MiB freed\n");
    assert_eq!(converted().len(), 1);
    drop(folder);
    assert!(models(&[]).contains("1 of them"));
    let pruned = models(&["--prune"]);
    assert!(
        pruned.starts_with(&format!("removed {} (", again[0].0.display())),
        "{pruned}"
    );
    assert!(converted().is_empty());
    let left = std::fs::read_dir(home.path().join("converted"))
        .expect("cache")
        .count();
    assert_eq!(left, 0, "the conversion's record went with it");
}

/// `weft run --json` output as (prompt ids, generated ids).
fn run_json(args: &[&str]) -> (Vec<u64>, Vec<u64>) {
    let out = weft(args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weft {args:?} failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let ids = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .expect(k)
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect()
    };
    (ids("prompt_ids"), ids("ids"))
}

#[test]
fn run_reports_what_ran_and_checks_what_it_will_need() {
    // -n 0: the prompt is echoed, and nothing ran, so no rate.
    let out = weft(&["run", "-n", "0", "The capital of France is"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "The capital of France is"
    );
    assert!(
        stderr.contains("prompt: 5 tokens, not run | generated: 0 tokens"),
        "{stderr}"
    );
    // One token: the prompt's pass made it; there is no decode rate to give.
    let out = weft(
        &["run", "-n", "1", "--temp", "0", "The capital of France is"],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("generated: 1 token\n"), "{stderr}");
    // `-` reads the prompt from standard input: the same output as the argument.
    let args = ["run", "-n", "6", "--temp", "0", "--json"];
    let given = weft(&[&args[..], &["The capital of France is"]].concat(), "");
    let piped = weft(&[&args[..], &["-"]].concat(), "The capital of France is");
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert_eq!(given.stdout, piped.stdout);
    // A session that could not be saved is an error before the generation.
    let dir = std::env::temp_dir();
    for (path, why) in [
        ("/no/such/dir/s.bin", "no such directory"),
        (dir.to_str().expect("utf-8"), "it is a directory"),
        ("/dev/full", "not a regular file"),
    ] {
        let out = weft(&["run", "--save-session", path, "Hello"], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(why) && out.stdout.is_empty(), "{stderr}");
    }
    // A missing adapter: the OS's reason once.
    let out = weft(&["run", "--lora", "/no/such/adapter.gguf", "Hello"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    // An encoder where a decoder is needed says so.
    let out = weft(&["run", "-m", "all-minilm-l6-v2", "-n", "1", "Hello"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is an encoder model"), "{stderr}");
    // A reader that goes away is no error.
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "-n", "64", "--temp", "0", "Once upon a time"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run weft");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("error"),
        "{stderr}"
    );
}

#[test]
fn run_takes_one_constraint_and_refuses_two() {
    let args = [
        "run",
        "-m",
        "smollm2-135m",
        "--temp",
        "0",
        "-n",
        "16",
        "--json",
        "--regex",
        "[0-9]{3}",
        "The number after 122 is",
    ];
    let out = weft(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let text = v["text"].as_str().expect("text");
    assert!(
        text.len() == 3 && text.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    assert!(!stderr.contains("note:"), "{stderr}");
    // Cut by -n before it matches, the output exits 0 with a note saying so.
    let mut cut = args;
    cut[6] = "1";
    let out = weft(&cut, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("before the constraint reached its end"),
        "{stderr}"
    );
    // Two at once is a usage error before any model work, as the server and Python refuse it.
    let dir = tempfile::tempdir().expect("tempdir");
    let grammar = dir.path().join("yes-no.lark");
    std::fs::write(&grammar, "start: \"yes\" | \"no\"\n").expect("write");
    let grammar = grammar.to_str().expect("path");
    let out = weft(
        &["run", "--grammar", grammar, "--regex", "a", "Question?"],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// What a llama.cpp user types works as there: escapes in the prompt and in `--stop`
/// (`--no-escape` keeps them), `-n -1`, `-p`, `-f`, `-j` and `--grammar` given inline, and
/// `-ngl` (ignored, with a note: weft runs on the CPU); a prompt that names a model says
/// how to run it; `perplexity -c` near `usize::MAX` names the right minimum.
#[test]
fn run_reads_llama_cpp_flags_as_llama_cpp_does() {
    let greedy = ["run", "--temp", "0", "-n", "1", "--json"];
    let (newline, _) = run_json(&[&greedy[..], &["Q: hi\nA:"]].concat());
    let (escaped, _) = run_json(&[&greedy[..], &["Q: hi\\nA:"]].concat());
    assert_eq!(escaped, newline, "\\n is a newline");
    let (kept, _) = run_json(&[&greedy[..], &["--no-escape", "Q: hi\\nA:"]].concat());
    assert_ne!(kept, newline, "--no-escape keeps the backslash");

    // "Paris.\n\nThe ...": --stop '\n' (two characters) stops at the first newline.
    let prompt = "The capital of France is";
    let text = |args: &[&str]| -> String {
        let out = weft(args, "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "weft {args:?} failed: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
        v["text"].as_str().expect("text").to_string()
    };
    let free = text(&["run", "--temp", "0", "-n", "12", "--json", prompt]);
    let cut = &free[..free.find('\n').expect("a newline in the greedy text")];
    let stopped = text(&[
        "run", "--temp", "0", "-n", "12", "--json", "--stop", "\\n", prompt,
    ]);
    assert_eq!(stopped, cut);

    // -n -1: no limit but the context (or the end of the text).
    let (p, ids) = run_json(&["run", "--temp", "0", "-n", "-1", "-c", "48", "--json", "Hi"]);
    assert!(p.len() + ids.len() <= 48 && !ids.is_empty());
    let out = weft(&["run", "-n", "-3", "Hi"], "");
    assert_eq!(out.status.code(), Some(2));

    // -p and -f give the prompt as the argument does; -ngl is ignored with a note.
    let (by_arg, ids_arg) = run_json(&[&greedy[..], &[prompt]].concat());
    let (by_p, ids_p) = run_json(&[&greedy[..], &["-p", prompt]].concat());
    assert_eq!((&by_p, &ids_p), (&by_arg, &ids_arg));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, prompt).expect("write");
    let (by_f, _) = run_json(&[&greedy[..], &["-f", file.to_str().expect("path")]].concat());
    assert_eq!(by_f, by_arg);
    for ngl in [
        &["-ngl", "99"][..],
        &["-ngl", "all"],
        &["--n-gpu-layers=0,99"],
    ] {
        let out = weft(&[&greedy[..], ngl, &[prompt]].concat(), "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{ngl:?}: {stderr}");
        assert!(
            stderr.contains("is ignored: weft runs on the CPU"),
            "{stderr}"
        );
    }
    // Not a flag without a number: `-p -ngl -m FILE` ran the default model on the prompt
    // FILE (the filter took -ngl and the -m after it).
    let out = weft(&["run", "-p", "-ngl", "-m", "/nonexistent/x.gguf"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("ignored"),
        "{stderr}"
    );
    let out = weft(&[&greedy[..], &["-p", prompt, prompt]].concat(), "");
    assert_eq!(out.status.code(), Some(1));

    // A schema and a GBNF grammar given inline.
    let json = text(&[
        "run",
        "--temp",
        "0",
        "-n",
        "24",
        "--json",
        "-j",
        r#"{"type":"object"}"#,
        "A JSON object:",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("the output is JSON");
    assert!(v.is_object(), "{json}");
    // A file name that is not there is named, not read as a schema or a grammar.
    for flag in ["-j", "--grammar"] {
        let out = weft(&["run", flag, "nothing/here.json", "x"], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot read nothing/here.json: no such file"),
            "{stderr}"
        );
    }
    let answer = text(&[
        "run",
        "--temp",
        "0",
        "-n",
        "4",
        "--json",
        "--grammar",
        r#"root ::= "yes" | "no""#,
        "Is Paris in France? Answer:",
    ]);
    assert!(answer == "yes" || answer == "no", "{answer:?}");

    let out = weft(&["run", "-n", "1", "--temp", "0", "gemma3"], "");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give -m gemma3"));

    std::fs::write(&file, "a few words").expect("write");
    let out = weft(
        &[
            "perplexity",
            "-f",
            file.to_str().expect("path"),
            "-c",
            "18446744073709551615",
        ],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        !stderr.contains("need at least 0") && !stderr.contains("551614"),
        "{stderr}"
    );
}

/// `--stop`: the greedy output is cut before the first place a stop string appears, in the
/// streamed text and in `--json` alike, and generation ends there.
#[test]
fn run_stops_before_a_stop_string() {
    let prompt = "The capital of France is";
    let greedy = ["run", "--temp", "0", "-n", "24"];
    let free = weft(&[&greedy[..], &["--json", prompt]].concat(), "");
    assert!(free.status.success());
    let v: serde_json::Value = serde_json::from_slice(&free.stdout).expect("JSON output");
    let text = v["text"].as_str().expect("text").to_string();
    let free_ids = v["ids"].as_array().expect("ids").len();
    // The streamed text is the same text after the prompt.
    let streamed = weft(&[&greedy[..], &[prompt]].concat(), "");
    assert_eq!(
        String::from_utf8_lossy(&streamed.stdout),
        format!("{prompt}{text}\n")
    );
    // Three characters from the middle of the output (likely across a token boundary).
    let mid = (text.len() / 2..text.len())
        .find(|&i| text.is_char_boundary(i))
        .expect("a boundary");
    let end = (mid + 3..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .expect("an end");
    let stop = &text[mid..end];
    let cut = &text[..text.find(stop).expect("the stop string")];
    let out = weft(
        &[&greedy[..], &["--stop", stop, "--json", prompt]].concat(),
        "",
    );
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(v["text"], cut, "stop {stop:?} in {text:?}");
    assert!(v["ids"].as_array().expect("ids").len() < free_ids);
    let out = weft(
        &[&greedy[..], &["--stop", "zzz", "--stop", stop, prompt]].concat(),
        "",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{prompt}{cut}\n")
    );
    let out = weft(&["run", "--stop", "", prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--stop needs a string"), "{stderr}");
}

#[test]
fn session_files_continue_and_reuse_a_run() {
    let dir = std::env::temp_dir().join(format!("weft-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let session = dir.join("s.weft");
    let s = session.to_str().unwrap();
    let prompt = "The history of weaving begins";
    let greedy = ["run", "--temp", "0", "--json"];
    let (prompt_ids, whole) = run_json(&[&greedy[..], &["-n", "24", prompt]].concat());
    assert_eq!(whole.len(), 24);

    // 12 tokens saved, then 12 more from the session alone: the same 24 tokens.
    let (_, first) = run_json(&[&greedy[..], &["-n", "12", "--save-session", s, prompt]].concat());
    assert_eq!(first, whole[..12]);
    let (_, rest) = run_json(&[&greedy[..], &["-n", "12", "--load-session", s]].concat());
    assert_eq!(rest, whole[12..]);

    // The same prompt again: only its last token is computed (for its logits), the output is
    // the same.
    let (ran, again) =
        run_json(&[&greedy[..], &["-n", "12", "--load-session", s, prompt]].concat());
    assert_eq!(ran, prompt_ids[prompt_ids.len() - 1..], "prompt run again");
    assert_eq!(again, whole[..12]);

    // Sampling on from a session without --seed keeps the random state it saved: the note
    // says so, rather than naming a clock seed that played no part.
    let out = weft(
        &["run", "--temp", "0.8", "-n", "2", "--load-session", s],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("| seed from the session"), "{stderr}");

    // A save that dies half-way (here the file-size limit kills it) leaves the previous session
    // file whole: the snapshot is written beside it and renamed over it once complete.
    let before = std::fs::read(&session).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -f 64; exec "$0" run --temp 0 -n 4 --load-session "$1" --save-session "$1""#)
        .args([env!("CARGO_BIN_EXE_weft"), s])
        .output()
        .expect("run sh");
    assert!(!out.status.success(), "{out:?}");
    assert!(
        std::fs::read(&session).unwrap() == before,
        "the session file was damaged"
    );

    // A temp file a killed save left (its writer's process is gone) is removed by the next
    // save to the same file; one whose writer lives (this test) is left alone.
    let left = dir.join(".s.weft.4294967295.AbCdEf.tmp");
    let live = dir.join(format!(".s.weft.{}.AbCdEf.tmp", std::process::id()));
    std::fs::write(&left, b"half a snapshot").unwrap();
    std::fs::write(&live, b"being written").unwrap();
    let (_, _) = run_json(&[&greedy[..], &["-n", "2", "--save-session", s, prompt]].concat());
    assert!(!left.exists(), "the temp file of a dead writer was kept");
    assert!(live.exists(), "the temp file of a live writer was removed");
    std::fs::remove_file(&live).unwrap();

    // A damaged session file: a clear error, no panic.
    let mut bytes = std::fs::read(&session).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&session, &bytes).unwrap();
    let out = weft(&["run", "--load-session", s, prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_session_saved_under_widened_weights_does_not_load_under_the_file_s_own() {
    // `--weights f16` widens the GGUF file's matrices into another file: a session saved
    // there holds other KV than the Q4_1 weights make. Its fingerprint was cached beside the
    // GGUF file under the GGUF's size and time, and the session then loaded under either.
    let home = tempfile::tempdir().expect("tempdir");
    let gguf = weft::Hub::from_env()
        .expect("hub")
        .resolve("smollm2-135m", &mut weft::NoProgress)
        .expect("fetch the model");
    let model = home.path().join("smollm2.gguf");
    std::fs::copy(&gguf, &model).expect("copy the model");
    let session = home.path().join("s.weft");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["run", "--temp", "0", "-n", "2", "-m"])
            .arg(&model)
            .args(extra)
            .env("WEFT_HOME", home.path())
            .output()
            .expect("run weft");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let s = session.to_str().expect("path");
    let (ok, stderr) = run(&["--weights", "f16", "--save-session", s, "Hello"]);
    assert!(ok, "{stderr}");
    let (ok, stderr) = run(&["--weights", "f16", "--load-session", s]);
    assert!(ok, "{stderr}");
    let (ok, stderr) = run(&["--load-session", s]);
    assert!(!ok && stderr.contains("taken on another model"), "{stderr}");
}

#[test]
fn run_applies_lora_adapters_with_a_scale() {
    use weft_core::gguf::{GgmlType, GgufWriter, Value};
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("a.gguf");
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()));
    w.metadata("general.type", Value::String("adapter".into()));
    w.metadata("adapter.type", Value::String("lora".into()));
    w.metadata("adapter.lora.alpha", Value::F32(8.0));
    let f32s = |n: usize, k: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((((i * 7919 + k) % 1000) as f32 / 1000.0 - 0.5) * 0.2).to_le_bytes())
            .collect()
    };
    for l in 0..30 {
        w.tensor(
            &format!("blk.{l}.ffn_down.weight.lora_a"),
            GgmlType::F32,
            &[1536, 4],
            f32s(1536 * 4, l),
        );
        w.tensor(
            &format!("blk.{l}.ffn_down.weight.lora_b"),
            GgmlType::F32,
            &[4, 576],
            f32s(576 * 4, l + 1),
        );
    }
    std::fs::write(&adapter, w.to_bytes()).unwrap();
    let a = adapter.to_str().unwrap();
    let prompt = "The history of weaving begins";
    let greedy = ["run", "--temp", "0", "--json", "-n", "12"];
    let (_, base) = run_json(&[&greedy[..], &[prompt]].concat());
    let (_, off) = run_json(&[&greedy[..], &["--lora", &format!("{a}:0"), prompt]].concat());
    let (_, on) = run_json(&[&greedy[..], &["--lora", a, prompt]].concat());
    assert_eq!(off, base, "scale 0 is the base model");
    assert_ne!(on, base, "the adapter changes the output");
    let out = weft(&["run", "-m", "gemma3-270m", "--lora", a, prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("adapter for llama models"), "{stderr}");
}

#[test]
fn embed_prints_one_unit_vector_per_line() {
    let out = weft(
        &["embed", "-m", "smollm2-135m", "--pooling", "last"],
        "The cat sat on the mat.\nParis is the capital of France.\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<Vec<f64>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON array per line"))
        .collect();
    assert_eq!(lines.len(), 2);
    for v in &lines {
        assert_eq!(v.len(), 576);
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    }
    assert_ne!(lines[0], lines[1]);
    // Every token's vector: an array of unit vectors, one per token of the text.
    let out = weft(
        &["embed", "-m", "smollm2-135m", "--pooling", "none"],
        "hello world\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tokens: Vec<Vec<f64>> = serde_json::from_slice(&out.stdout).expect("array of arrays");
    let ids = weft(&["tokenize"], "hello world");
    let ids: Vec<u32> = serde_json::from_slice(&ids.stdout).expect("ids");
    assert_eq!(tokens.len(), ids.len());
    for v in &tokens {
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(v.len() == 576 && (norm - 1.0).abs() < 1e-4, "{norm}");
    }
    // Any batch size: lines are gathered as they come (a huge `--batch` was reserved up
    // front, a panic or an abort).
    for batch in ["18446744073709551615", "100000000000000"] {
        let out = weft(
            &["embed", "-m", "smollm2-135m", "--batch", batch],
            "hello world\n",
        );
        assert!(
            out.status.success(),
            "--batch {batch}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    }
    // A usage error, as clap reports the others: status 2, before any model is loaded.
    let out = weft(&["embed", "--pooling", "median"], "x\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown pooling"), "{stderr}");
}

/// A sentence-transformers folder is a model for `embed`, as its name and its
/// model.safetensors are (it was refused as "not a file"), and the encoder is `embed`'s
/// default; empty lines at the end of the input are dropped, one between texts is an error.
#[test]
fn embed_takes_an_encoder_folder_and_trailing_empty_lines() {
    let pulled = weft(&["pull", "all-minilm-l6-v2"], "");
    assert!(pulled.status.success());
    let file = String::from_utf8_lossy(&pulled.stdout).trim().to_string();
    let folder = std::path::Path::new(&file)
        .parent()
        .expect("the model's folder");
    let folder = folder.to_str().expect("utf-8 path");
    let text = "A man is eating food.\nA man is riding a horse.\n";
    let by_name = weft(&["embed", "-m", "all-minilm-l6-v2"], text);
    let by_folder = weft(&["embed", "-m", folder], &format!("{text}\n\n"));
    assert!(
        by_folder.status.success(),
        "{}",
        String::from_utf8_lossy(&by_folder.stderr)
    );
    assert_eq!(by_name.stdout, by_folder.stdout);
    let by_default = weft(&["embed"], text);
    assert_eq!(
        by_default.stdout, by_name.stdout,
        "embed defaults to the encoder"
    );
    let vectors: Vec<Vec<f64>> = String::from_utf8_lossy(&by_folder.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON array per line"))
        .collect();
    assert!(vectors.len() == 2 && vectors[0].len() == 384);
    let out = weft(&["embed", "-m", folder], "one\n\ntwo\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("input line 2 is empty"), "{stderr}");
    // Where a decoder is needed, the folder is named as an encoder.
    let out = weft(&["run", "-m", folder, "Hello"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is an encoder model"), "{stderr}");
    // A `.gguf` file that is not one (a web page saved in its place) gets the GGUF reader's
    // error, not the safetensors reader's.
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("model.gguf");
    std::fs::write(&page, "<!DOCTYPE html><html>...</html>").unwrap();
    let out = weft(&["embed", "-m", page.to_str().unwrap()], "hi\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a GGUF file"), "{stderr}");
}

/// `weft models` names each model with its aliases (what the unknown-model error lists).
#[test]
fn models_lists_names_aliases_and_the_default() {
    let out = weft(&["models"], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for needle in [
        "smollm2-135m (alias smollm2, default): ",
        "gemma3-270m (alias gemma3): ",
        "all-minilm-l6-v2 (alias minilm): ",
    ] {
        assert!(stdout.contains(needle), "{needle:?} in {stdout}");
    }
}

#[test]
fn help_lists_chat() {
    let out = weft(&["--help"], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.trim_start().starts_with("chat ")),
        "{stdout}"
    );
    let out = weft(&["chat", "--help"], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--model",
        "--system",
        "--temp",
        "--seed",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--n-predict",
    ] {
        assert!(stdout.contains(flag), "chat --help lacks {flag}:\n{stdout}");
    }
}

#[test]
fn run_announces_a_seed_only_when_sampling() {
    let prompt = "The capital of France is";
    let out = weft(&["run", "--temp", "0", "-n", "4", prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("generated: 4 tokens"), "{stderr}");
    assert!(!stderr.contains("seed"), "greedy, yet a seed: {stderr}");
    let out = weft(
        &["run", "--temp", "0", "--seed", "7", "-n", "4", prompt],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("seed"), "greedy, yet a seed: {stderr}");
    let out = weft(
        &[
            "run", "--temp", "0.8", "--seed", "7", "--top-k", "40", "-n", "4", prompt,
        ],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("| seed 7"), "{stderr}");
    // llama.cpp's spellings: a seed of -1 draws one, a top-k of -1 is off.
    let out = weft(
        &["run", "--seed", "-1", "--top-k", "-1", "-n", "2", prompt],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("| seed "), "{stderr}");
    let out = weft(&["run", "--top-p", "0", prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("top-p must be in (0, 1]"), "{stderr}");
}

/// The test names `weft bench --json` prints.
fn bench_tests(args: &[&str]) -> Vec<String> {
    let out = weft(&[&["bench", "-r", "1", "--json"][..], args].concat(), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object per line");
            v["test"].as_str().expect("test name").to_string()
        })
        .collect()
}

#[test]
fn bench_skips_zero_lengths() {
    assert_eq!(bench_tests(&["-p", "0", "-n", "4"]), ["tg4"]);
    assert_eq!(bench_tests(&["-p", "0,8", "-n", "0"]), ["pp8"]);
    // -n takes a list, as llama-bench's does.
    assert_eq!(bench_tests(&["-p", "0", "-n", "0,4,2"]), ["tg4", "tg2"]);
    let out = weft(&["bench", "-p", "0", "-n", "0"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nothing to measure"), "{stderr}");
    // Options whose rows would not be there are refused, not ignored.
    for (args, says) in [
        (&["--parallel", "4"][..], "--parallel measures decoding"),
        (&["--bandwidth"][..], "--bandwidth measures decoding"),
        (&["--speculate"][..], "--speculate measures decoding"),
    ] {
        let out = weft(&[&["bench", "-p", "8", "-n", "0"][..], args].concat(), "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let out = weft(&["bench", "-p", "0", "-n", "4", "--raw"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("give --parallel P too"), "{stderr}");
}

#[test]
fn bench_runs_at_depth_and_reports_bandwidth() {
    assert_eq!(
        bench_tests(&["-p", "16", "-n", "4", "-d", "0,48"]),
        ["pp16", "tg4", "pp16 @ d48", "tg4 @ d48"]
    );
    let out = weft(
        &[
            "bench",
            "-r",
            "2",
            "--json",
            "-p",
            "16",
            "-n",
            "4",
            "-d",
            "0,48",
            "--bandwidth",
        ],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("streaming read bandwidth:"), "{stderr}");
    assert!(stderr.contains("kernels: "), "{stderr}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let floats = |v: &serde_json::Value| -> Vec<f64> {
        let list = v.as_array().expect("a list");
        list.iter().map(|x| x.as_f64().expect("a number")).collect()
    };
    // Bytes per token: what a decode row's GB/s and tokens/s imply.
    let per_token = |r: &serde_json::Value| {
        r["gbps"].as_f64().expect("gbps") * 1e9 / r["tps_median"].as_f64().expect("tps")
    };
    for r in &rows {
        let decode = r["n_gen"].as_u64() != Some(0);
        assert_eq!(r.get("gbps").is_some(), decode, "{r}");
        if !decode {
            continue;
        }
        // Probes before each of the 2 repetitions and after the last: each repetition is
        // rated against the higher probe beside it; the row shows the medians (of 2: means).
        let (probes, samples) = (floats(&r["probes_gbps"]), floats(&r["samples"]));
        assert_eq!((probes.len(), samples.len()), (3, 2), "{r}");
        let bounds = [probes[0].max(probes[1]), probes[1].max(probes[2])];
        let bw = r["bandwidth_gbps"].as_f64().expect("bandwidth_gbps");
        assert!((bw - (bounds[0] + bounds[1]) / 2.0).abs() < 1e-9, "{r}");
        let gb_per_token = per_token(r) / 1e9;
        let shares = [0, 1].map(|i| gb_per_token * samples[i] / bounds[i]);
        let of_limit = r["of_limit"].as_f64().expect("of_limit");
        assert!(
            (of_limit - (shares[0] + shares[1]) / 2.0).abs() < 1e-9,
            "{r}"
        );
        assert!(bw > 0.0 && of_limit > 0.0, "{r}");
        // With two threads, each probe also times a cache line's round trip between them
        // (left out when the busy machine did not run both within its budget).
        if let Some(apart) = r.get("threads_apart_ns") {
            let apart = floats(apart);
            assert!(r["threads"].as_u64() > Some(1), "{r}");
            assert!(!apart.is_empty() && apart.len() <= probes.len(), "{r}");
            assert!(apart.iter().all(|&ns| ns > 0.0 && ns < 1e8), "{r}");
        }
    }
    // The model's weights are read once per token (SmolLM2 ties its embeddings: all of its
    // tensors, ~92 MiB); at depth 48 the keys and values of ~50 positions come on top.
    let (shallow, deep) = (per_token(&rows[1]), per_token(&rows[3]));
    assert!((85e6..105e6).contains(&shallow), "{shallow}");
    // 30 layers × 3 KV heads × 64 dims × 2 (K, V) × 2 bytes = 23,040 bytes per position.
    let kv = deep - shallow;
    assert!((kv - 23_040.0 * 48.0).abs() < 1.0, "{kv}");
    // The probes read a buffer of the row's own step bytes (~97 and ~98 MB), and say when.
    let probes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("streaming read bandwidth over "))
        .collect();
    assert_eq!(probes.len(), 6, "{stderr}");
    let whens = [
        "before repetition 1",
        "before repetition 2",
        "after repetition 2",
    ];
    for (i, step) in ["97 MB (a step of tg4)", "98 MB (a step of tg4 @ d48)"]
        .into_iter()
        .enumerate()
    {
        for (line, when) in probes[3 * i..3 * i + 3].iter().zip(whens) {
            assert!(line.contains(&format!("{step} {when}: ")), "{stderr}");
        }
    }
}

/// `--kv-type q8_0`: the bench says so, and decode at depth reads 34 bytes per 32 cached values
/// instead of 64; an unknown type is refused with the names of the known ones.
#[test]
fn bench_with_a_q8_0_kv_cache_reads_about_half_the_kv_bytes() {
    let args = [
        "bench",
        "-r",
        "1",
        "--json",
        "-p",
        "0",
        "-n",
        "4",
        "-d",
        "0,48",
        "--bandwidth",
        "--kv-type",
        "q8_0",
    ];
    let out = weft(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("KV cache: q8_0"), "{stderr}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert!(rows.iter().all(|r| r["kv_type"] == "q8_0"), "{rows:?}");
    let per_token = |r: &serde_json::Value| {
        r["gbps"].as_f64().expect("gbps") * 1e9 / r["tps_median"].as_f64().expect("tps")
    };
    // 30 layers × 3 KV heads × 2 blocks of 34 bytes × 2 (K, V) = 12,240 bytes per position.
    let kv = per_token(&rows[1]) - per_token(&rows[0]);
    assert!((kv - 12_240.0 * 48.0).abs() < 1.0, "{kv}");

    let out = weft(&["bench", "-p", "8", "-n", "0", "--kv-type", "q4"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("expected f16 or q8_0"), "{stderr}");
}

#[test]
fn bench_names_its_kernels_and_weft_kernels_forces_them() {
    let bench = |value: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
        cmd.args(["bench", "-r", "1", "--json", "-p", "8", "-n", "0"]);
        match value {
            Some(v) => cmd.env("WEFT_KERNELS", v),
            None => cmd.env_remove("WEFT_KERNELS"),
        };
        let out = cmd.output().expect("run weft");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        let row: serde_json::Value = serde_json::from_str(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .expect("a row"),
        )
        .expect("JSON");
        (
            row["kernels"].as_str().expect("kernels").to_string(),
            stderr,
        )
    };
    let (detected, stderr) = bench(None);
    assert!(stderr.contains(&format!("kernels: {detected}")), "{stderr}");
    let (forced, stderr) = bench(Some("scalar"));
    assert_eq!(forced, "scalar", "{stderr}");
    assert!(stderr.contains("kernels: scalar"), "{stderr}");
    // Every x86 variant the CPU has can be forced (the AVX2 one whenever any is detected).
    if detected != "scalar" {
        let (forced, stderr) = bench(Some("avx2"));
        assert_eq!(forced, "avx2", "{stderr}");
    }
    // A name weft does not have is refused, and the detected variant runs.
    let (fallback, stderr) = bench(Some("neon"));
    assert_eq!(fallback, detected);
    assert!(stderr.contains("WEFT_KERNELS=\"neon\" ignored"), "{stderr}");
    // On AVX-512 the bench names the tiles of one-token products; WEFT_PAIR_GEMV picks them.
    if detected == "avx512" {
        for (value, tiles) in [("1", "512-bit pair tiles"), ("0", "256-bit tiles")] {
            let out = Command::new(env!("CARGO_BIN_EXE_weft"))
                .args(["bench", "-r", "1", "-p", "0", "-n", "4"])
                .env_remove("WEFT_KERNELS")
                .env("WEFT_PAIR_GEMV", value)
                .output()
                .expect("run weft");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            assert!(stderr.contains("kernels: avx512 "), "{stderr}");
            assert!(
                stderr.contains(&format!("one-token products on the {tiles}")),
                "{stderr}"
            );
        }
    }
}

/// `-c/--ctx-size`: a greedy run stops at the end of the context it was given, with the same
/// tokens as without the limit as far as they go, and says so; a prompt that leaves no room
/// is a clear error.
#[test]
fn run_stops_at_the_end_of_the_context_it_was_given() {
    let prompt = "The history of weaving begins";
    let greedy = ["run", "--temp", "0", "--json", "-n", "40"];
    let (prompt_ids, free) = run_json(&[&greedy[..], &[prompt]].concat());
    let limit = (prompt_ids.len() + 10).max(16);
    let room = limit - prompt_ids.len();
    assert!(
        free.len() > room,
        "the free run should outlast the limit: {free:?}"
    );
    let c = limit.to_string();
    let out = weft(&[&greedy[..], &["-c", &c, prompt]].concat(), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "stopped at the end of the context ({limit} tokens"
        )),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let ids: Vec<u64> = serde_json::from_value(v["ids"].clone()).expect("ids");
    assert_eq!(ids, free[..room], "the limited run's tokens");

    let long_prompt = "a b c d e f g h i j k l m n o p q r s t u v w x y z";
    let out = weft(&["run", "-c", "16", "-n", "4", long_prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("leaves no room in the context of"),
        "{stderr}"
    );
    // A cache no machine holds is an error, not an abort.
    let out = weft(&["run", "-c", "1000000000000", "-n", "2", "Hi"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot allocate a KV cache"), "{stderr}");
    let out = weft(&["run", "-c", "3", "Hi"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--ctx-size must be at least 16"),
        "{stderr}"
    );
}

/// A one-block Llama of hidden size 16 (2 heads of 8, F32 weights, a 32-token SentencePiece
/// vocabulary) trained, so its file says, on a context of 64 tokens: cheap enough to fill
/// 16,000 positions.
fn tiny_llama_file(dir: &std::path::Path) -> std::path::PathBuf {
    tiny_llama_file_with(dir, "tiny.gguf", None, 1.0)
}

/// [`tiny_llama_file`] with an RMS-norm epsilon in its metadata and `norm` as every value of
/// the final norm's weight (NaN: broken weights), written to `dir/name`.
fn tiny_llama_file_with(
    dir: &std::path::Path,
    name: &str,
    eps: Option<f32>,
    norm: f32,
) -> std::path::PathBuf {
    use weft_core::gguf::{Array, GgmlType, GgufWriter, Value};
    let (d, ff, vocab) = (16u64, 32u64, 32u64);
    let f32s = |n: u64| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (((i * 37 % 17) as f32 - 8.0) / 64.0).to_le_bytes())
            .collect()
    };
    let ones = |n: u64| -> Vec<u8> { (0..n).flat_map(|_| 1f32.to_le_bytes()).collect() };
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()))
        .metadata("llama.block_count", Value::U32(1))
        .metadata("llama.embedding_length", Value::U32(d as u32))
        .metadata("llama.feed_forward_length", Value::U32(ff as u32))
        .metadata("llama.attention.head_count", Value::U32(2))
        .metadata("llama.context_length", Value::U32(64));
    if let Some(eps) = eps {
        w.metadata("llama.attention.layer_norm_rms_epsilon", Value::F32(eps));
    }
    let tokens = ["<unk>", "<s>", "</s>"].into_iter().map(String::from);
    let tokens: Vec<String> = tokens
        .chain((3..vocab).map(|i| format!("\u{2581}{}", char::from(b'a' + (i % 26) as u8))))
        .collect();
    let types = (0..vocab).map(|i| if i < 3 { 3 } else { 1 }).collect();
    w.metadata("tokenizer.ggml.model", Value::String("llama".into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .metadata(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; vocab as usize])),
        )
        .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .metadata("tokenizer.ggml.bos_token_id", Value::U32(1))
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.tensor(
        "token_embd.weight",
        GgmlType::F32,
        &[d, vocab],
        f32s(vocab * d),
    )
    .tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[d],
        (0..d).flat_map(|_| norm.to_le_bytes()).collect(),
    )
    .tensor("blk.0.attn_norm.weight", GgmlType::F32, &[d], ones(d))
    .tensor("blk.0.ffn_norm.weight", GgmlType::F32, &[d], ones(d));
    for (name, rows, cols) in [
        ("attn_q", d, d),
        ("attn_k", d, d),
        ("attn_v", d, d),
        ("attn_output", d, d),
        ("ffn_gate", ff, d),
        ("ffn_up", ff, d),
        ("ffn_down", d, ff),
    ] {
        let t = format!("blk.0.{name}.weight");
        w.tensor(&t, GgmlType::F32, &[cols, rows], f32s(rows * cols));
    }
    let path = dir.join(name);
    std::fs::write(&path, w.to_bytes()).expect("write the tiny model");
    path
}

/// Broken numbers in a model file: a NaN hyper-parameter is refused at load, NaN weights
/// when they make NaN logits; both say what is wrong, neither runs on silently.
#[test]
fn a_model_with_nan_numbers_is_an_error_not_garbage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |path: &std::path::Path| {
        let path = path.to_str().expect("a UTF-8 path");
        weft(&["run", "-m", path, "-n", "2", "--temp", "0", "a b"], "")
    };
    let out = run(&tiny_llama_file(dir.path()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let cases = [
        (Some(f32::NAN), 1.0, "layer_norm_rms_epsilon = NaN"),
        (Some(-1.0), 1.0, "layer_norm_rms_epsilon = -1"),
        (None, f32::NAN, "NaN logits"),
    ];
    for (i, (eps, norm, why)) in cases.into_iter().enumerate() {
        let out = run(&tiny_llama_file_with(
            dir.path(),
            &format!("bad{i}.gguf"),
            eps,
            norm,
        ));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{why}: {stderr}");
        assert!(stderr.contains(why), "{why}: {stderr}");
    }
}

/// `weft bench -d` sizes the KV cache to its deepest test, as llama-bench sizes each test's
/// context: past the default capacity (16,384 tokens) and past the model's training context.
#[test]
fn bench_holds_depths_past_the_default_cache_and_the_training_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_llama_file(dir.path());
    let m = model.to_str().expect("utf-8 path");
    assert_eq!(
        bench_tests(&["-m", m, "-p", "8", "-n", "4", "-d", "16400"]),
        ["pp8 @ d16400", "tg4 @ d16400"]
    );
    assert_eq!(
        bench_tests(&["-m", m, "-p", "0", "-n", "8", "--parallel", "200"]),
        ["tg8", "pp128+tg8 x200"]
    );
}

/// `weft run … 2>&1 | head`: the reader may go away after the text and before the statistics
/// line on standard error. With standard error a pipe nobody reads, weft ends as it does on a
/// closed standard output: quietly, status 0 (`eprintln!` panicked, status 101).
#[test]
fn a_closed_standard_error_ends_run_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "-n", "8", "--temp", "0", "The capital of France is"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run weft");
    drop(child.stderr.take()); // the only reading end
    let status = child.wait().expect("wait for weft");
    assert_eq!(status.code(), Some(0));
}

/// `-f -` scores standard input, as the same text in a file.
#[test]
fn perplexity_reads_standard_input_for_a_dash() {
    let text = "The loom is one of the oldest machines people have built. A weaver stretches \
                the warp threads tight on a frame and passes the weft over and under them. ";
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("text.txt");
    std::fs::write(&file, text.repeat(3)).expect("write text");
    let args = ["perplexity", "-m", "smollm2-135m", "-c", "32", "-f"];
    let from_file = weft(&[&args[..], &[file.to_str().expect("utf-8")]].concat(), "");
    let from_stdin = weft(&[&args[..], &["-"]].concat(), &text.repeat(3));
    for out in [&from_file, &from_stdin] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(from_file.stdout, from_stdin.stdout);
    assert!(String::from_utf8_lossy(&from_stdin.stdout).contains("PPL = "));
}

/// Output piped into a reader that has gone (`weft models | head -1`) ends each command
/// quietly, as `run` does.
#[test]
fn a_closed_standard_output_ends_every_command_quietly() {
    let commands: [&[&str]; 5] = [
        &["models"],
        &["inspect", "-m", "smollm2-135m"],
        &["tokenize"],
        &["bench", "-r", "1", "-p", "8", "-n", "0"],
        &["pull", "smollm2-135m"],
    ];
    for args in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run weft");
        drop(child.stdout.take()); // the only reading end
        if let Some(mut stdin) = child.stdin.take() {
            // Only `tokenize` reads it; the others may have ended already.
            let _ = stdin.write_all(b"Hello world");
        }
        let out = child.wait_with_output().expect("wait for weft");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

/// A model given by path needs no cache: with neither `$HOME` nor `$WEFT_HOME` set (a service
/// account, `env -i`), `-m FILE` runs, and only a model name asks for the cache directory.
#[test]
fn a_model_path_runs_without_a_home_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_llama_file(dir.path());
    let homeless = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(args)
            .env_remove("HOME")
            .env_remove("WEFT_HOME")
            .output()
            .expect("run weft")
    };
    let m = model.to_str().expect("utf-8 path");
    let out = homeless(&["run", "-m", m, "-n", "4", "--temp", "0", "a b"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = homeless(&["run", "-m", "smollm2-135m", "-n", "4", "a b"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("set WEFT_HOME"), "{stderr}");
}

/// A negative number given as its own argument reaches the option's range check (it was taken
/// for an unknown option: "unexpected argument '-1' found").
#[test]
fn a_negative_sampling_value_gets_its_range_error() {
    for (flag, message) in [
        ("--temp", "temperature must be a finite number >= 0, got -1"),
        ("--top-p", "top-p must be in (0, 1], got -1"),
        ("--min-p", "min-p must be in [0, 1], got -1"),
    ] {
        let out = weft(&["run", "-n", "1", flag, "-1", "Hello"], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        // The message names the option at fault, not all four.
        assert!(
            stderr.contains(&format!("{message} ({flag})")),
            "{flag}: {stderr}"
        );
    }
}

/// Without a prompt argument, a piped standard input is the prompt (as with `-`), less the
/// newline `echo` ends it with.
#[test]
fn run_reads_a_piped_prompt() {
    let prompt = "The capital of France is";
    let args = ["run", "-n", "2", "--temp", "0", "--json"];
    let (given, out) = run_json(&[&args[..], &[prompt]].concat());
    for stdin_args in [&args[..], &[&args[..], &["-"]].concat()] {
        let got = weft(stdin_args, &format!("{prompt}\n"));
        assert!(
            got.status.success(),
            "{}",
            String::from_utf8_lossy(&got.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&got.stdout).expect("JSON output");
        assert_eq!(v["prompt_ids"], serde_json::json!(given), "{stdin_args:?}");
        assert_eq!(v["ids"], serde_json::json!(out), "{stdin_args:?}");
    }
    let empty = weft(&["run", "-n", "1"], "");
    let stderr = String::from_utf8_lossy(&empty.stderr);
    assert!(
        stderr.contains("`-` to read it from standard input"),
        "{stderr}"
    );
}

/// `weft chat -n 0` would keep empty replies; a command may have a space after its slash.
#[test]
fn chat_refuses_empty_replies_and_reads_spaced_commands() {
    let out = weft(&["chat", "-n", "0"], "Hi\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("-n must be at least 1"), "{stderr}");
    let out = weft(&["chat", "-n", "1"], "/ reset\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("(conversation cleared)"), "{stderr}");
}

/// Options an encoder has no use for are refused, not silently ignored.
#[test]
fn embed_refuses_decoder_options_for_an_encoder() {
    for flags in [
        &["--weights", "f32"][..],
        &["--kv-type", "q8_0"],
        &["--resident-layers", "1"],
    ] {
        let args = [&["embed", "-m", "all-minilm-l6-v2"][..], flags].concat();
        let out = weft(&args, "hello\n");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{} applies to decoders", flags[0])),
            "{stderr}"
        );
    }
    // A file that is neither a GGUF nor safetensors is not called an encoder.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("model.bin");
    std::fs::write(&junk, b"not a model at all").unwrap();
    let out = weft(
        &["embed", "-m", junk.to_str().unwrap(), "--kv-type", "q8_0"],
        "hello\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("is an encoder"), "{stderr}");
    assert!(stderr.contains("not a valid safetensors file"), "{stderr}");
}

/// A bad option value is an error before any model is fetched, loaded or converted (for a
/// checkpoint folder, minutes): here the model does not even exist, and the option is named.
#[test]
fn option_values_are_checked_before_the_model_is_loaded() {
    let nowhere = "/nonexistent/model.gguf";
    for (args, says) in [
        (
            &["run", "-m", nowhere, "-t", "0", "Hi"][..],
            "--threads must be",
        ),
        (
            &["run", "-m", nowhere, "-c", "3", "Hi"][..],
            "--ctx-size must be at least 16",
        ),
        (
            &["run", "-m", nowhere, "--resident-layers", "0", "Hi"][..],
            "--resident-layers must",
        ),
        // An empty prompt (here an empty standard input): for a model with BOS, it generated
        // from BOS alone; for one without, it said so once the model was fetched and loaded.
        (&["run", "-m", nowhere][..], "the prompt is empty"),
        (&["run", "-m", nowhere, "-"][..], "the prompt is empty"),
        (
            &["chat", "-m", nowhere, "-t", "999"][..],
            "--threads must be",
        ),
        (
            &["embed", "-m", nowhere, "-t", "0"][..],
            "--threads must be",
        ),
        (
            &["embed", "-m", nowhere, "/nonexistent/input.txt"][..],
            "cannot read /nonexistent/input.txt",
        ),
        (
            &["perplexity", "-m", nowhere, "-c", "4", "-f", "-"][..],
            "--ctx-size must be at least 8",
        ),
        (
            &["bench", "-m", nowhere, "-t", "0"][..],
            "--threads must be",
        ),
    ] {
        let out = weft(args, "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = weft(&["serve", "--max-body-mib", "18446744073709551615"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--max-body-mib is larger"), "{stderr}");
}

/// `weft models` lists the known models without a cache directory too, and says there is none.
#[test]
fn models_lists_the_known_names_without_a_cache() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .arg("models")
        .env_remove("HOME")
        .env_remove("WEFT_HOME")
        .output()
        .expect("run weft");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("smollm2-135m (alias smollm2, default): "),
        "{stdout}"
    );
    assert!(stdout.contains("not fetched yet"), "{stdout}");
    assert!(stderr.contains("set WEFT_HOME"), "{stderr}");
}

/// llama.cpp's `-l ID+BIAS` / `ID-inf`, and the presence penalty over `--repeat-last-n` (0
/// turns the penalties off): each changes the greedy text as it should.
#[test]
fn run_takes_logit_biases_and_penalties_as_llama_cpp_spells_them() {
    let out = weft(&["tokenize", "--no-add-special"], " Paris");
    assert!(out.status.success());
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).expect("ids");
    let [paris] = ids[..] else {
        panic!("\" Paris\" is one token: {ids:?}")
    };
    let run = |args: &[&str]| {
        let args = [&["run", "--temp", "0"][..], args].concat();
        let out = weft(&args, "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let prompt = "The capital of France is";
    assert!(run(&["-n", "2", prompt]).contains("is Paris"));
    let never = format!("{paris}-inf");
    assert!(!run(&["-n", "4", "-l", &never, prompt]).contains("Paris"));
    let always = format!("{paris}+100");
    assert!(run(&["-n", "3", "--logit-bias", &always, "Hello"]).contains("Hello Paris Paris Paris"));
    let plain = run(&["-n", "12", prompt]);
    let penalized = run(&["-n", "12", "--presence-penalty", "5", prompt]);
    assert_ne!(penalized, plain);
    let off = [
        "-n",
        "12",
        "--presence-penalty",
        "5",
        "--repeat-last-n",
        "0",
        prompt,
    ];
    assert_eq!(run(&off), plain);
    // Over the whole context (-1), a large penalty leaves no id of the prompt or the output to
    // be picked again; the greedy text without it loops.
    for flag in ["--presence-penalty", "--frequency-penalty"] {
        let args = [
            "-n",
            "24",
            "--json",
            flag,
            "100",
            "--repeat-last-n",
            "-1",
            prompt,
        ];
        let v: serde_json::Value = serde_json::from_str(&run(&args)).expect("json");
        let ids = |key: &str| -> Vec<u64> {
            v[key]
                .as_array()
                .expect(key)
                .iter()
                .filter_map(|x| x.as_u64())
                .collect()
        };
        let mut seen = ids("prompt_ids");
        for id in ids("ids") {
            assert!(!seen.contains(&id), "{flag}: {id} again in {v}");
            seen.push(id);
        }
        assert_eq!(seen.len(), ids("prompt_ids").len() + 24, "{v}");
    }
    // An id past the vocabulary is named before anything is generated.
    let out = weft(&["run", "-n", "2", "-l", "999999+1", prompt], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("999999") && stderr.contains("--logit-bias"),
        "{stderr}"
    );
}
