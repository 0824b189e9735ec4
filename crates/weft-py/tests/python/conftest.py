"""Shared fixtures of the Python suite: the real models, loaded once per session, and the
reference outputs (llama.cpp's, in ../shared/reference, and the Rust API's, written by the
cargo test that runs this suite)."""

import contextlib
import json
import os
import pathlib
import signal

import pytest

import weft

ROOT = pathlib.Path(__file__).resolve().parents[4]


def reference_dir() -> pathlib.Path:
    env = os.environ.get("WEFT_REFERENCE_DIR")
    return pathlib.Path(env) if env else ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference():
    """Loads one of llama.cpp's reference files by name."""

    def load(name):
        return json.loads((reference_dir() / name).read_text())

    return load


@pytest.fixture(scope="session")
def rust_greedy():
    """Greedy ids of the Rust API for the cases of greedy.json (see tests/pytest.rs)."""
    path = os.environ.get("WEFT_RUST_GREEDY")
    if not path:
        pytest.fail("WEFT_RUST_GREEDY is not set: run this suite through `cargo test -p weft-py`")
    return json.loads(pathlib.Path(path).read_text())


ENGINES = {}


def engine_for(model: str) -> weft.Engine:
    """One engine per model for the whole session (2 threads, as the reference ran)."""
    if model not in ENGINES:
        name = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[model]
        ENGINES[model] = weft.Engine(name, threads=2)
    return ENGINES[model]


@pytest.fixture(scope="session")
def smollm2() -> weft.Engine:
    return engine_for("smollm2")


@contextlib.contextmanager
def ctrl_c_after(seconds: float):
    """Ctrl-C as the kernel delivers it, `seconds` into the block: a signal whose Python
    handler raises KeyboardInterrupt (an alarm, not a thread that sends SIGINT: on 2 busy
    cores such a thread could wait seconds for its turn). The block must end in that
    KeyboardInterrupt; the alarm and the handler are put back after it."""
    before = signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
