"""POST /v1/chat/completions: response and chunk shapes, streaming, usage, n."""

from conftest import greedy, stream_post, tokenize, user

STORY = "Write a long story about a dragon who loves books."


def test_chat_completion_has_the_openai_shape(http, model):
    r = http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": user("Say hello."), "max_tokens": 16, **greedy()},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["created"] > 1_600_000_000
    assert body["model"] == model
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert not choice["message"].get("tool_calls")
    assert "logprobs" in choice and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 < usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_stream_chunks_have_the_openai_shape(http, model):
    events = stream_post(
        http,
        "/v1/chat/completions",
        {
            "model": model,
            "messages": user("Say hello."),
            "max_tokens": 16,
            "stream": True,
            **greedy(),
        },
    )
    assert events and events[-1] == "[DONE]", events[-3:]
    assert events.count("[DONE]") == 1
    chunks = events[:-1]
    assert chunks, "no chunk before [DONE]"
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1, f"one id for all chunks: {ids}"
    assert ids.pop().startswith("chatcmpl-")
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == model
        assert isinstance(c["created"], int)
        assert c.get("usage") is None, "usage only with stream_options.include_usage"
        assert len(c["choices"]) == 1 and c["choices"][0]["index"] == 0
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] in ("stop", "length"), "the last chunk carries the finish reason"
    assert all(f is None for f in finishes[:-1]), finishes
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text


def test_chat_stream_text_equals_non_stream_text_at_temperature_0(client, model):
    req = dict(model=model, messages=user(STORY), max_tokens=32, **greedy())
    full = client.chat.completions.create(**req)
    pieces = []
    finish = None
    for chunk in client.chat.completions.create(stream=True, **req):
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason


def test_chat_stream_include_usage_adds_one_final_usage_chunk(http, client, model):
    req = {"model": model, "messages": user(STORY), "max_tokens": 24, **greedy()}
    full = client.chat.completions.create(**req)
    events = stream_post(
        http,
        "/v1/chat/completions",
        {**req, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    last = chunks[-1]
    assert last["choices"] == [], "the usage chunk has no choices"
    assert last["id"] == chunks[0]["id"]
    for c in chunks[:-1]:
        assert c.get("usage", "absent") is None, f"other chunks have usage: null: {c}"
        assert len(c["choices"]) == 1
    usage = last["usage"]
    assert usage["prompt_tokens"] == full.usage.prompt_tokens
    assert usage["completion_tokens"] == full.usage.completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == full.choices[0].message.content


def test_chat_usage_counts_the_generated_tokens_exactly(server, client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user(STORY),
        max_tokens=16,
        extra_body={"ignore_eos": True},
        **greedy(),
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 16
    assert len(tokenize(server.base_url, choice.message.content)) == 16, choice.message.content
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16


def test_chat_n3_returns_three_choices_and_sums_their_usage(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user("Name a color."),
        n=3,
        temperature=1.0,
        seed=7,
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for c in r.choices:
        assert c.message.role == "assistant"
        assert isinstance(c.message.content, str)
        assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 3 * 12


def test_chat_stream_n2_each_choice_starts_with_role_and_ends_with_finish_reason(http, model):
    events = stream_post(
        http,
        "/v1/chat/completions",
        {
            "model": model,
            "messages": user("Name an animal."),
            "n": 2,
            "temperature": 1.0,
            "seed": 3,
            "max_tokens": 10,
            "stream": True,
        },
    )
    assert events[-1] == "[DONE]"
    per_choice = {}
    for c in events[:-1]:
        for choice in c["choices"]:
            per_choice.setdefault(choice["index"], []).append(choice)
    assert sorted(per_choice) == [0, 1]
    for index, deltas in per_choice.items():
        assert deltas[0]["delta"].get("role") == "assistant", f"choice {index}"
        assert deltas[-1]["finish_reason"] in ("stop", "length"), f"choice {index}"
        assert all(d["finish_reason"] is None for d in deltas[:-1]), f"choice {index}"


def test_chat_accepts_system_and_multi_turn_messages(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        max_tokens=8,
        **greedy(),
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    short = client.chat.completions.create(
        model=model, messages=user("What is 2 + 2?"), max_tokens=8, **greedy()
    )
    assert r.usage.prompt_tokens > short.usage.prompt_tokens


def test_max_completion_tokens_limits_the_output(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user(STORY),
        max_completion_tokens=5,
        extra_body={"ignore_eos": True},
        **greedy(),
    )
    assert r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"
