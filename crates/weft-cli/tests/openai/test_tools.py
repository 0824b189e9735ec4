"""Tool calls: tool_choice required / named / none / auto, parallel_tool_calls, streaming."""

import asyncio
import json

import jsonschema
import openai
import pytest

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


def test_stop_strings_do_not_cut_a_forced_call(client, model):
    # A stop string met inside the arguments cut them into JSON that does not parse, and the
    # answer still said finish_reason "stop".
    req = dict(
        model=model, messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=320,
        **greedy(),
    )
    plain = client.chat.completions.create(**req).choices[0]
    calls = assert_valid_calls(plain.message, plain.finish_reason)
    stopped = client.chat.completions.create(stop=['"}', '", "', "{"], **req).choices[0]
    assert assert_valid_calls(stopped.message, stopped.finish_reason) == calls


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


def _gather_stream(client, **req):
    """A stream's content (None when no delta carried any), its calls as (name, arguments)
    and its finish reason."""
    content, calls, finish = None, {}, None
    for chunk in client.chat.completions.create(stream=True, **req):
        for choice in chunk.choices:
            if choice.delta.content is not None:
                content = (content or "") + choice.delta.content
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"name": None, "arguments": ""})
                if d.function and d.function.name:
                    call["name"] = d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
    return content, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)], finish


TWO_CALLS = (
    '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
    '{"name": "get_time", "arguments": {"timezone": "UTC"}}]</tool_call>'
)


def _auto(model, text, **extra):
    """An `auto` request whose answer is `text` (a regex fixes what the model writes)."""
    literal = "".join(
        "\\n" if c == "\n" else "\\" + c if c in r"\.^$|?*+()[]{}" else c for c in text
    )
    return dict(model=model, messages=QUESTION, tools=TOOLS, tool_choice="auto",
                max_tokens=120, extra_body={"regex": literal}, **greedy(), **extra)


def test_auto_text_before_calls_is_their_content(client, model):
    """Under `auto` an answer may say something and then call, as vLLM's Hermes parser and
    llama-server read it: the text is the content and the calls are calls, streamed or not."""
    req = _auto(model, "Let me check.\n" + TWO_CALLS)
    r = client.chat.completions.create(**req)
    message = r.choices[0].message
    calls = assert_valid_calls(message, r.choices[0].finish_reason, calls_only=False)
    assert message.content == "Let me check.\n"
    assert calls == [("get_weather", {"city": "Paris", "unit": "celsius"}),
                     ("get_time", {"timezone": "UTC"})]
    content, streamed, finish = _gather_stream(client, **req)
    assert (content, finish) == ("Let me check.\n", "tool_calls")
    assert streamed == [(c.function.name, c.function.arguments) for c in message.tool_calls]

    # Calls alone: content is null, streamed (the first delta names only the role) or not.
    req = _auto(model, TWO_CALLS)
    r = client.chat.completions.create(**req)
    assert r.choices[0].message.content is None
    content, streamed, finish = _gather_stream(client, **req)
    assert (content, finish, len(streamed)) == (None, "tool_calls", 2)

    # A tag that does not hold calls of the listed tools stays text, to the letter.
    odd = 'See <tool_call>[{"name": "get_news"}]</tool_call> for more.'
    r = client.chat.completions.create(**_auto(model, odd))
    assert (r.choices[0].message.content, r.choices[0].message.tool_calls) == (odd, None)
    assert _gather_stream(client, **_auto(model, odd))[:2] == (odd, [])


def test_parallel_tool_calls_false_keeps_the_first_call_under_auto(client, model):
    req = _auto(model, TWO_CALLS, parallel_tool_calls=False)
    r = client.chat.completions.create(**req)
    calls = assert_valid_calls(r.choices[0].message, r.choices[0].finish_reason)
    assert calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    content, streamed, finish = _gather_stream(client, **req)
    assert (content, finish) == (None, "tool_calls")
    assert [(n, json.loads(a)) for n, a in streamed] == calls


def test_auto_tools_are_checked_as_forced_ones(client, model):
    """An invalid tool schema is a 400 under `auto` as under `required`, and `parameters` must
    describe an object (clients parse the arguments into one)."""
    bad = [{"type": "function", "function": {"name": "f", "parameters": p}}
           for p in ({"type": "object", "properties": {"a": {"type": "bogus"}}},
                     {"type": "string"})]
    for tools in ([bad[0]], [bad[1]]):
        for choice in ("auto", "required"):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model=model, messages=QUESTION, tools=tools,
                                               tool_choice=choice, max_tokens=4)
            assert e.value.param == "tools", e.value.body
