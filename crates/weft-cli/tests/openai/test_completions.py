"""POST /v1/completions: shapes, streaming, prompt forms, echo, legacy logprobs, usage."""

import json
import os
import pathlib

from conftest import MODEL, finite_logprob, greedy, stream_post, tokenize

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
    # Offsets step by the characters of each token's share of the text (a character split over
    # tokens counts at the token that completes it), which add up to the text.
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] <= len(choice["text"])
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


def test_top_logprobs_always_hold_the_sampled_token(http, model):
    """As OpenAI documents: the sampled token's log-probability is always among `top_logprobs`
    (so up to `logprobs + 1` entries), under its name in `tokens`; `logprobs` 0 gives it alone."""
    for k in (0, 1):
        body = {"model": model, "prompt": "My favourite word is", "max_tokens": 12,
                "temperature": 2.0, "seed": 3, "ignore_eos": True, "logprobs": k}
        lp = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
        for tok, tok_lp, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert tok in top and top[tok] == tok_lp, (k, tok, tok_lp, top)
            assert 1 <= len(top) <= k + 1, (k, top)


def test_logprobs_match_the_text_a_stop_string_cuts(http, model):
    """A stop string that starts inside a token: the last token's entry is its share of the
    text, and the entries' tokens and bytes make up the text exactly (chat and completions)."""
    prompt = "Once upon a time"
    body = {"model": model, "max_tokens": 16, "ignore_eos": True, **greedy()}
    whole = http.post("/v1/completions", json={**body, "prompt": prompt, "logprobs": 1}).json()
    tokens = whole["choices"][0]["logprobs"]["tokens"]
    text = "".join(tokens)
    # Cut one character into the first token of three or more characters after the first
    # token, at a place whose next two characters appear nowhere before.
    at = None
    for i in range(1, len(tokens)):
        start = len("".join(tokens[:i]))
        if len(tokens[i].strip()) >= 3 and text[start + 1:start + 3] not in text[:start + 2]:
            at = start + 1
            break
    assert at is not None, tokens
    stop = text[at:at + 2]
    r = http.post("/v1/completions", json={**body, "prompt": prompt, "logprobs": 1, "stop": stop})
    choice = r.json()["choices"][0]
    assert choice["text"] == text[:at], (stop, choice["text"])
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
    # The same on chat, where each entry carries its bytes.
    messages = [{"role": "user", "content": "Tell me a story."}]
    chat = {**body, "messages": messages, "logprobs": True, "top_logprobs": 1}
    whole = http.post("/v1/chat/completions", json=chat).json()["choices"][0]
    entries = whole["logprobs"]["content"]
    text = whole["message"]["content"]
    at = None
    for i in range(1, len(entries)):
        start = len("".join(e["token"] for e in entries[:i]))
        if len(entries[i]["token"].strip()) >= 3 and text[start + 1:start + 3] not in text[:start + 2]:
            at = start + 1
            break
    assert at is not None, entries
    for stream in (False, True):
        req = {**chat, "stop": text[at:at + 2], "stream": stream}
        if stream:
            chunks = [c for c in stream_post(http, "/v1/chat/completions", req) if isinstance(c, dict)]
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
            entries = [e for c in chunks if c.get("choices") and c["choices"][0]["logprobs"]
                       for e in c["choices"][0]["logprobs"]["content"]]
        else:
            cut = http.post("/v1/chat/completions", json=req).json()["choices"][0]
            content, entries = cut["message"]["content"], cut["logprobs"]["content"]
        assert content == text[:at], (stream, content)
        assert "".join(e["token"] for e in entries) == content, (stream, entries)
        assert bytes(b for e in entries for b in e["bytes"]) == content.encode(), (stream, entries)


def reference_greedy() -> list:
    """llama.cpp's greedy runs of this model (prompt ids, generated ids, top-5 logits a step)."""
    root = pathlib.Path(__file__).resolve().parents[4]
    ref = pathlib.Path(os.environ.get("WEFT_REFERENCE_DIR", root.parent / "shared" / "reference"))
    with open(ref / "greedy.json", encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    return [c for c in cases if c["model"] == MODEL.split("-")[0]]


def test_an_echoed_prompt_is_scored_as_llama_cpp_scores_it(http, model):
    """`echo` + `logprobs` + `max_tokens` 0, lm-eval-harness's log-likelihood request, on
    llama.cpp's prompts followed by its greedy continuations: each continuation token is the most
    likely where llama.cpp's margin is clear, and the gaps between the top-5 log-probabilities
    are llama.cpp's gaps between their logits."""
    cases = reference_greedy()
    assert cases
    gaps = []
    for case in cases:
        ids = case["prompt_ids"] + case["greedy_ids"]
        body = {"model": model, "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 5}
        r = http.post("/v1/completions", json={**body, **greedy()})
        assert r.status_code == 200, r.text
        out = r.json()
        choice, lp = out["choices"][0], out["choices"][0]["logprobs"]
        assert choice["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 0
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids)
        # Nothing predicts the first token.
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(finite_logprob(x) for x in lp["token_logprobs"][1:])
        offsets = lp["text_offset"]
        assert offsets == sorted(offsets) and offsets[-1] <= len(choice["text"])
        start = len(case["prompt_ids"])
        for s, step in enumerate(case["steps"]):
            own, top = lp["token_logprobs"][start + s], lp["top_logprobs"][start + s]
            ours = sorted(top.values(), reverse=True)
            theirs = [logit for _, logit in step["top5"]]
            assert len(ours) == 5, top
            if theirs[0] - theirs[1] >= 0.5:
                assert abs(own - ours[0]) < 1e-3, (case["prompt"], s, own, top)
            # A token among its alternatives has the number it has on its own.
            tok = lp["tokens"][start + s]
            if tok in top:
                assert top[tok] == own, (tok, own, top)
            gaps += [abs((ours[0] - ours[j]) - (theirs[0] - theirs[j])) for j in range(1, 5)]
    # A long prompt is scored in parts; each position's scores are those of a shorter prompt.
    ids = (cases[0]["prompt_ids"] + cases[0]["greedy_ids"]) * 5
    assert len(ids) > 150

    def scored(ids):
        body = {"model": model, "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 2}
        return http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]

    whole, prefix = scored(ids), scored(ids[:40])
    assert whole["token_logprobs"][:40] == prefix["token_logprobs"]
    assert whole["top_logprobs"][:40] == prefix["top_logprobs"]
    mean, worst = sum(gaps) / len(gaps), max(gaps)
    print(f"{model}: top-5 log-probability gaps vs llama.cpp's logit gaps: mean {mean:.3f}, max {worst:.3f}")
    # The bounds of the logits themselves (crates/weft-core/tests/greedy_reference.rs).
    assert mean < 0.24 and worst < 1.3, (mean, worst)


def test_echo_with_logprobs_streams_the_scored_prompt_first(http, model):
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 4, "echo": True,
            "logprobs": 2, **greedy()}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    events = stream_post(http, "/v1/completions", {**body, "stream": True})
    chunks = [c for c in events if isinstance(c, dict) and c.get("choices")]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    offsets = [o for c in chunks if c["choices"][0]["logprobs"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert text == whole["text"] and text.startswith("The capital of France is")
    assert tokens == whole["logprobs"]["tokens"]
    assert offsets == whole["logprobs"]["text_offset"]
