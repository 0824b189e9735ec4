#!/usr/bin/env python3
"""Side-by-side serving benchmark: `weft serve` against llama.cpp's `llama-server`.

Both servers load the same GGUF file and get the same load, one server at a time:
C concurrent client threads, each sending R streaming chat completions in sequence
("Write a short story about <topic>.", temperature 0.7, a distinct seed per request,
`ignore_eos`, `max_tokens`, `stream_options.include_usage`).

Per request it records the time to the first content chunk (TTFT), the time of every content
chunk (inter-token latency, ITL = gaps between consecutive content chunks), the completion
tokens of the final usage chunk (or the number of content chunks when there is no usage) and
errors. Per server and concurrency level it reports requests completed / errors, requests/s,
output tokens/s (completion tokens / wall time of the load), TTFT and ITL p50 / p99.

Usage (from the repository root, after `cargo build --release`):

    python3 scripts/bench_serve.py --weft target/release/weft --llama-server PATH/llama-server \\
        [-m smollm2-135m | -m FILE.gguf] [--clients 1,4,16,64] [--requests-per-client 2] \\
        [--max-tokens 128] [-t 2] [--rounds 1] [--only weft|llama] [--json]

Each (concurrency, round) pair starts a fresh server per engine and stops it afterwards;
rounds alternate which engine goes first. The KV budget is the same for both engines:
`-c` for llama-server and `--kv-tokens` for weft are
max(2048, C * (prompt budget + max_tokens + 64), rounded up to a multiple of 256).

The figures only mean something on an otherwise idle machine: the script prints the load
average before each run, and warns when it is high. Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TOPICS = [
    "the sea", "a lighthouse", "winter", "a robot", "the moon", "a garden", "trains", "bread",
    "a lost key", "an old library", "a thunderstorm", "a clockmaker", "the desert", "a violin",
    "a small dragon", "a night market", "a paper boat", "the first snow", "a mountain village",
    "a forgotten letter", "a city bus", "an orchard", "a beekeeper", "a broken compass",
]

WEFT_LISTEN_RE = re.compile(r"weft serve: listening on http://([^\s:/]+|\[[^\]]+\]):(\d+)")

CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni")


# ---------------------------------------------------------------------------------------------
# Machine information


def cpu_info() -> tuple[str, dict[str, bool]]:
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, {name: name in flags for name in CPU_FLAGS}


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def tool_version(cmd: list[str]) -> str:
    """First line mentioning a version from `cmd` (stdout or stderr), or ''."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [l.strip() for l in (out.stdout + "\n" + out.stderr).splitlines() if l.strip()]
    for l in lines:
        if "version" in l.lower():
            return l
    return lines[0] if lines else ""


# ---------------------------------------------------------------------------------------------
# Server processes


class StartupError(RuntimeError):
    pass


_live: list["Server"] = []


def _kill_all() -> None:
    for s in list(_live):
        s.stop()


def _on_signal(signum, _frame):
    _kill_all()
    sys.exit(128 + signum)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join(lines[-n:]) if lines else "(empty)"


def http_status(host: str, port: int, path: str, timeout: float = 5.0) -> int | None:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None


@dataclass
class Server:
    name: str
    cmd: list[str]
    log_dir: Path
    host: str = "127.0.0.1"
    port: int | None = None  # None: read it from weft's listen line
    proc: subprocess.Popen | None = None
    out_path: Path = field(init=False)
    err_path: Path = field(init=False)

    def __post_init__(self):
        stamp = f"{self.name}-{int(time.time() * 1000)}"
        self.out_path = self.log_dir / f"{stamp}.stdout"
        self.err_path = self.log_dir / f"{stamp}.stderr"

    def start(self, timeout: float) -> None:
        out = open(self.out_path, "wb")
        err = open(self.err_path, "wb")
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True)
        except OSError as e:
            raise StartupError(f"{self.name}: cannot run {self.cmd[0]}: {e}") from e
        finally:
            out.close()
            err.close()
        _live.append(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartupError(self._failure(f"exited with status {self.proc.returncode} "
                                                 "before it was ready"))
            if self.port is None:
                m = WEFT_LISTEN_RE.search(self.out_path.read_text(encoding="utf-8", errors="replace"))
                if m:
                    self.host = m.group(1).strip("[]")
                    self.port = int(m.group(2))
            if self.port is not None and http_status(self.host, self.port, "/health", 2.0) == 200:
                return
            time.sleep(0.2)
        what = "no listen line" if self.port is None else "/health never returned 200"
        raise StartupError(self._failure(f"not ready after {timeout:.0f} s ({what})"))

    def _failure(self, why: str) -> str:
        return (f"{self.name} failed to start: {why}\n  command: {' '.join(self.cmd)}\n"
                f"--- stderr tail ({self.err_path}) ---\n{tail(self.err_path)}\n"
                f"--- stdout tail ({self.out_path}) ---\n{tail(self.out_path, 10)}")

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
                try:
                    os.killpg(p.pid, sig)  # its own session: the server and any children
                except ProcessLookupError:
                    break
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self in _live:
            _live.remove(self)


# ---------------------------------------------------------------------------------------------
# Load generation


@dataclass
class Result:
    start: float
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)


