"""Error statuses and the OpenAI error shape: 400 per parameter, context_length_exceeded, 401,
404, 413, 429, wrong method / path, malformed JSON."""

import re

import httpx
import openai
import pytest

from conftest import (
    MODEL_INDEPENDENT,
    assert_error,
    greedy,
    kv_idle,
    make_client,
    post_at_once,
    start_server,
    tokenize,
    user,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LONG_TEXT = "hello " * 50_000  # more tokens than any served model's context

def TOOL(name, parameters=None):
    function = {"name": name, **({"parameters": parameters} if parameters else {})}
    return {"type": "function", "function": function}


BAD_CHAT_PARAMS = {
    "temperature_negative": ({"temperature": -1}, "temperature"),
    "n_zero": ({"n": 0}, "n"),
    "top_p_above_1": ({"top_p": 2}, "top_p"),
    "logit_bias_non_integer_key": ({"logit_bias": {"abc": 1}}, "logit_bias"),
    "logit_bias_out_of_vocab": ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    "top_logprobs_above_20": ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    "messages_empty": ({"messages": []}, "messages"),
    "message_without_role": ({"messages": [{"content": "hi"}]}, "messages"),
    "tools_of_one_name": ({"tools": [TOOL("f"), TOOL("f")]}, "tools"),
    "forced_call_of_an_invalid_schema": (
        {"tools": [TOOL("f", {"type": "frob"})], "tool_choice": "required"},
        "tools",
    ),
}
BAD_COMPLETION_PARAMS = {
    "temperature_negative": ({"temperature": -1}, "temperature"),
    "n_zero": ({"n": 0}, "n"),
    "top_p_above_1": ({"top_p": 2}, "top_p"),
    "logit_bias_non_integer_key": ({"logit_bias": {"abc": 1}}, "logit_bias"),
    "logit_bias_out_of_vocab": ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    "suffix": ({"suffix": "and they lived happily ever after."}, "suffix"),
}


@pytest.mark.parametrize("override, param", BAD_CHAT_PARAMS.values(), ids=BAD_CHAT_PARAMS.keys())
def test_chat_bad_parameter_is_400_naming_the_parameter(http, model, override, param):
    body = {"model": model, "messages": user("Hi"), "max_tokens": 4, **override}
    assert_error(http.post(CHAT, json=body), 400, param=param, type_="invalid_request_error")


@pytest.mark.parametrize(
    "override, param", BAD_COMPLETION_PARAMS.values(), ids=BAD_COMPLETION_PARAMS.keys()
)
def test_completion_bad_parameter_is_400_naming_the_parameter(http, model, override, param):
    body = {"model": model, "prompt": "Hi", "max_tokens": 4, **override}
    assert_error(http.post(COMPLETIONS, json=body), 400, param=param, type_="invalid_request_error")


def test_openai_client_raises_bad_request_with_the_error_body(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, messages=user("Hi"), temperature=-1, max_tokens=4
        )
    assert info.value.status_code == 400
    assert info.value.param == "temperature"


@MODEL_INDEPENDENT
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_malformed_json_is_400_in_the_error_shape(http, path):
    r = http.post(
        path, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"}
    )
    assert_error(r, 400)


def _numbers(message: str) -> list:
    return [int(re.sub(r"[,_]", "", n)) for n in re.findall(r"\d[\d,_]*\d|\d", message)]


def _context_error(resp: httpx.Response) -> list:
    """Checks a context_length_exceeded error and returns the numbers in its message."""
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    err = assert_error(resp, 400, code="context_length_exceeded")
    return _numbers(err["message"])


@pytest.mark.parametrize("stream", [False, True], ids=["non_stream", "stream"])
def test_chat_prompt_over_the_context_is_context_length_exceeded(server, http, model, stream):
    content_tokens = len(tokenize(server.base_url, LONG_TEXT))
    r = http.post(CHAT, json={"model": model, "messages": user(LONG_TEXT), "stream": stream})
    numbers = _context_error(r)
    assert any(n >= content_tokens for n in numbers), f"no prompt token count in {numbers}"
    assert any(0 < n < content_tokens for n in numbers), f"no context size in {numbers}"


def _completion_context(server, http, model, stream=False):
    """Sends an over-long completion prompt; returns (prompt token count, context size)."""
    counts = {len(tokenize(server.base_url, LONG_TEXT, add_special=s)) for s in (False, True)}
    r = http.post(COMPLETIONS, json={"model": model, "prompt": LONG_TEXT, "stream": stream})
    numbers = _context_error(r)
    prompt_tokens = [n for n in numbers if n in counts]
    assert prompt_tokens, f"the message names the prompt's {counts} tokens: {numbers}"
    smaller = [n for n in numbers if 0 < n < prompt_tokens[0]]
    assert smaller, f"the message names the context size: {numbers}"
    return prompt_tokens[0], max(smaller)


@pytest.mark.parametrize("stream", [False, True], ids=["non_stream", "stream"])
def test_completion_prompt_over_the_context_is_context_length_exceeded(server, http, model, stream):
    _completion_context(server, http, model, stream)


def test_prompt_plus_max_tokens_over_the_context_is_context_length_exceeded(server, http, model):
    _, n_ctx = _completion_context(server, http, model)
    body = {"model": model, "prompt": "hello " * (n_ctx // 2), "max_tokens": n_ctx}
    r = http.post(COMPLETIONS, json=body)
    _context_error(r)
    # The prompt fits: the parameter to lower is max_tokens.
    assert r.json()["error"]["param"] == "max_tokens", r.json()
    # Asked for under its newer name, the error names that one.
    body["max_completion_tokens"] = body.pop("max_tokens")
    r = http.post(CHAT, json={**body, "messages": user(body.pop("prompt"))})
    _context_error(r)
    assert r.json()["error"]["param"] == "max_completion_tokens", r.json()
    assert "max_completion_tokens" in r.json()["error"]["message"], r.json()


def test_a_completion_without_max_tokens_writes_16_tokens_as_openai(client, model):
    r = client.completions.create(
        model=model, prompt="Once upon a time", extra_body={"ignore_eos": True}, **greedy()
    )
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length", r


@MODEL_INDEPENDENT
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_unknown_model_is_404_model_not_found(http, path):
    body = {"model": "no-such-model", "max_tokens": 4}
    body.update({"messages": user("Hi")} if path == CHAT else {"prompt": "Hi"})
    assert_error(http.post(path, json=body), 404, code="model_not_found")


@MODEL_INDEPENDENT
def test_body_over_the_limit_is_413(server, model):
    head = b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content": "'
    body = head + b"a" * (20 * 1024 * 1024) + b'"}], "max_tokens": 4}'
    r = httpx.post(
        server.base_url + CHAT,
        content=body,
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert_error(r, 413)


@MODEL_INDEPENDENT
@pytest.mark.parametrize(
    "method, path",
    [("GET", CHAT), ("GET", COMPLETIONS), ("POST", "/v1/no-such-endpoint"), ("GET", "/nope")],
)
def test_wrong_method_or_path_is_404_or_405_with_a_json_body(http, method, path):
    r = http.request(method, path)
    assert r.status_code in (404, 405), f"{method} {path}: {r.status_code} {r.text[:200]}"
    try:
        r.json()
    except ValueError:
        raise AssertionError(f"{method} {path}: body is not JSON: {r.text[:200]!r}") from None


# --------------------------------------------------------------------------------------------
# 401: a server started with --api-key

API_KEY = "sekrit-test-key"


@pytest.fixture(scope="module")
def keyed_server():
    srv = start_server("--api-key", API_KEY)
    try:
        yield srv
    finally:
        srv.stop()


@MODEL_INDEPENDENT
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong-key"}, {"authorization": API_KEY}],
    ids=["no_key", "wrong_key", "no_bearer"],
)
def test_api_key_server_answers_401_without_the_right_key(keyed_server, model, path, headers):
    body = {"model": model, "max_tokens": 4}
    body.update({"messages": user("Hi")} if path == CHAT else {"prompt": "Hi"})
    r = httpx.post(keyed_server.base_url + path, json=body, headers=headers, timeout=60)
    assert_error(r, 401)


@MODEL_INDEPENDENT
def test_api_key_server_answers_with_the_right_key(keyed_server, model):
    good = make_client(keyed_server, api_key=API_KEY)
    bad = make_client(keyed_server, api_key="wrong-key")
    try:
        r = good.chat.completions.create(model=model, messages=user("Hi"), max_tokens=4)
        assert r.choices[0].message.role == "assistant"
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=model, messages=user("Hi"), max_tokens=4)
    finally:
        good.close()
        bad.close()


@MODEL_INDEPENDENT
def test_api_key_server_keeps_health_and_models_open(keyed_server, model):
    health = httpx.get(keyed_server.base_url + "/health", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    models = httpx.get(keyed_server.base_url + "/v1/models", timeout=30)
    assert models.status_code == 200
    assert models.json()["data"][0]["id"] == model


# --------------------------------------------------------------------------------------------
# 429: a server with one running slot and one queue place


@MODEL_INDEPENDENT
def test_full_queue_is_429_and_the_admitted_requests_complete(model):
    srv = start_server("--parallel", "1", "--max-queue", "1")
    try:
        body = {
            "model": model,
            "messages": user("Tell me a long story."),
            "max_tokens": 300,
            "ignore_eos": True,
            "temperature": 0,
        }
        n = 6
        admitted, _ = post_at_once(srv.base_url + CHAT, body, n)
        for r in admitted:
            assert r.status_code == 200, r.text[:500]
            out = r.json()
            assert out["usage"]["completion_tokens"] == 300
            assert out["choices"][0]["finish_reason"] == "length"
        kv_idle(srv.base_url)
    finally:
        srv.stop()
