//! The Python package's suite (`tests/python/`, pytest) against the real models.
//!
//! It installs the package as `maturin develop` does, into the suites' virtualenv under the
//! target directory (`target/py-venv`, see `weft_testkit::python`): the package's Python files
//! (`python/weft/`) and the extension module `cargo test` built beside this test (the crate is
//! also an rlib, so that the test build makes its cdylib with the workspace's features;
//! `maturin build` would compile the whole engine a second time, three minutes on two cores),
//! laid out as in the wheel (`weft/_weft.abi3.so`) and put on the virtualenv's path by a `.pth`
//! file.
//! Before that it writes the Rust API's greedy ids for llama.cpp's greedy cases, which the
//! Python results must equal.

use std::path::Path;
use std::process::Command;

use weft_testkit::{reference_dir, run, target_dir, workspace_root};

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

    let python = weft_testkit::python();
    install_package(&python, &target.join("py-suite").join("site"));
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

/// Lays the package out in `site` as the wheel holds it — `weft/` with the Python files and the
/// extension module `weft/_weft.abi3.so` (`_weft.pyd` on Windows) — and puts `site` on the path
/// of the virtualenv of `python` with a `.pth` file, a wheel installed there before removed.
fn install_package(python: &Path, site: &Path) {
    // The cdylib is built into the directory of this test's own binary (`target/<profile>/deps`).
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let cdylib = deps.join(format!(
        "{}_weft{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(
        cdylib.is_file(),
        "{} is missing: `cargo test` builds it (weft-py's crate types include cdylib)",
        cdylib.display()
    );
    let package = site.join("weft");
    let _ = std::fs::remove_dir_all(&package);
    std::fs::create_dir_all(&package)
        .unwrap_or_else(|e| panic!("cannot make {}: {e}", package.display()));
    let sources = workspace_root().join("crates/weft-py/python/weft");
    for entry in std::fs::read_dir(&sources).expect("crates/weft-py/python/weft") {
        let path = entry.expect("a directory entry").path();
        if path.is_file() {
            let to = package.join(path.file_name().expect("a file name"));
            std::fs::copy(&path, &to)
                .unwrap_or_else(|e| panic!("cannot copy {}: {e}", path.display()));
        }
    }
    let module = if cfg!(windows) {
        "_weft.pyd"
    } else {
        "_weft.abi3.so"
    };
    std::fs::copy(&cdylib, package.join(module))
        .unwrap_or_else(|e| panic!("cannot copy {}: {e}", cdylib.display()));

    // A wheel installed by hand (`pip install ./crates/weft-py`) would come first on the path.
    run(
        Command::new(python).args(["-m", "pip", "uninstall", "--quiet", "--yes", "weft"]),
        "uninstalling an installed weft wheel",
    );
    let purelib = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", python.display()));
    assert!(
        purelib.status.success(),
        "cannot ask the virtualenv for its site-packages"
    );
    let purelib = String::from_utf8(purelib.stdout).expect("a UTF-8 path");
    let pth = Path::new(purelib.trim()).join("weft-suite.pth");
    std::fs::write(&pth, format!("{}\n", site.display()))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", pth.display()));
}
