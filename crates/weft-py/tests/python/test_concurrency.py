"""Many generations at once share the engine's model calls; dropped ones give their pages back."""

import asyncio
import gc
import threading
import time

import numpy as np

import weft
from conftest import ctrl_c_after

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
]


def greedy(engine, prompt, n):
    ctx = engine.context()
    ctx.fill(prompt)
    return ctx.generate(weft.Argmax(), max_tokens=n, ignore_eos=True).text()


def test_an_anext_cancelled_by_a_timeout_loses_no_text(smollm2):
    async def main():
        ctx = smollm2.context()
        ctx.fill("Once upon a time")
        g = ctx.generate(weft.Argmax(), max_tokens=40, ignore_eos=True)
        got, timeouts = [], 0
        while True:
            try:
                got.append(await asyncio.wait_for(g.__anext__(), 0.002))
            except asyncio.TimeoutError:
                timeouts += 1
            except StopAsyncIteration:
                break
        return "".join(got), g.text(), timeouts

    received, text, timeouts = asyncio.run(main())
    assert timeouts > 0  # the pattern under test happened
    assert received == text


def test_a_second_consumer_of_one_stream_is_refused_not_ended(smollm2):
    """Two tasks awaiting the same generation's next delta: the second raises, as an async
    generator's does, where it used to get StopAsyncIteration (a stream ended early)."""

    async def main():
        ctx = smollm2.context()
        ctx.fill("Once upon a time")
        g = ctx.generate(weft.Argmax(), max_tokens=12, ignore_eos=True)
        first, second = await asyncio.gather(g.__anext__(), g.__anext__(), return_exceptions=True)
        rest = [d async for d in g]
        return first, second, rest, g.text(), g.tokens_generated

    first, second, rest, text, n = asyncio.run(main())
    assert isinstance(second, RuntimeError) and "already" in str(second), second
    assert first + "".join(rest) == text and n == 12


