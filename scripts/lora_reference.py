#!/usr/bin/env python3
"""llama.cpp's greedy runs with synthetic LoRA adapters: the reference of weft's LoRA parity test.

usage: lora_reference.py LLAMA_SERVER OUT.json MODEL.gguf:ADAPTER.gguf:KEY [...]

The adapters are the ones `crates/weft/tests/lora.rs` writes with weft's GGUF writer
(`target/tmp/lora/<model>-r<rank>.gguf`, deterministic). For each (model, adapter) this starts
llama.cpp's llama-server (2 threads, `--lora ADAPTER`), asks `/completion` for 16 greedy tokens
of each prompt with the adapter at scale 1 and the top-5 log-probabilities of every step, and
records them with the adapter's SHA-256 (the test checks it wrote the same file)."""
import hashlib, json, os, subprocess, sys, time, urllib.request

PROMPTS = ["The capital of France is", "Once upon a time", "The best way to learn programming is"]
STEPS = 16


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))


def main():
    server, out, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(server))
    cases = []
    for i, spec in enumerate(specs):
        model, adapter, key = spec.split(":")
        port = 8200 + i
        proc = subprocess.Popen([server, "-m", model, "--lora", adapter, "-t", "2", "-c", "2048",
                                 "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except Exception:
                    time.sleep(0.5)
            sha = hashlib.sha256(open(adapter, "rb").read()).hexdigest()
            for prompt in PROMPTS:
                r = post(port, {"prompt": prompt, "n_predict": STEPS, "temperature": 0, "n_probs": 5,
                                "cache_prompt": False, "lora": [{"id": 0, "scale": 1.0}]})
                steps = [{"id": p["id"], "top5": [[t["id"], round(t["logprob"], 5)] for t in p["top_logprobs"]]}
                         for p in r["completion_probabilities"]]
                cases.append({"model": key, "adapter": os.path.basename(adapter), "adapter_sha256": sha,
                              "prompt": prompt, "greedy_ids": [s["id"] for s in steps], "steps": steps})
        finally:
            proc.terminate()
            proc.wait()
    json.dump({"tool": "llama.cpp llama-server at the reference commit (0c1e570), 2 threads, raw prompt, greedy, LoRA scale 1.0",
               "script": "scripts/lora_reference.py", "cases": cases}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
