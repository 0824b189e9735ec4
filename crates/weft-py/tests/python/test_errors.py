"""Errors are weft exceptions with weft's messages, and leave the engine usable."""

import pytest

import weft


def test_every_exception_is_a_weft_error():
    names = [
        "ModelError", "KvCacheFull", "HubError", "ChatTemplateError", "InvalidSampler",
        "IndexOutOfRange", "TokenOutOfVocab", "PositionCount", "PositionOutOfRange", "MaskLength",
        "InputEmbeds", "AttentionBias", "PaddedBatch", "ContextTooLong", "EmptyPass",
        "NothingAllowed", "TruncateTooLong", "ConfigError", "GrammarError", "JsonError",
        "SnapshotCorrupt", "SnapshotVersion", "ModelFingerprintMismatch", "BeamSearchError",
        "IoError", "EngineStopped", "ContextBusy", "NanLogits", "RewindPastWindow", "StalePass",
    ]
    for name in names:
        assert issubclass(getattr(weft, name), weft.WeftError), name
    assert issubclass(weft.KvCacheFull, weft.ModelError)
    assert issubclass(weft.NanLogits, weft.ModelError)
    assert issubclass(weft.RewindPastWindow, weft.ModelError)
    assert issubclass(weft.StalePass, weft.ContextBusy)
    assert issubclass(weft.WeftError, Exception)


def test_context_too_long():
    engine = weft.Engine("smollm2-135m", threads=2, n_ctx=32)
    ctx = engine.context()
    with pytest.raises(weft.ContextTooLong, match="more than its limit of 32"):
        ctx.fill("word " * 100)
        ctx.generate(weft.Argmax(), max_tokens=4).text()
    # Nothing leaked: a short prompt still runs, and all pages come back.
    ctx = engine.context()
    ctx.fill("Hi")
    assert len(ctx.generate(weft.Argmax(), max_tokens=4, ignore_eos=True).tokens()) == 4
    del ctx
    assert engine.metrics().kv_pages_used == 0


def test_a_context_length_past_the_cache_grows_the_cache():
    # n_ctx used to be cut to kv_tokens without a word.
    engine = weft.Engine("smollm2-135m", threads=2, kv_tokens=64, n_ctx=200)
    assert engine.n_ctx == 200
    ctx = engine.context()
    ctx.fill("word " * 150)
    assert len(ctx.generate(weft.Argmax(), max_tokens=8, ignore_eos=True).tokens()) == 8


def test_invalid_sampler_grammar_and_tokens(smollm2):
    ctx = smollm2.context()
    ctx.fill("Hello")
    # Raised where they are written: the sampler's constructor, the `generate` call.
    with pytest.raises(weft.InvalidSampler, match="top-p must be in"):
        weft.TopP(1.5)
    with pytest.raises(weft.InvalidSampler):
        weft.Temperature(-1.0)
    with pytest.raises(weft.GrammarError):
        ctx.generate(weft.Argmax(), regex="(unclosed")
    # The context is free again after the refused call.
    assert ctx.generate(weft.Argmax(), max_tokens=1).tokens()
    with pytest.raises(weft.TokenOutOfVocab, match="not in the vocabulary"):
        ctx.fill_tokens([10**9])
    with pytest.raises(weft.TokenOutOfVocab, match="not in the vocabulary"):
        smollm2.detokenize([10**9])
    assert repr(weft.TopP(0.9, temperature=0.7)) == "weft.TopP(0.9, temperature=0.7)"
    assert repr(weft.Distribution(k=5)) == "weft.Distribution(temperature=1.0, k=5)"
    with pytest.raises(weft.TruncateTooLong):
        smollm2.context().truncate(5)


def test_index_out_of_range_in_a_pass(smollm2):
    ctx = smollm2.context()
    ctx.fill("Hello")
    fwd = ctx.forward()
    fwd.sample([99], weft.Argmax())
    with pytest.raises(weft.IndexOutOfRange, match="at index 99"):
        fwd.run()
    # A logit mask naming an id past the vocabulary is that mistake, not "nothing allowed".
    fwd = ctx.forward()
    fwd.sample([len(fwd) - 1], weft.Argmax())
    fwd.mask([10**9])
    with pytest.raises(weft.TokenOutOfVocab, match="not in the vocabulary"):
        fwd.run()


def test_a_pass_made_before_the_context_changed_refuses_to_run(smollm2):
    ctx = smollm2.context()
    ctx.fill("The capital of France")
    fwd = ctx.forward()
    fwd.sample([len(fwd) - 1], weft.Argmax())
    ctx.fill(" is")  # its indices no longer point where they were written for
    with pytest.raises(weft.StalePass, match="changed after forward"):
        fwd.run()
    fresh = ctx.forward()
    h = fresh.sample([len(fresh) - 1], weft.Argmax())
    assert fresh.run()[h]  # the pass made now runs


