"""A sweep of invalid request bodies for /v1/chat/completions and /v1/completions: every one gets
a 4xx in the OpenAI error shape, and the server keeps serving afterwards.

The bodies come from a valid base body (max_tokens 4, so that an accidentally valid one would be
cheap) by deterministic, seeded mutation, plus hand-written cases. Every mutation is invalid by
the spec on its own: wrong types, out-of-range numbers, missing required fields, broken JSON.
Mutations combined in one body touch disjoint fields, so each keeps its invalid value."""

import json
import random
from concurrent.futures import ThreadPoolExecutor

from conftest import assert_error_shape, kv_idle, user

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
DELETE = object()  # an override value that removes the field
SEED = 20240611

# Values of the wrong JSON type for a number or boolean field.
NOT_A_NUMBER = ["4", "NaN", "Infinity", True, [], {}, [1], {"a": 1}]
NOT_A_BOOL = ["yes", "true", 1, 0, [], {}]
HUGE_INTS = [2**64, 1e308]  # beyond any integer type / not an integer

# Invalid values of the fields both endpoints take.
COMMON_FIELDS = {
    "model": [123, True, [], {}, ["x"]],
    "max_tokens": [-1, -(2**63), 1.5, *HUGE_INTS, *NOT_A_NUMBER],
    "temperature": [-1, -1e308, *NOT_A_NUMBER],
    "top_p": [2, -0.5, 1e308, *NOT_A_NUMBER],
    "top_k": [1.5, *HUGE_INTS, "40", True, [], {}],
    "min_p": [-1, "0.1", True, [], {}],
    "presence_penalty": ["0.5", True, [], {}],
    "frequency_penalty": ["0.5", True, [], {}],
    "repetition_penalty": ["1.1", True, [], {}],
    "seed": [1.5, *HUGE_INTS, "42", True, [], {}],
    "n": [0, -1, 1.5, *HUGE_INTS, "2", True, [], {}],
    "stop": [5, True, {"a": 1}, [1, 2], ["a", "b", "c", "d", "e"], [["a"]], [None]],
    "stream": ["yes", 1, [], {}],
    "logit_bias": [
        "garbage",
        5,
        [],
        [1, 2],
        {"abc": 1},
        {"1.5": 1},
        {"": 1},
        {"-1": 1},
        {"99999999": 1},
        {"1": 101},
        {"1": -1000},
        {"1": "x"},
        {"1": 1e308},
        {"1": []},
        {"1": {}},
    ],
    "ignore_eos": NOT_A_BOOL,
    "min_tokens": [-1, 1.5, *HUGE_INTS, "3", [], {}],
}

