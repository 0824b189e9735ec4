//! `weft serve` against the official `openai` Python client: the pytest suite in
//! `tests/openai/` (see its README), run once per model (the tests marked `model_independent`
//! on SmolLM2 only), in the suites' virtualenv under the target directory (`target/py-venv`, see
//! `weft_testkit::python`).

use std::process::Command;
use std::sync::Mutex;

use weft_testkit::{reference_dir, run, workspace_root};

/// The two suites would share the machine's cores: they run one at a time.
static SUITE_LOCK: Mutex<()> = Mutex::new(());

/// Runs the suite on `model`; `every_test` false leaves out the tests marked
/// `model_independent` (the server's own behaviour, checked on the first model).
fn run_suite(model: &str, every_test: bool) {
    let _one_at_a_time = SUITE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let python = weft_testkit::python();
    let weft = env!("CARGO_BIN_EXE_weft");
    // Fetched first, so that the suite's start-up timeouts only cover loading the model.
    run(
        Command::new(weft).args(["pull", model]),
        &format!("weft pull {model}"),
    );
    let mut pytest = Command::new(&python);
    pytest.args(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]);
    if !every_test {
        pytest.args(["-m", "not model_independent"]);
    }
    let status = pytest
        .arg("crates/weft-cli/tests/openai")
        .current_dir(workspace_root())
        .env("WEFT_BIN", weft)
        .env("WEFT_TEST_MODEL", model)
        .env("WEFT_REFERENCE_DIR", reference_dir())
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
    run_suite("smollm2-135m", true);
}

#[test]
fn openai_conformance_gemma3() {
    run_suite("gemma3-270m", false);
}
