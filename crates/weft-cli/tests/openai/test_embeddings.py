"""`POST /v1/embeddings` with the official client: an encoder served with `--embedding-model`
(all-MiniLM-L6-v2, checked against the independent reference vectors), the chat model's pooled
hidden states, the input forms, both encodings, and the errors."""

import base64
import json
import math
import os
import pathlib
import struct
import subprocess

import httpx
import openai
import pytest

from conftest import MODEL, MODEL_INDEPENDENT, WEFT_BIN, assert_error, make_client, start_server

ENCODER = "all-minilm-l6-v2"


def reference_cases() -> list:
    root = pathlib.Path(__file__).resolve().parents[4]
    ref = pathlib.Path(os.environ.get("WEFT_REFERENCE_DIR", root.parent / "shared" / "reference"))
    with open(ref / "minilm.json", encoding="utf-8") as f:
        return json.load(f)["cases"]


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture(scope="module")
def enc_server():
    subprocess.run([WEFT_BIN, "pull", ENCODER], check=True, stdout=subprocess.DEVNULL)
    srv = start_server("--embedding-model", ENCODER)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def enc_client(enc_server):
    c = make_client(enc_server)
    try:
        yield c
    finally:
        c.close()


@MODEL_INDEPENDENT
def test_encoder_vectors_match_the_reference(enc_client):
    cases = [c for c in reference_cases() if c["text"]]
    # The client asks for base64 by default and decodes it.
    r = enc_client.embeddings.create(model=ENCODER, input=[c["text"] for c in cases])
    assert r.model == ENCODER and r.object == "list"
    assert [d.index for d in r.data] == list(range(len(cases)))
    for case, d in zip(cases, r.data):
        assert len(d.embedding) == 384
        assert cosine(d.embedding, case["embedding"]) >= 0.9999, case["text"]
    assert r.usage.prompt_tokens == sum(len(c["ids"]) for c in cases)
    assert r.usage.total_tokens == r.usage.prompt_tokens


@MODEL_INDEPENDENT
def test_float_and_base64_agree_and_token_ids_equal_text(enc_client, enc_server):
    case = reference_cases()[0]
    as_float = enc_client.embeddings.create(model=ENCODER, input=case["text"], encoding_format="float")
    as_b64 = enc_client.embeddings.create(model=ENCODER, input=case["text"], encoding_format="base64")
    # Asked for explicitly, base64 comes back as the string: little-endian f32 values.
    raw = base64.b64decode(as_b64.data[0].embedding)
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert decoded == as_float.data[0].embedding
    by_ids = enc_client.embeddings.create(model=ENCODER, input=case["ids"], encoding_format="float")
    assert by_ids.data[0].embedding == as_float.data[0].embedding
    lists = enc_client.embeddings.create(model=ENCODER, input=[case["ids"], case["ids"]])
    assert len(lists.data) == 2
    # Without "model" the embedding model answers.
    raw = httpx.post(enc_server.base_url + "/v1/embeddings", json={"input": "hi"}, timeout=60)
    assert raw.status_code == 200 and raw.json()["model"] == ENCODER
    # The encoder named on a generation endpoint: the error says what it is.
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        r = httpx.post(enc_server.base_url + path, json={"model": ENCODER, **body}, timeout=60)
        assert r.status_code == 404 and "embedding model" in r.json()["error"]["message"], r.text


def test_chat_model_embeddings_by_its_id(enc_client):
    r = enc_client.embeddings.create(model=MODEL, input=["The cat sat on the mat.", "Hello"])
    dims = {len(d.embedding) for d in r.data}
    assert len(dims) == 1 and dims.pop() >= 256
    for d in r.data:
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1.0) < 1e-3


def test_models_lists_the_embedding_model(enc_client):
    ids = [m.id for m in enc_client.models.list().data]
    assert ids[0] == MODEL and ENCODER in ids
    # Retrieved by its name or its alias (as the chat model is), named by its name.
    assert enc_client.models.retrieve(ENCODER).id == ENCODER
    assert enc_client.models.retrieve("minilm").id == ENCODER


@MODEL_INDEPENDENT
@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": 5}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": [999999999]}, "input"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "hi", "dimensions": 3}, "dimensions"),
        ({"model": ENCODER}, "input"),
    ],
)
def test_bad_requests_name_the_field(enc_server, body, param):
    r = httpx.post(enc_server.base_url + "/v1/embeddings", json=body, timeout=60)
    assert_error(r, 400, param=param)


def test_unknown_model_and_too_long_input(enc_server):
    r = httpx.post(
        enc_server.base_url + "/v1/embeddings", json={"model": "nope", "input": "hi"}, timeout=60
    )
    assert_error(r, 404)
    # The chat model refuses an input longer than its context; the encoder truncates.
    long_text = "hello " * 50_000
    r = httpx.post(
        enc_server.base_url + "/v1/embeddings", json={"model": MODEL, "input": long_text}, timeout=120
    )
    assert_error(r, 400, param="input", code="context_length_exceeded")
    r = httpx.post(
        enc_server.base_url + "/v1/embeddings", json={"model": ENCODER, "input": long_text}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256


@MODEL_INDEPENDENT
def test_tokenize_and_detokenize_take_the_model(enc_server):
    """`model` picks the tokenizer of /tokenize and /detokenize (they used the chat model's
    whatever was named): the encoder's ids are the reference's."""
    case = reference_cases()[0]
    r = httpx.post(
        enc_server.base_url + "/tokenize",
        json={"model": ENCODER, "content": case["text"], "add_special": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == case["ids"]
    r = httpx.post(
        enc_server.base_url + "/detokenize",
        json={"model": ENCODER, "tokens": case["ids"][1:-1]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    # WordPiece text: lowercased, pieces joined by spaces (no clean-up around punctuation).
    assert r.json()["content"].replace(" ", "") == case["text"].lower().replace(" ", "")
    chat = httpx.post(enc_server.base_url + "/tokenize", json={"content": case["text"]}, timeout=60)
    assert chat.json()["tokens"] != case["ids"][1:-1]
    r = httpx.post(enc_server.base_url + "/tokenize", json={"model": "nope", "content": "hi"})
    assert_error(r, 404)


@MODEL_INDEPENDENT
def test_encoder_requests_take_a_slot_queue_and_are_counted():
    """An encoder's requests go through `--parallel` and `--max-queue` as generations do (all
    were taken, however many), and count in `/metrics` (they did not)."""
    from conftest import get_metrics, post_at_once

    srv = start_server("--embedding-model", ENCODER, "--parallel", "1", "--max-queue", "1")
    try:
        body = {"model": ENCODER, "input": [f"sentence {i} about the sea" for i in range(300)]}
        n = 6
        admitted, _ = post_at_once(srv.base_url + "/v1/embeddings", body, n)
        assert admitted and all(r.status_code == 200 for r in admitted)
        tokens = sum(r.json()["usage"]["prompt_tokens"] for r in admitted)
        metrics = get_metrics(srv.base_url)
        assert metrics["weft:request_success_total"] == len(admitted)
        assert metrics["weft:prompt_tokens_total"] == tokens
        assert metrics["weft:request_failure_total"] == 0
    finally:
        srv.stop()
