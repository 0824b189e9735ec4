"""Tool calls: tool_choice required / named / none / auto, parallel_tool_calls, streaming."""

import asyncio
import json

import jsonschema

from conftest import greedy, user

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {
        "timezone": {"type": "string", "enum": ["UTC", "Europe/Paris", "Asia/Tokyo"]},
        "hour24": {"type": "boolean"},
    },
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a time zone.",
            "parameters": TIME_PARAMS,
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = user("What is the weather like in Paris right now?")
NAMED_TIME = {"type": "function", "function": {"name": "get_time"}}


def assert_valid_calls(message, finish_reason, only_name=None, calls_only=True):
    """The message has tool calls (and, with `calls_only`, nothing else), each naming a known
    tool (or `only_name`) with arguments that validate against that tool's parameters; returns
    the calls as (name, arguments)."""
    assert finish_reason == "tool_calls", (finish_reason, message)
    if calls_only:
        assert message.content is None, message
    assert message.tool_calls, message
    calls = []
    for call in message.tool_calls:
        assert isinstance(call.id, str) and call.id, call
        assert call.type == "function", call
        name = call.function.name
        assert name in PARAMS, call
        if only_name is not None:
            assert name == only_name, call
        args = json.loads(call.function.arguments)
        assert isinstance(args, dict), call
        jsonschema.validate(args, PARAMS[name])
        calls.append((name, args))
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls), "ids are unique"
    return calls


async def _sampled_runs(aclient, model, **req):
    """Twenty concurrent runs at temperature 1, seeds 0..19."""
    async with aclient:
        return await asyncio.gather(
            *(
                aclient.chat.completions.create(
                    model=model,
                    messages=QUESTION,
                    tools=TOOLS,
                    temperature=1.0,
                    seed=seed,
                    max_tokens=320,
                    **req,
                )
                for seed in range(20)
            )
        )


def test_tool_choice_required_always_gives_valid_calls(aclient, model):
    responses = asyncio.run(_sampled_runs(aclient, model, tool_choice="required"))
    for seed, r in enumerate(responses):
        choice = r.choices[0]
        try:
            assert_valid_calls(choice.message, choice.finish_reason)
        except Exception as e:
            raise AssertionError(f"seed {seed}: {e!r}") from e


def test_named_tool_choice_always_calls_that_function(aclient, model):
    responses = asyncio.run(_sampled_runs(aclient, model, tool_choice=NAMED_TIME))
    for seed, r in enumerate(responses):
        choice = r.choices[0]
        try:
            calls = assert_valid_calls(choice.message, choice.finish_reason, only_name="get_time")
            # One call of the named function, as OpenAI makes (parallel calls allowed or not).
            assert len(calls) == 1, calls
        except Exception as e:
            raise AssertionError(f"seed {seed}: {e!r}") from e


def test_parallel_tool_calls_false_gives_exactly_one_call(client, model):
    for seed in range(3):
        r = client.chat.completions.create(
            model=model,
            messages=user("What time is it in Tokyo, and what is the weather in London?"),
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=160,
        )
        calls = assert_valid_calls(r.choices[0].message, r.choices[0].finish_reason)
        assert len(calls) == 1, (seed, calls)


def test_streamed_tool_call_deltas_reassemble_into_the_same_valid_call(client, model):
    # One call: whether a greedy small model closes its list after the first call or repeats
    # the call until max_tokens is a near-tie (Gemma 3 goes either way as roundings move).
    # Several calls in one stream are covered by the server's CallStream unit test.
    req = dict(
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice=NAMED_TIME,
        parallel_tool_calls=False,
        max_tokens=160,
        logprobs=True,
        **greedy(),
    )
    full = client.chat.completions.create(**req)
    expected = assert_valid_calls(
        full.choices[0].message, full.choices[0].finish_reason, "get_time"
    )

    calls = {}  # index -> {"id", "name", "arguments"}
    content, finish, tokens = "", None, []
    for chunk in client.chat.completions.create(stream=True, **req):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            tokens += [e.token for e in (choice.logprobs.content if choice.logprobs else [])]
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:
                    assert delta.id, f"the first delta of a call has its id: {delta}"
                    assert delta.function and delta.function.name, f"... and its name: {delta}"
                    calls[delta.index] = {
                        "id": delta.id,
                        "name": delta.function.name,
                        "arguments": "",
                    }
                call = calls[delta.index]
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
    assert finish == "tool_calls"
    assert content == "", f"no content beside tool calls: {content!r}"
    assert sorted(calls) == list(range(len(calls))), "call indices are 0, 1, ..."
    streamed = []
    for index in sorted(calls):
        call = calls[index]
        assert call["name"] == "get_time"
        args = json.loads(call["arguments"])
        jsonschema.validate(args, TIME_PARAMS)
        streamed.append((call["name"], args))
    assert streamed == expected, "stream and non-stream agree at temperature 0"
    # To the letter: the arguments' text as the model wrote it, and every token's log-probability.
    written = [c.function.arguments for c in full.choices[0].message.tool_calls]
    assert [calls[i]["arguments"] for i in sorted(calls)] == written
    assert tokens == [e.token for e in full.choices[0].logprobs.content]


