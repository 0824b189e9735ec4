"""Shared fixtures and helpers of the `weft serve` OpenAI-compatibility suite.

The suite starts the real `weft serve` binary (`$WEFT_BIN`) on the model `$WEFT_TEST_MODEL` and
talks to it with the official `openai` client, or with raw `httpx` where the wire format itself is
under test. Test modules import the helpers below with `from conftest import ...`.
"""

import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

WEFT_BIN = os.environ.get("WEFT_BIN", "")
MODEL = os.environ.get("WEFT_TEST_MODEL", "")
KNOWN_MODELS = ("smollm2-135m", "gemma3-270m")

LISTEN_RE = re.compile(r"^weft serve: listening on http://127\.0\.0\.1:(\d+)$")
STARTUP_TIMEOUT = 120.0
HTTP_TIMEOUT = 120.0

# A test of the server alone — status codes, the error shape, authentication, admission,
# signals, the encoder beside the chat model — whose outcome does not depend on the chat model
# served. `cargo test` runs the suite on each model and these on the first only
# (`-m "not model_independent"` on the others, see tests/serve_openai.rs). A test that
# generates, tokenizes or counts tokens of the chat model is not one of them.
MODEL_INDEPENDENT = pytest.mark.model_independent


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "model_independent: the same whatever chat model is served (run once)"
    )
    missing = [name for name in ("WEFT_BIN", "WEFT_TEST_MODEL") if not os.environ.get(name)]
    if missing:
        raise pytest.UsageError(
            f"set {' and '.join(missing)}: WEFT_BIN is the path of the `weft` binary, "
            "WEFT_TEST_MODEL the model to serve (e.g. smollm2-135m)"
        )
    if not os.access(WEFT_BIN, os.X_OK):
        raise pytest.UsageError(f"WEFT_BIN={WEFT_BIN!r} is not an executable file")


# --------------------------------------------------------------------------------------------
# Servers


class Server:
    """A running `weft serve` process."""

    def __init__(self, proc: subprocess.Popen, port: int, args: list):
        self.proc = proc
        self.port = port
        self.args = args
        self.base_url = f"http://127.0.0.1:{port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _pump_stdout(proc: subprocess.Popen, lines: "queue.Queue[str | None]"):
    """Hands stdout lines to the starter until the listen line, then keeps draining the pipe
    (forwarding to stderr) so that the server can never block on a full pipe."""
    listening = False
    for line in proc.stdout:
        line = line.rstrip("\r\n")
        if listening:
            sys.stderr.write(f"[weft serve stdout] {line}\n")
            continue
        lines.put(line)
        listening = LISTEN_RE.match(line) is not None
    lines.put(None)  # end of stdout


def start_server(*extra_args: str) -> Server:
    """Starts `weft serve` on a free port and waits until `/health` answers 200."""
    args = [WEFT_BIN, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0", "-t", "2"]
    args += list(extra_args)
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=None, text=True, encoding="utf-8", errors="replace"
    )
    lines: "queue.Queue[str | None]" = queue.Queue()
    threading.Thread(target=_pump_stdout, args=(proc, lines), daemon=True).start()

    port = None
    seen = []
    deadline = time.monotonic() + STARTUP_TIMEOUT
    try:
        while port is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"`{' '.join(args)}` printed no listen line within {STARTUP_TIMEOUT:.0f} s; "
                    f"stdout so far: {seen!r}"
                )
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                code = proc.wait(10)
                raise AssertionError(
                    f"`{' '.join(args)}` exited with status {code} before listening; "
                    f"stdout: {seen!r} (its stderr is above)"
                )
            seen.append(line)
            m = LISTEN_RE.match(line)
            if m:
                port = int(m.group(1))
        server = Server(proc, port, args)
        _wait_healthy(server, deadline=time.monotonic() + STARTUP_TIMEOUT)
        return server
    except BaseException:
        Server(proc, 0, args).stop()
        raise


def _wait_healthy(server: Server, deadline: float):
    last = None
    while time.monotonic() < deadline:
        if not server.alive():
            raise AssertionError(
                f"weft serve exited with status {server.proc.returncode} while loading "
                "(its stderr is above)"
            )
        try:
            r = httpx.get(server.base_url + "/health", timeout=5)
            last = f"{r.status_code} {r.text[:300]}"
            if r.status_code == 200:
                assert r.json() == {"status": "ok"}, f"/health 200 body: {r.text!r}"
                return
            assert r.status_code == 503, f"/health while loading must be 503, got {last}"
            assert_error_shape(r.json())
        except httpx.TransportError as e:
            last = repr(e)
        time.sleep(0.1)
    raise AssertionError(f"/health did not turn 200 within {STARTUP_TIMEOUT:.0f} s; last: {last}")


def make_client(server: Server, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key=api_key, max_retries=0, timeout=HTTP_TIMEOUT
    )


@pytest.fixture(scope="session")
def server():
    srv = start_server()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def client(server):
    c = make_client(server)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def aclient(server):
    """An `openai.AsyncOpenAI` for this test only. Use it inside one event loop and close it
    there: `async with aclient: ...` under `asyncio.run`."""
    return openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=HTTP_TIMEOUT
    )


@pytest.fixture(scope="session")
def http(server):
    """A raw HTTP client on the server's root URL."""
    with httpx.Client(base_url=server.base_url, timeout=HTTP_TIMEOUT) as c:
        yield c


