"""Sampling parameters: greedy, seeds under concurrency, stop strings, logprobs, logit_bias,
ignore_eos, min_tokens, top_k / top_p."""

import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import finite_logprob, greedy, tokenize, user

STORY = "Write a long story about a dragon who loves books."
OTHER_PROMPTS = [
    "List some fruits.",
    "Explain how rain forms.",
    "Describe a busy market.",
    "Write a poem about the moon.",
]


def test_temperature_0_is_deterministic(client, model):
    req = dict(model=model, messages=user(STORY), max_tokens=24, **greedy())
    first = client.chat.completions.create(**req).choices[0].message.content
    second = client.chat.completions.create(**req).choices[0].message.content
    assert first == second


def test_seed_minus_one_is_random_as_llama_server(client, model):
    """`seed: -1` asks for a fresh random seed (llama-server's default), not the seed 2^64 - 1:
    three such requests do not all agree, while a fixed seed repeats itself."""
    req = dict(model=model, messages=user("Invent a name for a cat and describe it."),
               temperature=1.0, max_tokens=24)
    outs = {client.chat.completions.create(**req, seed=-1).choices[0].message.content
            for _ in range(3)}
    assert len(outs) > 1, outs
    fixed = {client.chat.completions.create(**req, seed=-2).choices[0].message.content
             for _ in range(2)}
    assert len(fixed) == 1, fixed


def test_a_prompts_seeded_choices_do_not_depend_on_its_place(client, model):
    """With a seed, a prompt's sampled choices are the same alone and after another prompt in
    one /v1/completions request (llama-server and vLLM seed every prompt alike), and its
    choices differ from each other."""
    req = dict(model=model, temperature=1.0, seed=42, max_tokens=12, n=2)
    prompt = "Once upon a time, a cat"
    alone = client.completions.create(prompt=prompt, **req)
    both = client.completions.create(prompt=["The weather today is", prompt], **req)
    texts = lambda r, idx: [c.text for c in sorted(r.choices, key=lambda c: c.index) if c.index in idx]
    assert texts(alone, {0, 1}) == texts(both, {2, 3})
    assert len(set(texts(alone, {0, 1}))) == 2, alone