def test_settings_and_probes_are_checked_where_they_are_written():
    for bad in ({"n_ctx": 0}, {"threads": 0}, {"kv_tokens": 0}):
        with pytest.raises(weft.ConfigError, match="at least 1"):
            weft.Engine("smollm2-135m", **bad)
    with pytest.raises(weft.ConfigError, match="temperature"):
        weft.Distribution(temperature=-1.0)
    # The stubs' generic handle is subscriptable at run time too.
    assert weft.ProbeHandle[float] is not None


def test_common_mistakes_get_plain_messages(smollm2):
    import types

    ctx = smollm2.context()
    with pytest.raises(TypeError, match="list of messages"):
        ctx.fill_chat("hi")
    with pytest.raises(TypeError, match='"content" must be a string'):
        ctx.fill_chat([{"role": "user", "content": 5}])
    # A message that is not a mapping is the wrong type, not a missing key.
    for not_a_message in (["hi"], [("user", "hi")]):
        with pytest.raises(TypeError, match="list of messages"):
            ctx.fill_chat(not_a_message)
    with pytest.raises(TypeError, match="not one string"):
        weft.generate_batch(smollm2, "hello")
    # A lone surrogate cannot be encoded: the error says so, not that a str is the wrong type.
    with pytest.raises(UnicodeEncodeError):
        smollm2.embed("\ud800")
    # Any mapping is a message.
    ctx.fill_chat([types.MappingProxyType({"role": "user", "content": "Hi"})])
    assert ctx.pending


def test_a_batch_request_that_cannot_run_is_named_and_keeps_its_class(smollm2):
    with pytest.raises(weft.EmptyPass, match="^request 1 of the batch"):
        weft.generate_batch(smollm2, ["Hi", []])
    with pytest.raises(weft.ContextTooLong, match="^request 0 of the batch"):
        weft.generate_batch(smollm2, [[1] * (smollm2.n_ctx + 1), "Hi"])
    assert smollm2.metrics().kv_pages_used == 0


def test_a_failed_generation_says_so_afterwards(smollm2):
    ctx = smollm2.context()
    ctx.fill("Hello")
    g = ctx.generate(weft.Argmax(), max_tokens=5, logit_bias={5: float("nan")})
    with pytest.raises(weft.InvalidSampler):
        g.text()
    assert g.stop_reason == "error"


def test_a_busy_context_raises_until_the_generation_ends(smollm2):
    ctx = smollm2.context()
    ctx.fill("Once upon a time")
    g = ctx.generate(weft.Argmax(), max_tokens=50)
    next(g)
    with pytest.raises(weft.ContextBusy):
        ctx.fill(" more")
    with pytest.raises(weft.ContextBusy):
        ctx.generate(weft.Argmax())
    g.close()
    ctx.fill(" more")  # free again


