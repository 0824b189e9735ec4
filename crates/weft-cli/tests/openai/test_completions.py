"""POST /v1/completions: shapes, streaming, prompt forms, echo, legacy logprobs, usage."""

from conftest import finite_logprob, greedy, stream_post, tokenize

PROMPT = "Once upon a time, in a small village by the sea,"
PROMPTS = ["The capital of France is", "Water is made of"]


def test_completion_has_the_openai_shape(http, model):
    r = http.post(
        "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 12, **greedy()}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["id"], str) and body["id"]
    assert body["object"] == "text_completion"
    assert isinstance(body["created"], int)
    assert body["model"] == model
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str) and choice["text"]
    assert "logprobs" in choice and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_completion_stream_text_equals_non_stream_text_at_temperature_0(http, client, model):
    req = {"model": model, "prompt": PROMPT, "max_tokens": 32, **greedy()}
    full = client.completions.create(**req)
    events = stream_post(http, "/v1/completions", {**req, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1, "one id for all chunks"
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    assert text == full.choices[0].text
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [full.choices[0].finish_reason]


def test_completion_stream_include_usage_matches_non_stream_usage(http, client, model):
    req = {"model": model, "prompt": PROMPT, "max_tokens": 16, **greedy()}
    full = client.completions.create(**req)
    events = stream_post(
        http, "/v1/completions", {**req, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == full.usage.prompt_tokens
    assert last["usage"]["completion_tokens"] == full.usage.completion_tokens
    assert all(c.get("usage", "absent") is None for c in events[:-2])


def test_completion_usage_counts_the_prompt_and_generated_tokens_exactly(server, client, model):
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=16, extra_body={"ignore_eos": True}, **greedy()
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16
    assert len(tokenize(server.base_url, r.choices[0].text)) == 16, r.choices[0].text
    # The prompt is tokenized like /tokenize does, with or without the model's special tokens (BOS).
    counts = {len(tokenize(server.base_url, PROMPT, add_special=s)) for s in (False, True)}
    assert r.usage.prompt_tokens in counts, (r.usage.prompt_tokens, counts)


def test_completion_prompt_list_gives_one_choice_per_prompt_and_n(client, model):
    singles = [
        client.completions.create(model=model, prompt=p, max_tokens=8, **greedy()) for p in PROMPTS
    ]
    r = client.completions.create(model=model, prompt=PROMPTS, n=2, max_tokens=8, **greedy())
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    for c in r.choices:
        prompt_i = c.index // 2  # index = prompt_i * n + j
        assert c.text == singles[prompt_i].choices[0].text, f"choice {c.index}"
    assert r.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)


def _prompt_ids(base_url: str, prompt: str, prompt_tokens: int) -> list:
    """The token ids the server made of a string prompt (with BOS if it added one)."""
    for add_special in (True, False):
        ids = tokenize(base_url, prompt, add_special=add_special)
        if len(ids) == prompt_tokens:
            return ids
    raise AssertionError(f"no /tokenize of {prompt!r} has the {prompt_tokens} tokens usage reports")


def test_completion_prompt_as_token_ids_matches_the_string_prompt(server, client, model):
    by_text = [
        client.completions.create(model=model, prompt=p, max_tokens=10, **greedy()) for p in PROMPTS
    ]
    ids = [_prompt_ids(server.base_url, p, r.usage.prompt_tokens) for p, r in zip(PROMPTS, by_text)]

    one = client.completions.create(model=model, prompt=ids[0], max_tokens=10, **greedy())
    assert one.choices[0].text == by_text[0].choices[0].text
    assert one.usage.prompt_tokens == len(ids[0]), "token ids are used as given"

    both = client.completions.create(model=model, prompt=ids, max_tokens=10, **greedy())
    assert sorted(c.index for c in both.choices) == [0, 1]
    for c in both.choices:
        assert c.text == by_text[c.index].choices[0].text


def test_completion_echo_prefixes_the_prompt(client, model):
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, **greedy())
    echoed = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, echo=True, **greedy()
    )
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens


def test_completion_logprobs_have_the_legacy_shape(http, model):
    r = http.post(
        "/v1/completions",
        json={
            "model": model,
            "prompt": PROMPT,
            "max_tokens": 8,
            "logprobs": 3,
            "ignore_eos": True,
            **greedy(),
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    tokens, token_lps, tops, offsets = (
        lp["tokens"],
        lp["token_logprobs"],
        lp["top_logprobs"],
        lp["text_offset"],
    )
    assert len(tokens) == len(token_lps) == len(tops) == len(offsets) == 8
    assert "".join(tokens) == choice["text"]
    for i, (tok, tok_lp, top) in enumerate(zip(tokens, token_lps, tops)):
        assert finite_logprob(tok_lp), (i, tok_lp)
        assert isinstance(top, dict) and 1 <= len(top) <= 3, (i, top)
        assert all(finite_logprob(v) for v in top.values()), (i, top)
        # Greedy: the chosen token is the most likely one.
        assert abs(max(top.values()) - tok_lp) < 1e-3, (i, tok, tok_lp, top)
    for i in range(len(tokens) - 1):
        assert offsets[i + 1] - offsets[i] == len(tokens[i]), (i, offsets, tokens)


def test_pieces_of_characters_are_named_by_their_bytes_in_logprobs(http, model):
    """Tokens that are no text on their own are `bytes:\\xNN...` (OpenAI's names): distinct
    keys in `top_logprobs`, and the chosen token is named as its alternative."""
    body = {"model": model, "prompt": "🦀🦀🦀🦀", "max_tokens": 3, "ignore_eos": True, **greedy()}
    r = http.post("/v1/completions", json={**body, "logprobs": 5})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    for i, (tok, tok_lp, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])):
        assert len(top) == 5, (i, top)
        assert tok in top and abs(top[tok] - tok_lp) < 1e-3, (i, tok, top)
    # Offsets step by each token's share of the text, which adds up to the text.
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] <= len(choice["text"].encode())
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "🦀🦀🦀🦀"}],
            "max_tokens": 3,
            "logprobs": True,
            "top_logprobs": 5,
            **greedy(),
        },
    )
    assert r.status_code == 200, r.text
    for entry in r.json()["choices"][0]["logprobs"]["content"]:
        names = [t["token"] for t in entry["top_logprobs"]]
        assert len(set(names)) == len(names), names
        assert entry["token"] in names, (entry["token"], names)
