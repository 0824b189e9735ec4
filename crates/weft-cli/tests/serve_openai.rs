//! `weft serve` against the official `openai` Python client: the pytest suite in
//! `tests/openai/` (see its README), run once per model. Its Python packages live in a virtualenv
//! under the target directory (`target/openai-venv`), made on the first run and reused after.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The two suites would share the machine's cores: they run one at a time.
static SUITE_LOCK: Mutex<()> = Mutex::new(());

/// The suite's Python packages, pinned.
const PACKAGES: [&str; 4] = [
    "openai==2.54.0",
    "pytest==9.2.0",
    "jsonschema==4.26.0",
    "httpx==0.28.1",
];

/// Written into the virtualenv once the packages are installed; names them.
const MARKER: &str = "weft-openai-packages.txt";

fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// `$CARGO_TARGET_DIR` (relative to the workspace root) or `<workspace>/target`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    }
}

fn python_works(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import sys"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `cmd` with inherited output and fails the test, naming `what`, unless it succeeds.
fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", cmd.get_program()));
    assert!(
        status.success(),
        "{what} failed ({status}); see its output above"
    );
}

/// The virtualenv's Python, with the suite's packages: created and filled on the first run,
/// reused while its marker names the same packages.
fn suite_python() -> PathBuf {
    let venv = target_dir(&workspace_root()).join("openai-venv");
    let python = venv_python(&venv);
    let marker = venv.join(MARKER);
    let wanted = PACKAGES.join("\n") + "\n";
    let works = python_works(&python);
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
            "`python3 -m venv` (the OpenAI suite needs Python 3.10+ with venv and pip)",
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
            .args(PACKAGES),
        &format!("pip install {}", PACKAGES.join(" ")),
    );
    std::fs::write(&marker, wanted)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", marker.display()));
    python
}

fn run_suite(model: &str) {
    let _one_at_a_time = SUITE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let python = suite_python();
    let weft = env!("CARGO_BIN_EXE_weft");
    // Fetched first, so that the suite's start-up timeouts only cover loading the model.
    run(
        Command::new(weft).args(["pull", model]),
        &format!("weft pull {model}"),
    );
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"])
        .arg("crates/weft-cli/tests/openai")
        .current_dir(workspace_root())
        .env("WEFT_BIN", weft)
        .env("WEFT_TEST_MODEL", model)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .status()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", python.display()));
    assert!(
        status.success(),
        "the OpenAI-compatibility suite failed on {model} ({status}): see the pytest output above"
    );
}

#[test]
fn openai_conformance_smollm2() {
    run_suite("smollm2-135m");
}

#[test]
fn openai_conformance_gemma3() {
    run_suite("gemma3-270m");
}