CHAT_FIELDS = {
    "messages": [
        DELETE,
        None,
        "hi",
        5,
        {},
        [],
        [1],
        ["hi"],
        [None],
        [["user", "hi"]],
        [{"content": "hi"}],
        [{"role": 5, "content": "hi"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": 1.5}],
        [{"role": "user", "content": True}],
        [{"role": "user", "content": {"a": 1}}],
        [{"role": "user", "content": [1, 2]}],
        [{"role": "user", "content": [{"type": "text"}]}],
    ],
    "max_completion_tokens": [-1, 1.5, *HUGE_INTS, "4", [], {}],
    "logprobs": ["yes", 5, [], {}],
    "tools": [
        "garbage",
        5,
        {},
        [5],
        ["f"],
        [{"type": "function"}],
        [{"type": "function", "function": {}}],
        [{"type": "function", "function": {"name": 5}}],
    ],
    "tool_choice": [
        5,
        "sometimes",
        [],
        {},
        {"type": "function"},
        {"type": "function", "function": {"name": 5}},
        "required",  # with no tools to call
    ],
    "parallel_tool_calls": ["no", 5, [], {}],
    "response_format": [
        "json",
        5,
        [],
        {},
        {"type": "xml"},
        {"type": 5},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": 5},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
    ],
    "grammar": [5, True, [], {}, 'start: ("a"', "root ::= undefined-rule"],
    "regex": [5, True, [], {}, "(abc", "[z-a]"],
}

COMPLETION_FIELDS = {
    "prompt": [
        DELETE,
        None,
        5,
        True,
        {},
        {"a": 1},
        [],
        [None],
        [-1],
        [99999999],
        [1.5],
        ["a", 5],
        [[1, 2], "a"],
        [[-1]],
        [["a"]],
        [[[1]]],
    ],
    "echo": NOT_A_BOOL,
    "suffix": ["x", 5, [], {}],
    "logprobs": [-1, 1.5, "3", [], {}, 2**64],
}

VALID_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
# Mutations whose invalid value needs another field set with it.
CHAT_MULTI = [
    *({"logprobs": True, "top_logprobs": v} for v in (21, 50, -1, 1.5, 2**64, "3", [])),
    *({"stream": True, "stream_options": v} for v in ("yes", 5, [], {"include_usage": "yes"})),
    {"stream_options": {"include_usage": True}},  # without stream, as OpenAI refuses it
    {"tools": VALID_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    *(
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
            "tool_choice": "required",
        }
        for params in ("not a schema", {"type": "frobnicate"})
    ),
]
COMPLETION_MULTI = [
    *({"stream": True, "stream_options": v} for v in ("yes", 5, [], {"include_usage": "yes"})),
    {"stream_options": {"include_usage": True}},
]


def _dump(obj) -> bytes:
    return json.dumps(obj).encode()


def _apply(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if value is DELETE:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _label(override: dict) -> str:
    parts = [f"{k}={'<deleted>' if v is DELETE else json.dumps(v)}" for k, v in override.items()]
    return " ".join(parts)[:160]


def _field_mutations(fields: dict, multi: list) -> list:
    singles = [
        {name: v} for table in (COMMON_FIELDS, fields) for name, vals in table.items() for v in vals
    ]
    return singles + list(multi)


def _combined(mutations: list, rng: random.Random, count: int) -> list:
    """`count` bodies' worth of 2-3 mutations each, on disjoint fields."""
    out = []
    while len(out) < count:
        picked, keys = {}, set()
        for m in rng.sample(mutations, rng.randint(2, 3)):
            if keys.isdisjoint(m):
                picked.update(m)
                keys.update(m)
        if len(keys) >= 2:
            out.append(picked)
    return out


def _broken_json(text: str, rng: random.Random, count: int) -> list:
    """Truncations and stray structural characters that make `text` unparsable."""
    out = []
    while len(out) < count:
        if rng.random() < 0.5:
            broken = text[: rng.randrange(1, len(text) - 1)]
        else:
            at = rng.randrange(1, len(text) - 1)
            broken = text[:at] + rng.choice('{}[]:,"\\') + text[at:]
        try:
            json.loads(broken)
        except ValueError:
            out.append(broken.encode())
    return out


def _raw_bodies(base: dict, text_field: str, rng: random.Random) -> list:
    """Hand-written bodies that are not a valid JSON object of the right shape."""
    text = json.dumps(base)
    deep_list = b"[" * 10_000 + b"]" * 10_000
    deep_obj = b'{"a":' * 10_000 + b"1" + b"}" * 10_000

    def raw_in(field: str, raw: bytes) -> bytes:
        return _dump({**base, field: "__RAW__"}).replace(b'"__RAW__"', raw)

    def bad_text(raw: bytes) -> bytes:
        if text_field == "messages":
            body = _dump({**base, "messages": user("__BAD__")})
        else:
            body = _dump({**base, "prompt": "__BAD__"})
        return body.replace(b"__BAD__", raw)

    cases = [
        ("empty body", b""),
        ("whitespace body", b"  \n "),
        ("null", b"null"),
        ("number", b"5"),
        ("string", b'"hello"'),
        ("true", b"true"),
        ("empty array", b"[]"),
        ("body in an array", ("[" + text + "]").encode()),
        ("empty object", b"{}"),
        ("single quotes", text.replace('"', "'").encode()),
        ("comment", (text[:-1] + " /* note */}").encode()),
        ("trailing garbage", (text + "x").encode()),
        ("two objects", (text + text).encode()),
        ("10000 nested arrays", deep_list),
        ("10000 nested objects", deep_obj),
        (f"{text_field} nested 10000 deep", raw_in(text_field, deep_list)),
        ("stop nested 10000 deep", raw_in("stop", deep_list)),
        ("logit_bias nested 10000 deep", raw_in("logit_bias", deep_obj)),
        ("invalid UTF-8 ff fe", bad_text(b"\xff\xfe")),
        ("invalid UTF-8 c3 28", bad_text(b"\xc3\x28")),
        ("invalid UTF-8 lone continuation", bad_text(b"ab\x80cd")),
        ("invalid UTF-8 encoded surrogate", bad_text(b"\xed\xa0\x80")),
        ("invalid UTF-8 truncated sequence", bad_text(b"\xe2\x82")),
        ("raw control character", bad_text(b"a\x01b")),
    ]
    for field in ("temperature", "top_p", "max_tokens"):
        for literal in ("NaN", "Infinity", "-Infinity"):
            cases.append((f"{field}={literal} literal", raw_in(field, literal.encode())))
    cases += [(f"broken JSON #{i}", b) for i, b in enumerate(_broken_json(text, rng, 30))]
    return cases


def build_cases(model: str) -> list:
    """(label, path, body bytes) for every invalid request of the sweep."""
    rng = random.Random(SEED)
    cases = []
    for path, base, fields, multi, text_field in (
        (
            CHAT,
            {"model": model, "messages": user("Hi"), "max_tokens": 4, "temperature": 0},
            CHAT_FIELDS,
            CHAT_MULTI,
            "messages",
        ),
        (
            COMPLETIONS,
            {"model": model, "prompt": "Hi", "max_tokens": 4, "temperature": 0},
            COMPLETION_FIELDS,
            COMPLETION_MULTI,
            "prompt",
        ),
    ):
        mutations = _field_mutations(fields, multi)
        for m in mutations + _combined(mutations, rng, 25):
            cases.append((_label(m), path, _dump(_apply(base, m))))
        for label, body in _raw_bodies(base, text_field, rng):
            cases.append((label, path, body))
    return cases


def test_malformed_requests_get_4xx_in_the_error_shape_and_the_server_survives(
    server, http, client, model
):
    cases = build_cases(model)
    assert len(cases) >= 200, len(cases)

    def send(case):
        label, path, body = case
        r = http.post(path, content=body, headers={"content-type": "application/json"})
        problem = None
        if not 400 <= r.status_code < 500:
            problem = f"status {r.status_code}"
        else:
            try:
                assert_error_shape(r.json())
            except (ValueError, AssertionError) as e:
                problem = f"status {r.status_code}, not the error shape: {e}"
        return None if problem is None else f"POST {path} [{label}]: {problem}: {r.text[:200]!r}"

    with ThreadPoolExecutor(8) as pool:
        failures = [f for f in pool.map(send, cases) if f]
    assert not failures, f"{len(failures)} of {len(cases)} bad bodies:\n" + "\n".join(failures[:15])

    r = client.chat.completions.create(model=model, messages=user("Say hello."), max_tokens=8)
    assert r.choices[0].message.content
    kv_idle(server.base_url)