def test_seed_reproduces_the_output_while_other_requests_stream(client, model):
    seeded = dict(
        model=model,
        messages=user("Invent a name for a cat and describe it."),
        temperature=1.0,
        seed=1234,
        max_tokens=24,
    )
    alone = client.chat.completions.create(**seeded).choices[0].message.content

    started = [threading.Event() for _ in OTHER_PROMPTS]

    def other(i: int) -> int:
        stream = client.chat.completions.create(
            model=model,
            messages=user(OTHER_PROMPTS[i]),
            temperature=1.0,
            seed=100 + i,
            max_tokens=160,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = 0
        for _ in stream:
            chunks += 1
            started[i].set()
        return chunks

    with ThreadPoolExecutor(len(OTHER_PROMPTS)) as pool:
        others = [pool.submit(other, i) for i in range(len(OTHER_PROMPTS))]
        for i, (event, future) in enumerate(zip(started, others)):
            if not event.wait(60):
                future.result(timeout=0)  # raises the stream's error, if it had one
                raise AssertionError(f"background stream {i} sent nothing within 60 s")
        busy = client.chat.completions.create(**seeded).choices[0].message.content
        still_running = sum(not f.done() for f in others)
        for f in others:
            assert f.result() > 0
    assert still_running > 0, "the seeded request did not overlap the other streams"
    assert busy == alone


def _stop_inside_tokens(base_url: str, text: str) -> str:
    """A 4-character substring of `text` that starts inside a token (as /tokenize splits it),
    ends in a later token, and first occurs after the text's start."""
    pieces = [p["piece"] for p in tokenize(base_url, text, with_pieces=True)]
    if "".join(pieces) == text:
        start = 0
        for i, piece in enumerate(pieces):
            end = start + len(piece)
            if i >= 1 and len(piece) >= 3 and end + 2 <= len(text):
                s = end - 2  # two characters of this token, two of the next one(s)
                stop = text[s : s + 4]
                if stop.strip() and text.find(stop) == s:
                    return stop
            start = end
    # Pieces that do not concatenate to the text: characters 3..6 of the second word.
    words = text.split(" ")
    for w in words[1:]:
        if len(w) >= 6 and text.find(w[2:6]) > 0:
            return w[2:6]
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_across_token_boundaries_in_a_stream(server, client, model):
    req = dict(model=model, messages=user(STORY), max_tokens=32, **greedy())
    text = client.chat.completions.create(**req).choices[0].message.content
    stop = _stop_inside_tokens(server.base_url, text)
    expected = text[: text.find(stop)]
    assert expected, (text, stop)

    full = client.chat.completions.create(stop=stop, **req)
    assert full.choices[0].message.content == expected, (text, stop)
    assert full.choices[0].finish_reason == "stop"

    deltas, finish = [], None
    for chunk in client.chat.completions.create(stop=[stop], stream=True, **req):
        for choice in chunk.choices:
            if choice.delta.content:
                deltas.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert "".join(deltas) == expected, (text, stop, deltas)
    assert finish == "stop"
    for i in range(len(deltas)):
        for j in range(i + 1, len(deltas) + 1):
            assert stop not in "".join(deltas[i:j]), (stop, deltas[i:j])


def test_stop_list_cuts_at_the_earliest_stop(client, model):
    req = dict(
        model=model, prompt="Once upon a time, in a small village,", max_tokens=32, **greedy()
    )
    text = client.completions.create(**req).choices[0].text
    stop = next((" " + w for w in text.split()[3:] if " " + w in text), None)
    assert stop, f"no fourth word after a space in {text!r}"
    expected = text[: text.find(stop)]
    r = client.completions.create(stop=["zzqx-never", stop, "qqzx-never-either"], **req)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"


def test_chat_logprobs_concatenate_to_the_content_and_are_sorted(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user(STORY),
        max_tokens=16,
        logprobs=True,
        top_logprobs=5,
        **greedy(),
    )
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content
    if choice.finish_reason == "length":
        assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert finite_logprob(e.logprob), e
        assert len(e.top_logprobs) == 5, e
        lps = [t.logprob for t in e.top_logprobs]
        assert all(finite_logprob(x) for x in lps), e
        assert lps == sorted(lps, reverse=True), e
        assert abs(e.logprob - lps[0]) < 1e-3, f"greedy picks the most likely token: {e}"
        if e.bytes is not None:
            assert e.bytes == list(e.token.encode("utf-8")), e


def test_logprobs_stay_finite_when_sampling_filters_tokens(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user(STORY),
        max_tokens=6,
        temperature=1.0,
        seed=5,
        logprobs=True,
        top_logprobs=20,
        extra_body={"top_k": 2},
    )
    for e in r.choices[0].logprobs.content:
        lps = [t.logprob for t in e.top_logprobs]
        assert len(lps) == 20
        assert lps == sorted(lps, reverse=True)
        # -inf (tokens top_k removed) is clamped to -9999.0, never sent as null or a string.
        assert all(finite_logprob(x) for x in lps + [e.logprob]), e
        assert e.logprob >= lps[1] - 1e-3, f"top_k 2 samples one of the two likeliest: {e}"


def test_ignore_eos_generates_exactly_max_tokens(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user("Reply with just the word OK."),
        max_tokens=20,
        extra_body={"ignore_eos": True},
        **greedy(),
    )
    assert r.usage.completion_tokens == 20
    assert r.choices[0].finish_reason == "length"


def test_min_tokens_delays_the_end_of_generation(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user("Reply with just the word OK."),
        max_tokens=24,
        extra_body={"min_tokens": 12},
        **greedy(),
    )
    assert r.usage.completion_tokens >= 12


def test_min_tokens_gives_way_to_a_grammar_that_must_end(http, model):
    # The grammar allows only the end of turn after "yes": min_tokens banned it and left no
    # token to sample (a 500 server_error).
    end = {"smollm2-135m": "<|im_end|>", "gemma3-270m": "<end_of_turn>"}[model]
    body = {
        "model": model,
        "prompt": "Say yes: ",
        "max_tokens": 10,
        "min_tokens": 5,
        "grammar": f'root ::= "yes" {end}',
        **greedy(),
    }
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("yes", "stop")


def test_logit_bias_bans_and_forces_tokens(server, http, model):
    def complete(**extra):
        r = http.post(
            "/v1/completions",
            json={
                "model": model,
                "prompt": "The capital of France is",
                "max_tokens": 3,
                "logprobs": 1,
                **greedy(),
                **extra,
            },
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    first = complete()["logprobs"]["tokens"][0]
    ids = tokenize(server.base_url, first)
    assert len(ids) == 1, f"{first!r} is one token when generated but {ids} alone"
    banned = complete(logit_bias={str(ids[0]): -100})
    assert banned["logprobs"]["tokens"][0] != first

    forced_id, forced_piece = next(
        (p["id"], p["piece"]) for p in tokenize(server.base_url, " banana", with_pieces=True)
    )
    forced = complete(logit_bias={str(forced_id): 100})
    assert forced["text"].strip().startswith(forced_piece.strip()), (forced_piece, forced["text"])


def test_top_k_1_and_tiny_top_p_sample_like_greedy(client, model):
    req = dict(model=model, messages=user(STORY), max_tokens=16)
    greedy_text = client.chat.completions.create(**req, **greedy()).choices[0].message.content
    top_k = client.chat.completions.create(**req, temperature=1.5, seed=9, extra_body={"top_k": 1})
    assert top_k.choices[0].message.content == greedy_text
    top_p = client.chat.completions.create(**req, temperature=1.5, seed=9, top_p=1e-6)
    assert top_p.choices[0].message.content == greedy_text


def test_all_sampling_fields_together_are_accepted_and_seeded(client, model):
    req = dict(
        model=model,
        messages=user("Tell me about the ocean."),
        max_tokens=16,
        temperature=0.8,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=11,
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    a = client.chat.completions.create(**req)
    b = client.chat.completions.create(**req)
    assert a.choices[0].message.content
    assert a.choices[0].message.content == b.choices[0].message.content