def test_tool_choice_none_gives_content_and_no_tool_calls(client, model):
    r = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, tool_choice="none", max_tokens=24, **greedy()
    )
    message = r.choices[0].message
    assert isinstance(message.content, str) and message.content
    assert not message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_tool_choice_auto_gives_content_or_valid_calls(client, model):
    r = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, tool_choice="auto", max_tokens=160, **greedy()
    )
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert_valid_calls(choice.message, choice.finish_reason, calls_only=False)
    else:
        assert isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")


def test_a_forced_call_cut_short_is_a_call_streamed_or_not(client, model):
    # Cut by max_tokens inside its arguments: the non-streamed answer used to put the calls'
    # JSON in `content`, while the stream sent tool-call deltas.
    def both(max_tokens):
        req = dict(
            model=model, messages=QUESTION, tools=TOOLS, tool_choice={"type": "function",
            "function": {"name": "get_weather"}}, max_tokens=max_tokens, **greedy()
        )
        choice = client.chat.completions.create(**req).choices[0]
        assert choice.finish_reason == "length", choice
        assert choice.message.content is None, choice.message
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        streamed, content, finish = [], "", None
        for chunk in client.chat.completions.create(stream=True, **req):
            for c in chunk.choices:
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    if d.function.name:
                        streamed.append((d.function.name, ""))
                    name, args = streamed[-1]
                    streamed[-1] = (name, args + (d.function.arguments or ""))
                finish = c.finish_reason or finish
        assert (streamed, content, finish) == (calls, "", "length")
        return calls

    # Cut inside the arguments: the call begun, with its arguments so far.
    [(name, args)] = both(24)
    assert name == "get_weather" and args.startswith("{"), args
    # Cut before they begin: no call and no content either way.
    assert both(3) == []


def test_a_function_without_parameters_gets_empty_arguments(client, model):
    tools = [{"type": "function", "function": {"name": "now", "description": "Current time"}}]
    r = client.chat.completions.create(
        model=model, messages=user("What time is it?"), tools=tools, tool_choice="required",
        parallel_tool_calls=False, max_tokens=40, **greedy()
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [(c.function.name, json.loads(c.function.arguments)) for c in
            choice.message.tool_calls] == [("now", {})]


def test_open_parameters_are_closed_to_undeclared_keys(client, model):
    # A schema that does not say `additionalProperties`: the arguments hold its keys only (a
    # small model copied "type" and "properties" keys from the schema it was shown).
    params = {k: v for k, v in WEATHER_PARAMS.items() if k != "additionalProperties"}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    for seed in range(4):
        r = client.chat.completions.create(
            model=model, messages=QUESTION, tools=tools, tool_choice="required",
            parallel_tool_calls=False, max_tokens=80, temperature=1.0, seed=seed
        )
        for c in r.choices[0].message.tool_calls or []:
            assert set(json.loads(c.function.arguments)) <= {"city", "unit"}, c


def test_parallel_tool_results_go_back_as_one_turn(client, model):
    # Two results of one turn's calls: templates that check roles alternate (Gemma 3's) saw
    # two user turns in a row and refused the conversation.
    args = json.dumps({"city": "Paris", "unit": "celsius"})
    messages = user("What is the weather in Paris and in Rome?") + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": args}}
            for i in ("a", "b")]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny, 21"},
        {"role": "tool", "tool_call_id": "b", "content": "rainy, 14"},
    ]
    r = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=8, **greedy()
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
