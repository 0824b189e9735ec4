//! The Python package's suite (`tests/python/`, pytest) against the real models.
//!
//! It builds the package the way a user installs it: `maturin build --release` into
//! `target/py-wheels`, installed into a virtualenv under the target directory
//! (`target/py-venv`, made on the first run and reused after) with the suite's packages.
//! Before that it writes the Rust API's greedy ids for llama.cpp's greedy cases, which the
//! Python results must equal.

use std::path::Path;
use std::process::Command;

use weft_testkit::{pinned_venv, reference_dir, run, target_dir, workspace_root};

/// The suite's Python packages, pinned.
const PACKAGES: [&str; 6] = [
    "maturin==1.16.0",
    "numpy==2.4.6",
    // Writes llama.cpp's reference LoRA adapter (`shared/reference/gen_lora.py`).
    "gguf==0.19.0",
    "pytest==9.2.0",
    "jsonschema==4.26.0",
    "mypy==1.19.1",
];

/// The Rust API's greedy ids for every case of llama.cpp's greedy.json: the same calls the
/// Python test makes (fill the prompt, 32 argmax tokens, EOS ignored).
fn rust_greedy(reference: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(reference.join("greedy.json"))
        .unwrap_or_else(|e| panic!("cannot read greedy.json in {}: {e}", reference.display()));
    let cases: serde_json::Value = serde_json::from_str(&text).expect("greedy.json is JSON");
    let hub = weft_hub::Hub::from_env().expect("WEFT_HOME or HOME must be set");
    let mut out = Vec::new();
    for model in ["smollm2", "gemma3"] {
        let name = if model == "smollm2" {
            "smollm2-135m"
        } else {
            "gemma3-270m"
        };
        let path = hub
            .resolve(name, &mut weft_hub::NoProgress)
            .unwrap_or_else(|e| panic!("cannot fetch {name}: {e}"));
        let config = weft::EngineConfig {
            n_threads: 2,
            ..weft::EngineConfig::default()
        };
        let engine = weft::Engine::open(&path, config).expect("the model loads");
        for case in cases["cases"].as_array().expect("cases") {
            if case["model"] != model {
                continue;
            }
            let mut ctx = engine.context();
            ctx.fill(case["prompt"].as_str().expect("prompt"))
                .expect("fill");
            let ids = weft::block_on(
                ctx.generate(weft::Sampler::Argmax)
                    .max_tokens(32)
                    .ignore_eos()
                    .collect_tokens(),
            )
            .expect("greedy generation");
            out.push(serde_json::json!({ "model": model, "ids": ids }));
        }
    }
    serde_json::Value::Array(out)
}

#[test]
fn python_package_suite() {
    let root = workspace_root();
    let target = target_dir();
    let reference = reference_dir();
    let work = target.join("py-suite");
    std::fs::create_dir_all(&work).expect("cannot make target/py-suite");
    let greedy = work.join("rust_greedy.json");
    std::fs::write(&greedy, rust_greedy(&reference).to_string()).expect("write greedy ids");
    // SmolLM2 as a Hugging Face checkpoint folder, for `weft.Engine(folder)`.
    let smollm2 = weft_hub::Hub::from_env()
        .expect("WEFT_HOME or HOME must be set")
        .resolve("smollm2-135m", &mut weft_hub::NoProgress)
        .expect("fetch smollm2-135m");
    let checkpoint = weft_testkit::hf_checkpoint(&smollm2, "smollm2-135m", "f32");

    let python = pinned_venv("py-venv", &PACKAGES, "CPython 3.9+");
    let wheels = target.join("py-wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    let manifest = root.join("crates/weft-py/Cargo.toml");
    run(
        Command::new(&python)
            .args(["-m", "maturin", "build", "--release", "--quiet", "-m"])
            .arg(&manifest)
            .arg("--out")
            .arg(&wheels)
            .arg("--interpreter")
            .arg(&python)
            .env("CARGO_TARGET_DIR", &target),
        "maturin build",
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("maturin wrote no wheel directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("maturin wrote no wheel");
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&wheel),
        "installing the wheel",
    );
    run(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(root.join("crates/weft-py/tests/python"))
            .env("WEFT_RUST_GREEDY", &greedy)
            .env("WEFT_REFERENCE_DIR", &reference)
            .env("WEFT_HF_CHECKPOINT", &checkpoint)
            .current_dir(&work),
        "the Python suite (pytest)",
    );
}
