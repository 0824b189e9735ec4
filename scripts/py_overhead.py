#!/usr/bin/env python3
"""How much driving weft from Python costs: SmolLM2 decode tokens/s of the same generation
loop (fill a prompt, greedy, N tokens, EOS ignored) driven

  - from Rust (`crates/weft/examples/decode_stream.rs`, the streaming `next_text()` loop),
  - from Python's async iterator (`async for delta in ctx.generate(...)`),
  - from Python's sync iterator,
  - and, for comparison, llama-cpp-python's `Llama.generate` loop, when it can be imported.

Rounds are interleaved (one of each per round) and medians reported, so drift of a noisy
machine hits all alike. Run it on an idle machine, with the package installed (see README):

    python scripts/py_overhead.py [--tokens 128] [--rounds 5]

llama-cpp-python: `pip install llama-cpp-python==0.3.36` (builds llama.cpp, ~15 min on 2
cores), or point PYTHONPATH at a built source tree and LLAMA_CPP_LIB_PATH at its libllama.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import weft

PROMPT = "The history of the city of Paris begins"  # as decode_stream.rs
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def rust_round(binary, tokens):
    out = subprocess.run(
        [binary, "smollm2-135m", str(tokens), "1"], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["tps"]


def python_async_round(engine, tokens):
    async def run():
        start = time.perf_counter()
        ctx = engine.context()
        ctx.fill(PROMPT)
        g = ctx.generate(weft.Argmax(), max_tokens=tokens, ignore_eos=True)
        async for _ in g:
            pass
        return len(g.tokens()) / (time.perf_counter() - start)

    return asyncio.run(run())


def python_sync_round(engine, tokens):
    start = time.perf_counter()
    ctx = engine.context()
    ctx.fill(PROMPT)
    g = ctx.generate(weft.Argmax(), max_tokens=tokens, ignore_eos=True)
    for _ in g:
        pass
    return len(g.tokens()) / (time.perf_counter() - start)


def llama_cpp_round(llm, tokens):
    start = time.perf_counter()
    llm.reset()
    ids = llm.tokenize(PROMPT.encode(), add_bos=False)
    n = 0
    for _ in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        n += 1
        if n == tokens:
            break
    return n / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "weft", "--example", "decode_stream"],
        check=True,
        cwd=ROOT,
    )
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binary = os.path.join(target, "release", "examples", "decode_stream")

    engine = weft.Engine("smollm2-135m", threads=2)
    runs = {
        "rust next_text loop": lambda: rust_round(binary, args.tokens),
        "python async for": lambda: python_async_round(engine, args.tokens),
        "python for": lambda: python_sync_round(engine, args.tokens),
    }
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
        print("llama-cpp-python is not importable: skipping it", file=sys.stderr)
    if llama_cpp is not None:
        path = subprocess.run(
            ["cargo", "run", "--release", "-q", "-p", "weft-cli", "--", "pull", "smollm2-135m"],
            check=True, capture_output=True, text=True, cwd=ROOT,
        ).stdout.strip().splitlines()[-1]
        llm = llama_cpp.Llama(model_path=path, n_threads=2, n_ctx=2048, verbose=False)
        runs["llama-cpp-python generate"] = lambda: llama_cpp_round(llm, args.tokens)

    for f in runs.values():  # warm up: page in the model, build the kernels' tables
        f()
    results = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, f in runs.items():
            results[name].append(f())

    rust = statistics.median(results["rust next_text loop"])
    print(f"SmolLM2-135M Q4_1, greedy, {args.tokens} tokens, 2 threads, {cpu_name()}")
    print(f"{'loop':<28} {'median t/s':>10} {'vs Rust':>8}   rounds")
    for name, values in results.items():
        m = statistics.median(values)
        rounds = " ".join(f"{v:.1f}" for v in values)
        print(f"{name:<28} {m:>10.1f} {m / rust:>8.1%}   {rounds}")


if __name__ == "__main__":
    main()
