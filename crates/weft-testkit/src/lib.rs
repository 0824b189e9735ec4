//! Test support shared by the suites: where the workspace, its target directory and
//! llama.cpp's reference outputs are; and for the suites that drive Python (the OpenAI-client
//! suite, the Python package's suite, the BPE tokenizer files) a command that must succeed and
//! a virtualenv of pinned packages under the target directory, made on the first run and
//! reused after.
//!
//! Only tests use it (a dev-dependency); it panics, naming what failed, where a test would.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// llama.cpp's reference outputs, the independent truth the model tests check against:
/// `$WEFT_REFERENCE_DIR`, else `shared/reference` beside the workspace, else beside the
/// checkout this one was cloned from (a local path as its `origin`: a clone made in a temporary
/// directory to test a fresh checkout). Panics, naming where it looked, when none is there:
/// the tests that need it fail rather than skip.
pub fn reference_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WEFT_REFERENCE_DIR") {
        return dir.into();
    }
    let root = workspace_root();
    let beside = |checkout: &Path| checkout.join("../shared/reference");
    let mut tried = vec![beside(&root)];
    // Git is asked only when the checkout has no reference beside it.
    if !tried[0].is_dir() {
        tried.extend(origin_checkout(&root).as_deref().map(beside));
    }
    match tried.iter().find(|dir| dir.is_dir()) {
        Some(dir) => dir.canonicalize().unwrap_or_else(|_| dir.clone()),
        None => panic!(
            "llama.cpp's reference outputs not found at {} (set WEFT_REFERENCE_DIR)",
            tried
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// The checkout `root` was cloned from, when its `origin` is a local directory.
fn origin_checkout(root: &Path) -> Option<PathBuf> {
    let out = Command::new("git")
        .args(["remote", "get-url", "origin"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|out| out.status.success())?;
    let origin = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    origin.is_dir().then_some(origin)
}

/// `$CARGO_TARGET_DIR` (relative to the workspace root) or `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// Runs `cmd` with inherited output and fails the test, naming `what`, unless it succeeds.
pub fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", cmd.get_program()));
    assert!(
        status.success(),
        "{what} failed ({status}); see its output above"
    );
}

/// Written into a virtualenv once its packages are installed; names them.
const MARKER: &str = "weft-packages.txt";

/// The pinned Hugging Face packages (transformers, tokenizers, gguf-py) the reference scripts
/// run with: transformers' own GGUF conversion makes the `tokenizer.json` files and checkpoint
/// folders the tests compare weft against (what they make depends on these versions); gguf-py
/// also writes llama.cpp's reference LoRA adapter for the Python suite
/// (`shared/reference/gen_lora.py`).
pub const HF_PACKAGES: [&str; 3] = ["transformers==5.23.0", "tokenizers==0.23.3", "gguf==0.19.0"];

/// The other suites' packages, pinned: pytest for the Python package's suite and the
/// OpenAI-compatibility suite, the official `openai` client and `httpx` for the latter,
/// `numpy`, `jsonschema` and `mypy` (stubtest, the example's strict check) for the former.
pub const SUITE_PACKAGES: [&str; 6] = [
    "numpy==2.4.6",
    "pytest==9.2.0",
    "jsonschema==4.26.0",
    "mypy==1.19.1",
    "openai==2.54.0",
    "httpx==0.28.1",
];

/// The Python of the suites' one virtualenv, `target/py-venv`, with [`HF_PACKAGES`] and
/// [`SUITE_PACKAGES`] (one install of what the suites share, not one per suite).
pub fn python() -> PathBuf {
    let packages: Vec<&str> = HF_PACKAGES.iter().chain(&SUITE_PACKAGES).copied().collect();
    pinned_venv("py-venv", &packages, "Python 3.10+")
}

/// The Python of the virtualenv `target/<dir>` with `packages` (pinned `name==version`
/// specifiers) installed: made on the first run (`needs` says what Python the suite needs, for
/// the message if `python3 -m venv` fails), reused while its marker names the same packages,
/// and the packages reinstalled when they change. Callers in one test binary take turns.
fn pinned_venv(dir: &str, packages: &[&str], needs: &str) -> PathBuf {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let venv = target_dir().join(dir);
    let python = if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    };
    let marker = venv.join(MARKER);
    let wanted = packages.join("\n") + "\n";
    let works = Command::new(&python)
        .args(["-c", "import sys"])
        .status()
        .is_ok_and(|s| s.success());
    if works && std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
        return python;
    }
    if !works {
        if venv.exists() {
            std::fs::remove_dir_all(&venv)
                .unwrap_or_else(|e| panic!("cannot remove the broken {}: {e}", venv.display()));
        }
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            &format!("`python3 -m venv` (this suite needs {needs} with venv and pip)"),
        );
    }
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
        &format!("pip install {}", packages.join(" ")),
    );
    std::fs::write(&marker, wanted)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", marker.display()));
    python
}

/// A Hugging Face checkpoint folder (`config.json`, `model.safetensors` in `dtype`,
/// `tokenizer.json` …) made from the GGUF file `gguf` by transformers' GGUF conversion
/// (`scripts/hf_checkpoint_from_gguf.py`), as `target/hf-checkpoints/<name>-<dtype>`: made on
/// first use, and again when the script or the GGUF file changes. Callers in one test binary
/// take turns.
pub fn hf_checkpoint(gguf: &Path, name: &str, dtype: &str) -> PathBuf {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = workspace_root().join("scripts/hf_checkpoint_from_gguf.py");
    let dir = target_dir()
        .join("hf-checkpoints")
        .join(format!("{name}-{dtype}"));
    let marker = dir.join("weft-made-from.txt");
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    // The script imports the GGUF metadata reader of the tokenizer script.
    let source: String = [
        &script,
        &workspace_root().join("scripts/bpe_tokenize_reference.py"),
    ]
    .iter()
    .map(|p| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    })
    .collect();
    // What the folder was made from: the packages, the scripts' text and the model file's
    // name and size.
    let want = format!(
        "{}\n{} {}\n{source}",
        HF_PACKAGES.join(" "),
        gguf.display(),
        size(gguf)
    );
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    run(
        Command::new(python())
            .arg(&script)
            .arg(gguf)
            .arg(&dir)
            .arg(dtype)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("TQDM_DISABLE", "1"),
        "scripts/hf_checkpoint_from_gguf.py",
    );
    std::fs::write(&marker, want)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", marker.display()));
    dir
}
