"""Client disconnects end their generations and free their KV pages; KV pressure queues or
preempts requests but never fails them."""

import asyncio
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from conftest import (
    HTTP_TIMEOUT,
    MODEL,
    MODEL_INDEPENDENT,
    kv_idle,
    make_client,
    sse_data,
    start_server,
    user,
)

CHAT = "/v1/chat/completions"
ABORT_EARLY = -1  # abort while the request is in flight, maybe before the response head
AFTER_HEAD = 0  # close as soon as the response head arrives, before any chunk


async def _disconnect(ac: httpx.AsyncClient, body: dict, after: int, rng: random.Random):
    """Streams `body` and walks away after `after` chunks (or earlier, see the constants)."""
    if after == ABORT_EARLY:
        try:
            await asyncio.wait_for(_disconnect(ac, body, 10**9, rng), rng.uniform(0.05, 0.4))
        except asyncio.TimeoutError:
            pass
        return
    async with ac.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200, (await r.aread())[:300]
        if after == AFTER_HEAD:
            return
        chunks = 0
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                chunks += 1
                if chunks >= after:
                    return
    raise AssertionError("a stream meant to be abandoned ran to its end")


async def _finish(ac: httpx.AsyncClient, body: dict):
    """Streams `body` to the end and checks that the answer is complete."""
    async with ac.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200, (await r.aread())[:300]
        events = sse_data([line async for line in r.aiter_lines()])
    assert events and events[-1] == "[DONE]", events[-3:]
    finishes = [
        ch["finish_reason"] for c in events[:-1] for ch in c["choices"] if ch["finish_reason"]
    ]
    assert finishes in (["stop"], ["length"]), finishes


def test_disconnected_streams_end_and_return_their_kv_pages(server, model):
    rng = random.Random(4321)
    plans = [ABORT_EARLY, AFTER_HEAD] + [
        rng.choice([ABORT_EARLY, AFTER_HEAD, *range(1, 11)]) for _ in range(30)
    ]

    async def main():
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=server.base_url, timeout=HTTP_TIMEOUT, limits=limits
        ) as ac:
            leaving = [
                _disconnect(
                    ac,
                    {
                        "model": model,
                        "messages": user(f"Write a very long essay about topic number {i}."),
                        "max_tokens": 1000,
                        "temperature": 1.0,
                        "seed": i,
                        "ignore_eos": True,
                        "stream": True,
                    },
                    after,
                    random.Random(i),
                )
                for i, after in enumerate(plans)
            ]
            staying = [
                _finish(
                    ac,
                    {
                        "model": model,
                        "messages": user(f"Tell me one fact about the number {i}."),
                        "max_tokens": 24,
                        "temperature": 0,
                        "stream": True,
                    },
                )
                for i in range(32)
            ]
            tasks = leaving + staying
            rng.shuffle(tasks)
            await asyncio.gather(*tasks)

    asyncio.run(main())
    kv_idle(server.base_url)


