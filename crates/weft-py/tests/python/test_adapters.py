"""LoRA adapters from Python, against llama.cpp's greedy run with the reference adapter."""

import hashlib
import subprocess
import sys

import pytest

import weft
from conftest import engine_for, reference_dir

# `gen_lora.py OUT 8 1234`: the adapter llama.cpp ran for lora.json.
REFERENCE_SHA256 = "62cee2e327a39558c4c017db385468d505dbcc084caa51714866c8b54b7a85d8"


@pytest.fixture(scope="module")
def adapter_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "reference_r8_s1234.gguf"
    script = reference_dir() / "gen_lora.py"
    subprocess.run([sys.executable, str(script), str(out), "8", "1234"], check=True, timeout=300)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == REFERENCE_SHA256
    return out


def test_generation_with_an_adapter_follows_llama_cpp(smollm2, reference, adapter_file):
    adapter = smollm2.load_adapter(adapter_file)
    assert "reference_r8_s1234" in repr(adapter)
    cases = [c for c in reference("lora.json")["cases"] if c["model"] == "smollm2"]
    assert cases
    for case in cases:
        ctx = smollm2.context()
        ctx.fill(case["prompt"])
        n = len(case["greedy_ids"])
        got = ctx.generate(weft.Argmax(), max_tokens=n, ignore_eos=True, adapters=[(adapter, 1.0)])
        ids = got.tokens()
        # llama.cpp's ids up to its first near-tie (top-2 log-probabilities within 0.3).
        for i, step in enumerate(case["steps"]):
            if step["top5"][0][1] - step["top5"][1][1] < 0.3:
                break
            assert ids[i] == step["id"], (case["prompt"], i)
        base = smollm2.context()
        base.fill(case["prompt"])
        assert base.generate(weft.Argmax(), max_tokens=n, ignore_eos=True).tokens() != ids


def test_the_engine_stack_and_a_pass_adapter_agree(smollm2, adapter_file):
    adapter = smollm2.load_adapter(adapter_file)

    def logits(**kw):
        ctx = smollm2.context()
        ctx.fill("The weaver threads the loom and")
        fwd = ctx.forward()
        if "scale" in kw:
            fwd.adapter(adapter, kw["scale"])
        h = fwd.probe(len(fwd) - 1, weft.Logits())
        return fwd.run()[h]

    base, on_pass = logits(), logits(scale=1.0)
    assert (base != on_pass).any()
    smollm2.push_lora(adapter, 1.0)
    try:
        assert (logits() == on_pass).all()
        assert (logits(scale=0.0) == base).all()  # a pass naming its own adapter skips the stack
    finally:
        popped = smollm2.pop_lora()
    assert popped is not None and popped[1] == 1.0
    smollm2.clear_loras()
    assert (logits() == base).all()
    with pytest.raises(weft.ConfigError, match="finite"):
        logits(scale=float("nan"))
    with pytest.raises(weft.ConfigError, match="finite"):
        smollm2.push_lora(adapter, float("nan"))
    assert smollm2.pop_lora() is None and (logits() == base).all()


def test_an_adapter_of_another_model_raises_and_the_engine_goes_on(smollm2, adapter_file):
    # SmolLM2's adapter on a Gemma 3 engine: it stopped that engine for good (a panic).
    adapter = smollm2.load_adapter(adapter_file)
    gemma3 = engine_for("gemma3")
    ctx = gemma3.context()
    ctx.fill("Hello")
    wrong = "adapter for llama models, the base model is gemma3"
    with pytest.raises(weft.ModelError, match=wrong):
        ctx.generate(weft.Argmax(), max_tokens=3, adapters=[(adapter, 1.0)]).text()
    with pytest.raises(weft.ModelError, match=wrong):
        gemma3.push_lora(adapter)
    assert gemma3.pop_lora() is None
    assert len(ctx.generate(weft.Argmax(), max_tokens=3, ignore_eos=True).tokens()) == 3


def test_an_adapter_file_that_is_not_there_is_an_io_error(smollm2, tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(weft.IoError, match="missing.gguf"):
        smollm2.load_adapter(missing)


def test_generate_batch_runs_with_adapters(smollm2, reference, adapter_file):
    adapter = smollm2.load_adapter(adapter_file)
    prompts = [c["prompt"] for c in reference("lora.json")["cases"] if c["model"] == "smollm2"]
    with_ = weft.generate_batch(smollm2, prompts, max_tokens=12, adapters=[(adapter, 1.0)])
    without = weft.generate_batch(smollm2, prompts, max_tokens=12)
    for p, a in zip(prompts, with_):
        ctx = smollm2.context()
        ctx.fill(p)
        g = ctx.generate(weft.Argmax(), max_tokens=12, adapters=[(adapter, 1.0)])
        g.text()
        assert a.tokens == g.tokens()
    assert any(a.tokens != b.tokens for a, b in zip(with_, without))
