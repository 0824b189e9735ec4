"""GET /health, GET /v1/models, GET /metrics, POST /tokenize and /detokenize."""

import pytest

from conftest import (
    KNOWN_MODELS,
    MODEL,
    MODEL_INDEPENDENT,
    assert_error_shape,
    detokenize,
    greedy,
    kv_idle,
    parse_metrics,
    tokenize,
    user,
)

COUNTERS = (
    "weft:prompt_tokens_total",
    "weft:generation_tokens_total",
    "weft:num_preemptions_total",
)
GAUGES = (
    "weft:num_requests_running",
    "weft:num_requests_waiting",
    "weft:kv_pages_used",
    "weft:kv_pages_free",
    "weft:mean_passes_per_model_call",
)
HISTOGRAMS = (
    "weft:time_to_first_token_seconds",
    "weft:inter_token_latency_seconds",
    "weft:e2e_request_latency_seconds",
)


@MODEL_INDEPENDENT
def test_health_is_200_ok(http):
    r = http.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_models_lists_the_served_model(http, client, model):
    r = http.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert len(body["data"]) == 1
    entry = body["data"][0]
    assert entry["object"] == "model"
    assert isinstance(entry["id"], str) and entry["id"]
    assert isinstance(entry["created"], int)
    assert isinstance(entry["owned_by"], str)
    if MODEL in KNOWN_MODELS:
        assert entry["id"] == MODEL
    assert [m.id for m in client.models.list()] == [model]
    assert client.models.retrieve(model).id == model


def test_a_model_answers_to_its_alias_under_its_own_name(http, client, model):
    if MODEL not in KNOWN_MODELS:
        pytest.skip("aliases belong to the known models")
    alias = MODEL.split("-")[0]  # smollm2-135m -> smollm2, gemma3-270m -> gemma3
    assert client.models.retrieve(alias).id == MODEL
    r = client.chat.completions.create(
        model=alias, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert r.model == MODEL


def _series(text: str, name: str) -> list:
    return [
        line for line in text.splitlines() if line.startswith(name) and not line.startswith("#")
    ]


@MODEL_INDEPENDENT
def test_metrics_expose_every_listed_series(http):
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    metrics = parse_metrics(text)
    for name in COUNTERS + GAUGES:
        assert name in metrics, f"/metrics lacks {name}"
    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text, f"{name} is not typed as a histogram"
        buckets = _series(text, name + "_bucket{")
        assert buckets, f"{name} has no buckets"
        assert any('le="+Inf"' in b for b in buckets), f"{name} has no +Inf bucket"
        assert name + "_sum" in metrics and name + "_count" in metrics, name
        inf = next(
            v for k, v in metrics.items() if k.startswith(name + "_bucket") and 'le="+Inf"' in k
        )
        assert inf == metrics[name + "_count"], f"{name}: +Inf bucket != _count"


def test_metrics_count_a_request(server, client, model):
    before = kv_idle(server.base_url)
    r = client.chat.completions.create(
        model=model, messages=user("Count to five."), max_tokens=12, **greedy()
    )
    after = kv_idle(server.base_url)
    generated = after["weft:generation_tokens_total"] - before["weft:generation_tokens_total"]
    assert generated == r.usage.completion_tokens
    prompt = after["weft:prompt_tokens_total"] - before["weft:prompt_tokens_total"]
    assert (
        0 < prompt <= r.usage.prompt_tokens
    ), "prompt tokens counted (cached ones may be left out)"
    for name in ("weft:time_to_first_token_seconds", "weft:e2e_request_latency_seconds"):
        assert after[name + "_count"] - before[name + "_count"] == 1, name
        assert after[name + "_sum"] > before[name + "_sum"], name
    assert after["weft:kv_pages_free"] > 0


TEXTS = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "Numbers 1234567890 and symbols #$%^&*()",
    "Ünïcödé, 日本語のテキスト, and an emoji 🙂.",
    "line one\nline two\n\n\ttabbed",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_detokenize_roundtrip(server, text):
    tokens = tokenize(server.base_url, text)
    assert tokens and all(isinstance(t, int) and t >= 0 for t in tokens)
    assert detokenize(server.base_url, tokens) == text


def test_tokenize_with_pieces_gives_ids_and_their_text(server):
    text = "The quick brown fox jumps over the lazy dog."
    plain = tokenize(server.base_url, text)
    pieces = tokenize(server.base_url, text, with_pieces=True)
    assert [p["id"] for p in pieces] == plain
    assert all(isinstance(p["piece"], str) for p in pieces)
    assert "".join(p["piece"] for p in pieces) == text


def test_tokenize_add_special_only_adds_special_tokens(server):
    text = "Hello there"
    plain = tokenize(server.base_url, text)
    special = tokenize(server.base_url, text, add_special=True)
    assert len(special) >= len(plain)
    assert special[len(special) - len(plain) :] == plain or special[: len(plain)] == plain
    assert tokenize(server.base_url, "") == []


@MODEL_INDEPENDENT
def test_tokenize_and_detokenize_reject_bad_bodies(http):
    for path, body in (
        ("/tokenize", {"content": 5}),
        ("/tokenize", {}),
        ("/detokenize", {"tokens": "abc"}),
        ("/detokenize", {"tokens": [-1]}),
        ("/detokenize", {"tokens": [999999999]}),
    ):
        r = http.post(path, json=body)
        assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text[:200])
        assert_error_shape(r.json())