@pytest.fixture(scope="session")
def model(server):
    r = httpx.get(server.base_url + "/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["id"]


# --------------------------------------------------------------------------------------------
# Requests and responses


def user(text: str) -> list:
    """A one-message conversation."""
    return [{"role": "user", "content": text}]


def assert_error_shape(body) -> dict:
    """Checks the OpenAI error body `{"error": {"message", "type", "param", "code"}}` and
    returns the inner object."""
    assert isinstance(body, dict) and isinstance(
        body.get("error"), dict
    ), f"not an error body: {body!r}"
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"], f"error.message: {body!r}"
    assert isinstance(err.get("type"), str) and err["type"], f"error.type: {body!r}"
    for key in ("param", "code"):
        assert key in err, f"error.{key} missing (null is fine): {body!r}"
    assert err["param"] is None or isinstance(err["param"], str), f"error.param: {body!r}"
    code = err["code"]
    assert code is None or (isinstance(code, (str, int)) and not isinstance(code, bool)), body
    return err


def assert_error(resp: httpx.Response, status: int, param=None, code=None, type_=None) -> dict:
    """Checks an error response's status, JSON error shape and, where given, param/code/type."""
    assert (
        resp.status_code == status
    ), f"expected {status}, got {resp.status_code}: {resp.text[:500]}"
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {resp.text[:500]!r}") from None
    err = assert_error_shape(body)
    if param is not None:
        assert err["param"] == param, f"error.param should be {param!r}: {body!r}"
    if code is not None:
        assert err["code"] == code, f"error.code should be {code!r}: {body!r}"
    if type_ is not None:
        assert err["type"] == type_, f"error.type should be {type_!r}: {body!r}"
    return err


def sse_data(lines) -> list:
    """The payloads of an SSE stream's `data:` lines, in order: parsed JSON objects, and the
    string "[DONE]" for the terminator."""
    out = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_post(http_client: httpx.Client, path: str, body: dict) -> list:
    """POSTs a streaming request and returns its SSE payloads (see `sse_data`)."""
    with http_client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read().decode(errors="replace")
        ctype = r.headers.get("content-type", "")
        assert ctype.startswith("text/event-stream"), f"content-type {ctype!r}"
        return sse_data(r.iter_lines())


def tokenize(base_url: str, text: str, add_special: bool = False, with_pieces: bool = False):
    r = httpx.post(
        base_url + "/tokenize",
        json={"content": text, "add_special": add_special, "with_pieces": with_pieces},
        timeout=HTTP_TIMEOUT,
    )
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def detokenize(base_url: str, tokens: list) -> str:
    r = httpx.post(base_url + "/detokenize", json={"tokens": tokens}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["content"]


def greedy(**extra) -> dict:
    """Keyword arguments of a deterministic request."""
    return {"temperature": 0.0, **extra}


# --------------------------------------------------------------------------------------------
# Metrics

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)(?:\s+\S+)?$")


def parse_metrics(text: str) -> dict:
    """Prometheus text → {series (name with its labels, as printed): value}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        assert m, f"unparsable metrics line: {line!r}"
        out[m.group(1)] = float(m.group(2))  # float() reads +Inf / NaN too
    return out


def get_metrics(base_url: str) -> dict:
    r = httpx.get(base_url + "/metrics", timeout=30)
    assert r.status_code == 200, r.text
    return parse_metrics(r.text)


IDLE_GAUGES = ("weft:kv_pages_used", "weft:num_requests_running", "weft:num_requests_waiting")


def kv_idle(base_url: str, timeout: float = 20) -> dict:
    """Polls `/metrics` until no KV page is used and nothing runs or waits; returns the metrics.
    Fails (AssertionError with the last values) if that does not happen within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = get_metrics(base_url)
        for name in IDLE_GAUGES:
            assert name in metrics, f"/metrics lacks {name}"
        if all(metrics[name] == 0 for name in IDLE_GAUGES):
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(
                f"server not idle after {timeout} s: "
                + ", ".join(f"{n} = {metrics[n]}" for n in IDLE_GAUGES)
            )
        time.sleep(0.2)


def post_at_once(url: str, body: dict, n: int) -> tuple:
    """POSTs `body` to `url` from `n` threads released together; returns (admitted, rejected
    with 429), checking that every request got an answer and at least one was a 429 in
    OpenAI's error shape, with a Retry-After."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def send(i: int):
        barrier.wait(30)
        try:
            results[i] = httpx.post(url, json=body, timeout=180)
        except Exception as e:  # recorded and reported below
            results[i] = e

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    for i, r in enumerate(results):
        assert isinstance(r, httpx.Response), f"request {i}: {r!r}"
    rejected = [r for r in results if r.status_code == 429]
    admitted = [r for r in results if r.status_code != 429]
    assert rejected, f"no 429 among {[r.status_code for r in results]}"
    for r in rejected:
        assert_error(r, 429)
        assert int(r.headers["retry-after"]) >= 1
    assert admitted, "nothing was admitted"
    return admitted, rejected


def finite_logprob(x) -> bool:
    """A logprob as the server must send it: a finite number ≤ 0, never below the -9999 clamp."""
    return isinstance(x, (int, float)) and math.isfinite(x) and -9999.0 <= x <= 0.0