def test_bad_model_files(tmp_path):
    with pytest.raises(weft.WeftError):
        weft.Engine(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(weft.ModelError):
        weft.Engine(str(bad))
    # A `pathlib.Path` is read as the path it names, for both kinds of model.
    with pytest.raises(weft.ModelError):
        weft.Engine(bad)
    with pytest.raises(weft.ModelError):
        weft.Embedder(bad)


def test_json_collector_on_unconstrained_text(smollm2):
    ctx = smollm2.context()
    ctx.fill("The capital of France is")
    with pytest.raises(weft.JsonError, match="not the requested JSON"):
        ctx.generate(weft.Argmax(), max_tokens=4).json()


INTERRUPTED_PASS = r"""
import signal
import weft

engine = weft.Engine("smollm2-135m", threads=2)
ctx = engine.context()
ids = engine.tokenize("Once upon a time " * 300)
signal.signal(signal.SIGALRM, signal.default_int_handler)
signal.setitimer(signal.ITIMER_REAL, 0.05)
try:
    ctx.prefill(ids)
    print("not interrupted")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
again = engine.context()
again.fill("Hi")
print(len(again.generate(weft.Argmax(), max_tokens=2, ignore_eos=True).tokens()))
"""


def test_ctrl_c_during_a_pass_is_a_keyboard_interrupt():
    """A Ctrl-C that arrives during a long pass is a KeyboardInterrupt once it returns (it was
    a Rust panic: NumPy's C API, looked up at the first array, failed with the interrupt
    pending). In a new interpreter, where no array was made before."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_PASS], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["KeyboardInterrupt", "2"], (done.stdout, done.stderr[-2000:])


INTERRUPTED_BATCH = r"""
import signal, time
import weft

engine = weft.Engine("smollm2-135m", threads=2)
def steps():
    return engine.metrics().steps
prompts = [f"Story number {i}:" for i in range(8)]
signal.signal(signal.SIGALRM, signal.default_int_handler)

def slow(rollouts):
    # 20 ms of Python a token: the interrupt lands in here, not in the wait.
    t = time.monotonic()
    while time.monotonic() - t < 0.02:
        pass

for name, call in [
    ("generate_batch", lambda: weft.generate_batch(
        engine, prompts, max_tokens=1000, ignore_eos=True)),
    ("beam_search", lambda: weft.beam_search(
        engine, "Once upon a time", 4, max_new_tokens=1000, eos_token_ids=[])),
    ("on_partial", lambda: weft.generate_batch(
        engine, prompts, max_tokens=1000, ignore_eos=True, every=1, on_partial=slow)),
]:
    before = steps()
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        call()
        print(name, "not interrupted")
    except KeyboardInterrupt:
        print(name, "KeyboardInterrupt")
    ran = steps() - before
    # The call's contexts gave their pages back.
    for _ in range(200):
        if engine.metrics().kv_pages_used == 0:
            break
        time.sleep(0.01)
    print(name, "ran", "all" if ran >= 1000 else "part", engine.metrics().kv_pages_used)
again = engine.context()
again.fill("Hi")
print(len(again.generate(weft.Argmax(), max_tokens=2, ignore_eos=True).tokens()))
"""


def test_ctrl_c_stops_a_batch_or_a_beam_search_at_once():
    """A Ctrl-C during `generate_batch` or `beam_search` (1000 tokens each) raises
    KeyboardInterrupt before they finish, and their KV pages go back to the pool; also when
    it lands in an `on_partial` callback (it was kept as the callback's error until the
    batch had run to its end)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_BATCH], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "generate_batch KeyboardInterrupt",
        "generate_batch ran part 0",
        "beam_search KeyboardInterrupt",
        "beam_search ran part 0",
        "on_partial KeyboardInterrupt",
        "on_partial ran part 0",
        "2",
    ], (done.stdout, done.stderr[-2000:])


FORKED = r"""
import asyncio
import os
import weft

engine = weft.Engine("smollm2-135m", threads=2)
ctx = engine.context()
ctx.fill("Hi")
# The parent uses asyncio, so the async runtime's threads exist before the fork.
print(asyncio.run(ctx.generate(weft.Argmax(), max_tokens=2, ignore_eos=True).atext()) != "")
pid = os.fork()
if pid == 0:
    out = []
    c = engine.context()
    c.fill("Hello")
    try:
        c.generate(weft.Argmax(), max_tokens=2).text()
        out.append("ran")
    except weft.EngineStopped as e:
        out.append("EngineStopped" if "forked" in str(e) else repr(e))
    del c, engine, ctx  # nothing to join in the child: no hang
    fresh = weft.Engine("smollm2-135m", threads=2)
    f = fresh.context()
    f.fill("Hello")
    out.append(str(len(f.generate(weft.Argmax(), max_tokens=2, ignore_eos=True).tokens())))
    try:
        asyncio.run(f.generate(weft.Argmax(), max_tokens=2, ignore_eos=True).atext())
        out.append("async ran")
    except weft.EngineStopped as e:
        out.append("async refused" if "forked" in str(e) else repr(e))
    print(" ".join(out), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_an_engine_in_a_forked_child_says_so_instead_of_hanging():
    """A forked child has the parent's engine in memory but not its scheduler thread (nor the
    asyncio runtime's threads): using them raised nothing and waited forever. Now they raise
    EngineStopped naming the fork, and a new engine in the child works."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines == ["True", "EngineStopped 2 async refused", "child 0"], (
        done.stdout, done.stderr[-2000:])


def test_going_back_past_gemmas_window_is_rewind_past_window():
    from conftest import engine_for

    gemma = engine_for("gemma3")
    ctx = gemma.context()
    ctx.fill("word " * 1500)
    ctx.generate(weft.Argmax(), max_tokens=1).tokens()
    n = len(ctx.tokens)
    with pytest.raises(weft.RewindPastWindow, match=r"\(512 positions\)"):
        ctx.truncate(10)
    # Nothing changed: the context goes on where it was.
    assert len(ctx.tokens) == n
    assert len(ctx.generate(weft.Argmax(), max_tokens=2, ignore_eos=True).tokens()) == 2