def test_threads_iterating_one_generation_each_run_to_its_end(smollm2):
    """Two threads in `for d in g` over one generation: each delta goes to one of them, and
    neither loop ends before the generation does (the one that lost a race for a delta got
    StopIteration mid-way)."""
    for _ in range(3):
        ctx = smollm2.context()
        ctx.fill("Once upon a time")
        g = ctx.generate(weft.Argmax(), max_tokens=96, ignore_eos=True)
        got, ended_early = [], []

        def consume():
            for d in g:
                got.append(d)
            if not g.is_done:
                ended_early.append(True)

        threads = [threading.Thread(target=consume) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not ended_early
        assert g.tokens_generated == 96
        assert sum(map(len, got)) == len(g.text())


def test_aclose_ends_a_generation_for_contextlib_aclosing(smollm2):
    import contextlib

    async def main():
        ctx = smollm2.context()
        ctx.fill("Once upon a time")
        async with contextlib.aclosing(ctx.generate(weft.Argmax(), max_tokens=40)) as g:
            async for _ in g:
                break
        ctx.fill(" more")  # free again
        return g.stop_reason

    assert asyncio.run(main()) == "closed"


def test_aclose_and_close_stop_a_generation_that_atext_drains(smollm2):
    """`aclose()` (and `close()` from another thread) stop a generation an `atext()` is
    draining after the delta in hand, as they stop an `async for`; they waited for all 400
    tokens, which then ended as "max_tokens"."""

    async def main(closer):
        ctx = smollm2.context()
        ctx.fill("The capital of France is")
        g = ctx.generate(weft.Argmax(), max_tokens=400, ignore_eos=True)
        task = asyncio.create_task(g.atext())
        while g.tokens_generated < 3:
            await asyncio.sleep(0.01)
        await closer(g)
        text = await task
        return g.stop_reason, g.tokens_generated, text, g.text_so_far

    async def in_a_thread(g):
        await asyncio.get_running_loop().run_in_executor(None, g.close)

    for closer in (lambda g: g.aclose(), in_a_thread):
        reason, n, text, so_far = asyncio.run(main(closer))
        assert reason == "closed" and n < 200, (reason, n)
        assert text == so_far


UNAWAITED = """
import asyncio, gc, json, weft

engine = weft.Engine("smollm2-135m", threads=2)
ctx = engine.context()
ctx.fill("The capital of France is")

async def main():
    g = ctx.generate(weft.Argmax(), max_tokens=200, ignore_eos=True)
    g.atext()  # a forgotten await
    await asyncio.sleep(0.5)

asyncio.run(main())
gc.collect()
ran = len(ctx)
again = ctx.generate(weft.Argmax(), max_tokens=4, ignore_eos=True).text()
print(json.dumps({"ran": ran, "again": again}))
"""


def test_an_awaitable_dropped_unawaited_stops_its_work(smollm2):
    """A coroutine of `atext()` never awaited: its work stops (it ran all 200 tokens) and the
    context is free again; no traceback from a runtime thread (it failed to hand its result
    to the closed loop); Python's own warning names the coroutine never awaited."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", UNAWAITED], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ran"] < 100, got
    assert len(got["again"]) > 0
    assert "was never awaited" in done.stderr
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr, done.stderr


ACLOSE_IN_FLIGHT = """
import asyncio, gc, json, time, weft

engine = weft.Engine("smollm2-135m", threads=2)

async def consume(g):
    async for _ in g:
        pass

async def main():
    gens = []
    for i in range(4):
        ctx = engine.context()
        ctx.fill(f"{i} " + "Once upon a time " * 80)
        gens.append(ctx.generate(weft.Argmax(), max_tokens=50, ignore_eos=True))
    tasks = [asyncio.create_task(consume(g)) for g in gens]
    await asyncio.sleep(0.05)
    await asyncio.gather(*(g.aclose() for g in gens))
    await asyncio.gather(*tasks)
    ctx = engine.context()
    ctx.fill("The capital of France is")
    text = await ctx.generate(weft.Argmax(), max_tokens=8, ignore_eos=True).atext()
    return [g.stop_reason for g in gens], text

reasons, text = asyncio.run(main())
gc.collect()
deadline = time.monotonic() + 5
while engine.metrics().kv_pages_used and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({"reasons": reasons, "text": text, "pages": engine.metrics().kv_pages_used}))
"""


def test_aclose_of_more_streams_than_runtime_threads_returns(smollm2):
    # Four closes while each stream's first step (a 400-token prompt) runs: a close used to
    # block one of the runtime's threads (as many as cores) on the stream's lock, which the
    # step holding it needed a thread to release, and every async call of the process hung.
    # In a process of its own, so that a hang fails this test instead of stalling the suite.
    import json
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", ACLOSE_IN_FLIGHT], capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("aclose() of four streams in flight hung") from None
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["reasons"] == ["closed"] * 4
    assert got["text"] == greedy(smollm2, "The capital of France is", 8)
    assert got["pages"] == 0


def test_ctrl_c_stops_a_blocking_collector_between_deltas(smollm2):
    ctx = smollm2.context()
    ctx.fill("Once upon a time")
    g = ctx.generate(weft.Argmax(), max_tokens=3000, ignore_eos=True)
    next(g)  # the prompt has run
    with ctrl_c_after(0.2):
        g.text()
    # It stopped long before the 3000 tokens it was asked for; the context is free again.
    assert len(g.text_so_far) > 0
    assert g.stop_reason is None
    g.close()
    ctx.fill(" more")


def passes_per_call(engine, run):
    before = engine.metrics()
    run()
    after = engine.metrics()
    return (after.passes - before.passes) / (after.steps - before.steps)


def test_sixteen_asyncio_tasks_share_model_calls(smollm2):
    prompts = [PROMPTS[i % 4] + " " * (i // 4) for i in range(16)]

    async def one(prompt):
        ctx = smollm2.context()
        ctx.fill(prompt)
        parts = []
        async for delta in ctx.generate(weft.Argmax(), max_tokens=48, ignore_eos=True):
            parts.append(delta)
        return "".join(parts)

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    texts = []
    mean = passes_per_call(smollm2, lambda: texts.extend(asyncio.run(main())))
    assert mean >= 8, f"only {mean:.2f} passes per model call"
    # Batching changes no bits: each text equals the same prompt run alone.
    for p, t in list(zip(prompts, texts))[:4]:
        assert t == greedy(smollm2, p, 48)


def test_python_threads_share_model_calls(smollm2):
    out = {}

    def work(i):
        out[i] = greedy(smollm2, PROMPTS[i % 4], 48)

    def run():
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    mean = passes_per_call(smollm2, run)
    assert mean >= 4, f"only {mean:.2f} passes per model call: is the GIL held?"
    assert out[0] == out[4] == greedy(smollm2, PROMPTS[0], 48)


def test_awaitable_collectors(smollm2):
    async def main():
        ctx = smollm2.context()
        ctx.fill("The capital of France is")
        g = ctx.generate(weft.Argmax(), max_tokens=8, ignore_eos=True)
        text = await g.atext()
        tokens = await g.atokens()
        # Coroutines, as create_task and TaskGroup need (they were asyncio futures in a loop).
        again = smollm2.context()
        again.fill("The capital of France is")
        task = asyncio.create_task(
            again.generate(weft.Argmax(), max_tokens=8, ignore_eos=True).atext()
        )
        scored = smollm2.context()
        scored.fill("The capital of France is")
        fwd = scored.forward()
        h = fwd.sample([len(fwd) - 1], weft.Argmax())
        out = await asyncio.create_task(fwd.execute())
        return text, tokens, await task, out.token(h)

    text, tokens, again, token = asyncio.run(main())
    assert text == again == greedy(smollm2, "The capital of France is", 8)
    assert len(tokens) == 8
    assert token == 7042  # " Paris"


def test_awaitables_made_before_the_loop_runs(smollm2):
    # `asyncio.run(g.atext())` calls `atext()` before any loop runs: the awaitable must still
    # work (a coroutine starting the work when awaited), and one dropped unawaited runs nothing.
    ctx = smollm2.context()
    ctx.fill("The capital of France is")
    g = ctx.generate(weft.Argmax(), max_tokens=8, ignore_eos=True)
    assert asyncio.run(g.atext()) == greedy(smollm2, "The capital of France is", 8)
    assert len(asyncio.run(g.atokens())) == 8

    ctx = smollm2.context()
    ctx.fill("The capital of France is")
    fwd = ctx.forward()
    h = fwd.sample([len(fwd) - 1], weft.Argmax())
    n, pages = len(ctx), smollm2.metrics().kv_pages_used
    dropped = ctx.forward()
    dropped.sample([len(dropped) - 1], weft.Argmax())
    unawaited = dropped.execute()
    unawaited.close()  # a coroutine never awaited: nothing ran, nothing is held
    assert (len(ctx), smollm2.metrics().kv_pages_used) == (n, pages)
    assert asyncio.run(fwd.execute()).token(h) == 7042  # " Paris"


def wait_pages(engine, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while engine.metrics().kv_pages_used != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.metrics().kv_pages_used


def test_a_dropped_iterator_frees_its_kv_pages():
    engine = weft.Engine("smollm2-135m", threads=2, kv_tokens=4096)
    assert engine.metrics().kv_pages_used == 0

    # Sync: stop after two deltas and drop everything.
    ctx = engine.context()
    ctx.fill("Once upon a time " * 20)
    g = ctx.generate(weft.Argmax(), max_tokens=200, ignore_eos=True)
    next(g)
    next(g)
    assert engine.metrics().kv_pages_used > 0
    del g
    # The context is free again at once (no ContextBusy), then dropped too.
    ctx.fill(" and")
    del ctx
    gc.collect()
    assert wait_pages(engine, 0) == 0

    # The iterator alone holds the context: dropping it frees the pages.
    ctx = engine.context()
    ctx.fill("Once upon a time " * 20)
    g = ctx.generate(weft.Argmax(), max_tokens=200, ignore_eos=True)
    del ctx
    next(g)
    assert engine.metrics().kv_pages_used > 0
    del g
    gc.collect()
    assert wait_pages(engine, 0) == 0

    # Async: break out of `async for`.
    async def main():
        ctx = engine.context()
        ctx.fill("Once upon a time " * 20)
        n = 0
        async for _ in ctx.generate(weft.Argmax(), max_tokens=200, ignore_eos=True):
            n += 1
            if n == 3:
                break
        return n

    assert asyncio.run(main()) == 3
    gc.collect()
    assert wait_pages(engine, 0) == 0


def test_long_context_calls_let_other_threads_run(smollm2):
    """Tokenizing a long text (`fill`, `fill_chat`, `Engine.tokenize`) runs without the GIL:
    another Python thread makes a thousand GIL hand-offs meanwhile. A call holding the GIL would not let it start before the call
    returned, and main would see it unfinished right after."""
    text = "The quick brown fox jumps over the lazy dog. " * 40000  # 1.8 MB, ~400k tokens
    ids = smollm2.tokenize(text)
    out = []
    calls = {
        "fill": lambda c: c.fill(text),
        "fill_chat": lambda c: c.fill_chat([{"role": "user", "content": text}]),
        "tokenize": lambda c: out.append(smollm2.tokenize(text)),
    }
    for name, call in calls.items():
        ctx = smollm2.context()
        go, done = threading.Event(), threading.Event()

        def spin():
            go.wait()
            for _ in range(1000):
                time.sleep(0)  # gives the GIL up and takes it back
            done.set()

        t = threading.Thread(target=spin)
        t.start()
        go.set()
        call(ctx)
        finished = done.is_set()
        t.join()
        assert finished, f"{name} held the GIL while it tokenized"
        if name.startswith("fill"):
            assert len(ctx.pending) > 100_000
    assert out == [ids]


def test_batches_and_embeddings_on_threads_share_a_small_cache():
    """Three `generate_batch` calls (and four `embed` calls) on threads of one engine whose
    cache holds only part of them: each waits for the pages the others give back, and gets
    what it gets alone (some failed with KvCacheFull)."""
    small = weft.Engine("smollm2-135m", threads=2, kv_tokens=512, n_ctx=512, prefix_cache=False)
    prompts = [f"{p} ({i})" for i, p in enumerate(PROMPTS * 2)]
    opts = dict(max_tokens=90, ignore_eos=True, seed=7)
    alone = [r.tokens for r in weft.generate_batch(small, prompts, weft.Argmax(), **opts)]
    texts = [" ".join(f"Sentence {i} of text {j} to embed." for i in range(30)) for j in range(4)]
    vectors = small.embed(texts)
    out, errors = {}, []

    def batch(i):
        try:
            out[("batch", i)] = [
                r.tokens for r in weft.generate_batch(small, prompts, weft.Argmax(), **opts)
            ]
        except Exception as e:  # reported below
            errors.append(e)

    def embed(i):
        try:
            out[("embed", i)] = small.embed(texts)
        except Exception as e:  # reported below
            errors.append(e)

    # Batches on threads, then embeddings on threads (together, the ones kept the others in
    # step, and all went through).
    for work, n in ((batch, 3), (embed, 4)):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    for i in range(3):
        assert out[("batch", i)] == alone
    for i in range(4):
        assert np.array_equal(out[("embed", i)], vectors)
    assert small.metrics().kv_pages_used == 0