def _story(c, model: str, i: int):
    """200 greedy tokens of story number `i` (EOS ignored)."""
    return c.chat.completions.create(
        model=model,
        messages=user(f"Tell me story number {i}."),
        max_tokens=200,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def test_kv_pressure_queues_or_preempts_but_completes_every_request(server, model):
    srv = start_server("--kv-tokens", "512")
    c = make_client(srv)
    try:

        def run(i: int):
            return _story(c, model, i)

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(run, range(6)))
        for i, r in enumerate(results):
            assert r.usage.completion_tokens == 200, (i, r.usage)
            assert r.choices[0].finish_reason == "length", i
        metrics = kv_idle(srv.base_url)
        # Six 237-token requests in a 512-token pool: some were preempted and recomputed.
        assert metrics["weft:num_preemptions_total"] > 0, metrics
        # Preemption recomputes the evicted tokens; greedy output is the same as unhindered.
        alone = make_client(server)
        try:
            for i in (0, 5):
                ref = _story(alone, model, i)
                assert results[i].choices[0].message.content == ref.choices[0].message.content, i
        finally:
            alone.close()
        # One request whose six choices do not fit in the pool at once: a finished choice gives
        # its pages back, so the others complete (they used to wait for those pages for good).
        r = c.with_options(timeout=300).chat.completions.create(
            model=model,
            messages=user("Tell me story number 0."),
            max_tokens=100,
            n=6,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert len(r.choices) == 6 and r.usage.completion_tokens == 600, r.usage
        for choice in r.choices:
            assert choice.finish_reason == "length"
            assert results[0].choices[0].message.content.startswith(choice.message.content)
        kv_idle(srv.base_url)
    finally:
        c.close()
        srv.stop()


@MODEL_INDEPENDENT
def test_first_signal_drains_second_signal_stops():
    """SIGINT lets the requests in flight finish (new connections are refused); a second one
    stops them, as llama-server's second interrupt does: the server exits instead of waiting
    for a generation that has the whole context to run."""
    srv = start_server()
    try:
        body = {
            "model": MODEL, "messages": user("Write a very long story."), "stream": True,
            "ignore_eos": True, "temperature": 0,  # no max_tokens: it may fill the context
        }
        chunks, started = [], threading.Event()

        def stream():
            try:
                with httpx.Client(base_url=srv.base_url, timeout=HTTP_TIMEOUT) as c:
                    with c.stream("POST", CHAT, json=body) as r:
                        for line in r.iter_lines():
                            if line.startswith("data:"):
                                chunks.append(line)
                                started.set()
            except httpx.HTTPError:
                pass  # the second signal cuts the stream
            started.set()

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert started.wait(60) and chunks, "the stream never started"
        srv.proc.send_signal(signal.SIGINT)
        n = len(chunks)
        deadline = time.monotonic() + 30
        while len(chunks) < n + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.alive() and len(chunks) >= n + 20, "the first signal did not let it go on"
        srv.proc.send_signal(signal.SIGINT)
        code = srv.proc.wait(60)
        assert code != 0, "a stop that cut requests short is not a clean exit"
        t.join(30)
        assert not t.is_alive()
    finally:
        srv.stop()


@MODEL_INDEPENDENT
def test_chat_model_embeddings_wait_for_kv_pages_like_requests(server, model):
    """Embeddings on the chat model use its KV pool: under pressure from generations they wait
    for pages as a request does, rather than failing with a 500, and their vectors are the
    ones an idle server gives."""
    srv = start_server("--kv-tokens", "512")
    c = make_client(srv)
    text = " ".join(f"Sentence {i} of a long text to embed." for i in range(30))  # ~300 tokens
    try:

        def embed(i: int):
            time.sleep(0.5 + 0.5 * i)  # while the generations hold the pool
            with httpx.Client(base_url=srv.base_url, timeout=HTTP_TIMEOUT) as h:
                return h.post("/v1/embeddings", json={"model": model, "input": text})

        with ThreadPoolExecutor(8) as pool:
            gens = [pool.submit(_story, c, model, i) for i in range(4)]
            embeds = [pool.submit(embed, i) for i in range(4)]
            gen_results = [g.result() for g in gens]
            embed_results = [e.result() for e in embeds]
        for r in gen_results:
            assert r.usage.completion_tokens == 200, r.usage
        for r in embed_results:
            assert r.status_code == 200, r.text[:300]
        kv_idle(srv.base_url)
        with httpx.Client(base_url=server.base_url, timeout=HTTP_TIMEOUT) as h:
            alone = h.post("/v1/embeddings", json={"model": model, "input": text}).json()
        want = alone["data"][0]["embedding"]
        for r in embed_results:
            got = r.json()["data"][0]["embedding"]
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
    finally:
        c.close()
        srv.stop()


@MODEL_INDEPENDENT
def test_an_embedding_request_the_client_left_stops_its_work(server, model):
    """A client that leaves an embedding request mid-way: its inputs stop running (they ran
    on for minutes, holding the model and KV pages, and kept a stopping server waiting)."""
    from conftest import get_metrics

    text = " ".join(f"Sentence {i} of a long text to embed." for i in range(100))  # ~1000 tokens
    body = {"model": model, "input": [f"{j}: {text}" for j in range(96)]}  # a minute of work

    def calls():
        return get_metrics(server.base_url)["weft:model_calls_total"]

    before = calls()
    with httpx.Client(base_url=server.base_url, timeout=1.5) as h:
        try:
            h.post("/v1/embeddings", json=body)
            raise AssertionError("a minute of embeddings answered within 1.5 s")
        except httpx.TimeoutException:
            pass  # the client leaves
    # The model stops within a group of inputs: two readings a second and a half apart agree.
    deadline = time.monotonic() + 20
    last = calls()
    while True:
        time.sleep(1.5)
        now = calls()
        if now == last:
            break
        assert time.monotonic() < deadline, f"still running 20 s after the client left ({now})"
        last = now
    assert now > before, "the request never ran"
    kv_idle(server.base_url)
