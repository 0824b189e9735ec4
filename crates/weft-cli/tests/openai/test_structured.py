"""Structured output: response_format json_object / json_schema, and the `grammar` (Lark or GBNF)
and `regex` extras; invalid constraints are rejected before anything runs."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from conftest import assert_error, greedy, kv_idle, user

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PERSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
}
PERSON_PROMPT = "Describe a person as JSON with their name, age and city."


def test_json_object_response_parses_as_json(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user('Give a JSON object with exactly two keys, "name" (Bob) and "age" (30).'),
        response_format={"type": "json_object"},
        max_tokens=96,
        **greedy(),
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", f"unfinished JSON: {choice.message.content!r}"
    assert isinstance(json.loads(choice.message.content), dict)


def test_json_object_mode_gives_an_object_even_where_a_number_would_do(client, model):
    # Asked for a number, a model under "any JSON value" wrote digits up to the token limit
    # ("2.00000000121111..."); JSON mode promises an object.
    for question in ["What is 2+2?", "How many legs does a cat have?"]:
        r = client.chat.completions.create(
            model=model,
            messages=user(question),
            response_format={"type": "json_object"},
            max_tokens=60,
            **greedy(),
        )
        content = r.choices[0].message.content
        assert content.lstrip().startswith("{"), content


def test_json_schema_response_validates_against_the_schema(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user(PERSON_PROMPT),
        response_format=PERSON_FORMAT,
        max_tokens=96,
        **greedy(),
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON_SCHEMA)


def test_json_schema_stream_reassembles_into_a_valid_object(client, model):
    text = ""
    finish = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=user(PERSON_PROMPT),
        response_format=PERSON_FORMAT,
        max_tokens=96,
        stream=True,
        **greedy(),
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_json_schema_holds_for_sampled_outputs(client, model):
    def sample(seed: int) -> str:
        r = client.chat.completions.create(
            model=model,
            messages=user(PERSON_PROMPT),
            response_format=PERSON_FORMAT,
            max_tokens=128,
            temperature=1.0,
            seed=seed,
        )
        assert r.choices[0].finish_reason == "stop", (seed, r.choices[0].message.content)
        return r.choices[0].message.content

    with ThreadPoolExecutor(6) as pool:
        for text in pool.map(sample, range(6)):
            jsonschema.validate(json.loads(text), PERSON_SCHEMA)


@pytest.mark.parametrize(
    "grammar, pattern",
    [
        pytest.param(
            'start: answer " " NUMBER\nanswer: "yes" | "no"\nNUMBER: /[0-9]{1,3}/\n',
            r"(yes|no) [0-9]{1,3}",
            id="lark",
        ),
        pytest.param(
            'root ::= ("red" | "green" | "blue") ", " ("cat" | "dog")\n',
            r"(red|green|blue), (cat|dog)",
            id="gbnf",
        ),
    ],
)
def test_grammar_constrains_the_whole_output(client, model, grammar, pattern):
    r = client.chat.completions.create(
        model=model,
        messages=user("Answer the question: is the sky blue, and how many legs has a cat?"),
        max_tokens=16,
        extra_body={"grammar": grammar},
        **greedy(),
    )
    content = r.choices[0].message.content
    assert re.fullmatch(pattern, content), content
    assert r.choices[0].finish_reason == "stop"


def test_regex_constrains_the_whole_output(client, model):
    pattern = r"[A-Z][a-z]{2,8} (is|was) [0-9]{2}"
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=model,
            messages=user("Name someone and their age."),
            max_tokens=24,
            temperature=1.0,
            seed=seed,
            extra_body={"regex": pattern},
        )
        content = r.choices[0].message.content
        assert re.fullmatch(pattern, content), content
        assert r.choices[0].finish_reason == "stop"


INVALID_CONSTRAINTS = {
    "schema_unknown_type": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "frobnicate"}},
        }
    },
    "schema_dangling_ref": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
            },
        }
    },
    "lark_unbalanced": {"grammar": 'start: ("a" | "b"\n'},
    "gbnf_undefined_rule": {"grammar": "root ::= greeting\n"},
    "regex_unclosed_group": {"regex": "(abc"},
    "regex_bad_range": {"regex": "[z-a]+"},
}


@pytest.mark.parametrize("extra", INVALID_CONSTRAINTS.values(), ids=INVALID_CONSTRAINTS.keys())
def test_invalid_constraint_is_400_before_anything_runs(server, http, model, extra):
    before = kv_idle(server.base_url)
    r = http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": user("Hi"), "max_tokens": 8, **extra},
    )
    err = assert_error(r, 400, type_="invalid_request_error")
    assert err["param"] in (None, "response_format", "grammar", "regex"), err
    after = kv_idle(server.base_url)
    for counter in ("weft:prompt_tokens_total", "weft:generation_tokens_total"):
        assert after[counter] == before[counter], f"{counter} moved: nothing may run"