def request_body(client: int, i: int, max_tokens: int, per_client: int) -> dict:
    n = client * per_client + i
    topic = TOPICS[(client * 7 + i * 3) % len(TOPICS)]
    # No "model" field: both servers serve their one model (weft would 404 a wrong name).
    return {
        "messages": [{"role": "user", "content": f"Write a short story about {topic}."}],
        "temperature": 0.7,
        "seed": 1000 + n,
        "ignore_eos": True,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream_chat(host: str, port: int, body: dict, timeout: float) -> Result:
    res = Result(start=time.perf_counter())
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace').strip()}"
            return res
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                res.error = f"bad SSE data: {data[:120]!r}"
                break
            if chunk.get("error"):
                res.error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                break
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    res.chunk_times.append(now)
                    break
            usage = chunk.get("usage")
            if usage:
                res.completion_tokens = usage.get("completion_tokens")
                res.prompt_tokens = usage.get("prompt_tokens")
        if res.error is None and not done:
            res.error = "stream ended without [DONE]"
        if res.error is None and not res.chunk_times:
            res.error = "no content chunk"
    except (OSError, http.client.HTTPException) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return res


def run_load(host: str, port: int, clients: int, per_client: int, max_tokens: int,
             timeout: float) -> tuple[list[Result], float]:
    results: list[Result] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        barrier.wait()
        for i in range(per_client):
            r = stream_chat(host, port, request_body(c, i, max_tokens, per_client), timeout)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def warm_up(host: str, port: int, n: int, timeout: float) -> None:
    """A few short unmeasured requests: page the weights in, warm the allocator."""
    for i in range(n):
        body = request_body(0, 0, 8, 1)
        body["seed"] = 1 + i
        r = stream_chat(host, port, body, timeout)
        if r.error:
            print(f"  warm-up request failed: {r.error}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Statistics


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(server: str, clients: int, rnd: str, results: list[Result], wall: float,
              max_tokens: int) -> dict:
    ok = [r for r in results if r.error is None]
    ttft = [(r.chunk_times[0] - r.start) * 1000 for r in ok]
    itl = [(b - a) * 1000 for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tokens = sum(r.tokens for r in ok)
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    short = sum(1 for r in ok if r.tokens < max_tokens)
    no_usage = sum(1 for r in ok if r.completion_tokens is None)
    rnd2 = lambda x, d=1: None if math.isnan(x) else round(x, d)
    return {
        "server": server,
        "clients": clients,
        "round": rnd,
        "requests": len(ok),
        "errors": len(results) - len(ok),
        "wall_s": round(wall, 3),
        "req_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "output_tokens": tokens,
        "output_tok_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "content_chunks": sum(len(r.chunk_times) for r in ok),
        "ttft_p50_ms": rnd2(quantile(ttft, 0.50), 0),
        "ttft_p99_ms": rnd2(quantile(ttft, 0.99), 0),
        "itl_p50_ms": rnd2(quantile(itl, 0.50)),
        "itl_p99_ms": rnd2(quantile(itl, 0.99)),
        "prompt_tokens_max": max(prompts) if prompts else None,
        "short_completions": short,
        "missing_usage": no_usage,
        "first_errors": sorted({r.error for r in results if r.error})[:3],
        # kept for pooling rounds; dropped from the printed JSON
        "_ttft": ttft,
        "_itl": itl,
    }


def pool(rows: list[dict], max_tokens: int) -> dict:
    """All rounds of one (server, clients) pair as one sample: walls add up."""
    out = dict(rows[0])
    out["round"] = "all"
    for k in ("requests", "errors", "output_tokens", "content_chunks", "short_completions",
              "missing_usage"):
        out[k] = sum(r[k] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    out["wall_s"] = round(wall, 3)
    out["req_per_s"] = round(out["requests"] / wall, 3) if wall > 0 else None
    out["output_tok_per_s"] = round(out["output_tokens"] / wall, 1) if wall > 0 else None
    ttft = [x for r in rows for x in r["_ttft"]]
    itl = [x for r in rows for x in r["_itl"]]
    rnd2 = lambda x, d=1: None if math.isnan(x) else round(x, d)
    out["ttft_p50_ms"] = rnd2(quantile(ttft, 0.50), 0)
    out["ttft_p99_ms"] = rnd2(quantile(ttft, 0.99), 0)
    out["itl_p50_ms"] = rnd2(quantile(itl, 0.50))
    out["itl_p99_ms"] = rnd2(quantile(itl, 0.99))
    prompts = [r["prompt_tokens_max"] for r in rows if r["prompt_tokens_max"] is not None]
    out["prompt_tokens_max"] = max(prompts) if prompts else None
    out["first_errors"] = sorted({e for r in rows for e in r["first_errors"]})[:3]
    out["_ttft"], out["_itl"] = ttft, itl
    return out


def fmt(x, unit: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and x >= 100:
        return f"{x:.0f}{unit}"
    return f"{x:g}{unit}"


def print_table(rows: list[dict], show_round: bool) -> None:
    head = ["server", "clients"] + (["round"] if show_round else []) + [
        "ok / err", "req/s", "output tok/s", "TTFT p50 / p99 (ms)", "ITL p50 / p99 (ms)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for r in rows:
        cells = [r["server"], str(r["clients"])] + ([str(r["round"])] if show_round else []) + [
            f"{r['requests']} / {r['errors']}",
            "–" if r["req_per_s"] is None else f"{r['req_per_s']:.2f}",
            fmt(r["output_tok_per_s"]),
            f"{fmt(r['ttft_p50_ms'])} / {fmt(r['ttft_p99_ms'])}",
            f"{fmt(r['itl_p50_ms'])} / {fmt(r['itl_p99_ms'])}",
        ]
        print("| " + " | ".join(cells) + " |")


# ---------------------------------------------------------------------------------------------
# Main


def resolve_model(weft: str | None, model: str) -> Path:
    p = Path(model).expanduser()
    if model.endswith(".gguf") or p.is_file():
        if not p.is_file():
            sys.exit(f"bench_serve: model file {p} does not exist")
        return p.resolve()
    if not weft:
        sys.exit("bench_serve: --weft is needed to resolve a model name (or pass -m FILE.gguf)")
    try:
        out = subprocess.run([weft, "pull", model], stdout=subprocess.PIPE, text=True, timeout=3600)
    except OSError as e:
        sys.exit(f"bench_serve: cannot run {weft}: {e}")
    lines = [l.strip() for l in out.stdout.splitlines() if l.strip()]
    if out.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        sys.exit(f"bench_serve: `{weft} pull {model}` failed (status {out.returncode}); "
                 f"stdout: {out.stdout.strip()[-300:]!r}")
    return Path(lines[-1]).resolve()


def kv_budget(clients: int, prompt_tokens: int, max_tokens: int) -> int:
    need = clients * (prompt_tokens + max_tokens + 64)
    return max(2048, -(-need // 256) * 256)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weft", help="weft binary (also resolves -m NAME via `weft pull`)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"),
                    help="llama-server binary (default: $LLAMA_SERVER, then PATH)")
    ap.add_argument("-m", "--model", default="smollm2-135m", help="weft model name or a .gguf path")
    ap.add_argument("--clients", default="1,4,16,64", help="comma-separated concurrency levels")
    ap.add_argument("--requests-per-client", "-r", type=int, default=2)
    ap.add_argument("--max-tokens", "-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="rounds; the engine order alternates")
    ap.add_argument("--only", choices=["weft", "llama"], help="run one engine only")
    ap.add_argument("--prompt-tokens", type=int, default=64,
                    help="prompt budget per sequence (chat template included) for the KV size")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured short requests after each start (default 1)")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--weft-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for `weft serve` (repeatable)")
    ap.add_argument("--llama-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for llama-server (repeatable)")
    ap.add_argument("--log-dir", help="keep server logs here (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per row")
    args = ap.parse_args()

    try:
        levels = [int(x) for x in args.clients.split(",") if x.strip()]
    except ValueError:
        ap.error("--clients takes comma-separated integers")
    if not levels or min(levels) < 1 or args.requests_per_client < 1 or args.max_tokens < 1 \
            or args.rounds < 1:
        ap.error("clients, requests per client, max tokens and rounds must be positive")
    engines = ["weft", "llama"] if args.only is None else [args.only]
    if "weft" in engines and not args.weft:
        ap.error("--weft BIN is required (unless --only llama and -m FILE.gguf)")
    if "llama" in engines and not args.llama_server:
        ap.error("--llama-server BIN is required (none on PATH, $LLAMA_SERVER unset)")
    for b in ([args.weft] if "weft" in engines else []) + \
             ([args.llama_server] if "llama" in engines else []):
        if not (Path(b).is_file() and os.access(b, os.X_OK)) and not shutil.which(b):
            ap.error(f"not an executable: {b}")

    atexit.register(_kill_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    if args.log_dir:
        log_dir = Path(args.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="bench_serve-"))

    gguf = resolve_model(args.weft, args.model)
    model_name, flags = cpu_info()
    print(f"CPU: {model_name} ({os.cpu_count()} logical CPUs)")
    print("CPU flags: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items()))
    if "weft" in engines:
        print(f"weft: {args.weft} ({tool_version([args.weft, '--version']) or 'version unknown'})")
    if "llama" in engines:
        print(f"llama-server: {args.llama_server} "
              f"({tool_version([args.llama_server, '--version']) or 'version unknown'})")
    print(f"model: {gguf}")
    print(f"load: clients {levels}, {args.requests_per_client} requests/client, "
          f"max_tokens {args.max_tokens}, {args.threads} threads, {args.rounds} round(s), "
          f"warm-up {args.warmup}; server logs in {log_dir}")
    la = load_average()
    if la is not None:
        print(f"load average (1 min) at start: {la:.2f}")
    print()
    sys.stdout.flush()

    rows: list[dict] = []
    try:
        for c in levels:
            ctx = kv_budget(c, args.prompt_tokens, args.max_tokens)
            for rnd in range(args.rounds):
                order = engines if rnd % 2 == 0 else engines[::-1]
                for eng in order:
                    if eng == "weft":
                        cmd = [args.weft, "serve", "-m", str(gguf), "-t", str(args.threads),
                               "--host", "127.0.0.1", "--port", "0", "--parallel", str(max(c, 1)),
                               "--kv-tokens", str(ctx)] + args.weft_arg
                        srv = Server("weft", cmd, log_dir)
                    else:
                        port = free_port()
                        cmd = [args.llama_server, "-m", str(gguf), "-t", str(args.threads),
                               "-np", str(c), "-c", str(ctx), "--host", "127.0.0.1",
                               "--port", str(port)] + args.llama_arg
                        srv = Server("llama-server", cmd, log_dir, port=port)
                    la = load_average()
                    print(f"[{srv.name} clients={c} round={rnd + 1}] starting (kv {ctx} tokens; "
                          f"load average {la if la is None else round(la, 2)})", file=sys.stderr)
                    if la is not None and la > 0.5:
                        print(f"  warning: load average {la:.2f} before the run: the machine is "
                              "not idle, figures will be noisy", file=sys.stderr)
                    try:
                        srv.start(args.startup_timeout)
                        warm_up(srv.host, srv.port, args.warmup, args.request_timeout)
                        results, wall = run_load(srv.host, srv.port, c, args.requests_per_client,
                                                 args.max_tokens, args.request_timeout)
                    finally:
                        srv.stop()
                    row = summarize(srv.name, c, str(rnd + 1), results, wall, args.max_tokens)
                    rows.append(row)
                    print(f"  {row['requests']} ok / {row['errors']} errors in {wall:.1f} s, "
                          f"{row['output_tok_per_s']} tok/s", file=sys.stderr)
                    for e in row["first_errors"]:
                        print(f"  error: {e}", file=sys.stderr)
                    if row["short_completions"]:
                        print(f"  warning: {row['short_completions']} completions shorter than "
                              f"max_tokens (ignore_eos not honoured?)", file=sys.stderr)
                    if row["missing_usage"]:
                        print(f"  warning: {row['missing_usage']} streams without a usage chunk "
                              "(tokens counted as content chunks)", file=sys.stderr)
                    pmax = row["prompt_tokens_max"]
                    if pmax is not None and pmax > args.prompt_tokens:
                        print(f"  warning: prompts of up to {pmax} tokens exceed --prompt-tokens "
                              f"{args.prompt_tokens}: raise it so the KV budget fits",
                              file=sys.stderr)
    except StartupError as e:
        print(f"bench_serve: {e}", file=sys.stderr)
        if rows:
            print("\nrows completed before the failure:")
            print_table(rows, args.rounds > 1)
        return 1
    finally:
        _kill_all()

    table = rows
    if args.rounds > 1:
        pooled = []
        for eng in ("weft", "llama-server"):
            for c in levels:
                group = [r for r in rows if r["server"] == eng and r["clients"] == c]
                if group:
                    pooled.append(pool(group, args.max_tokens))
        table = rows + pooled
    # group by clients, then engine, for reading side by side
    table = sorted(table, key=lambda r: (r["clients"], r["round"] == "all", r["round"], r["server"]))
    print()
    print_table(table, args.rounds > 1)
    if args.json:
        print()
        for r in table:
            print(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
