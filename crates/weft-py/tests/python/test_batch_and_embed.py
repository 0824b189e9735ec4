"""Rollouts (seed 003) and embeddings, as NumPy arrays."""

import numpy as np
import pytest

import weft
from conftest import ctrl_c_after
from test_concurrency import PROMPTS, greedy


def test_generate_batch_equals_single_generations(smollm2):
    rollouts = weft.generate_batch(smollm2, PROMPTS, weft.Argmax(), max_tokens=16)
    assert [r.text for r in rollouts] == [greedy(smollm2, p, 16) for p in PROMPTS]
    for r, p in zip(rollouts, PROMPTS):
        assert r.prompt_tokens == smollm2.tokenize(p)
        assert r.sequence[: len(r.prompt_tokens)] == r.prompt_tokens
        assert repr(r) == f"weft.Rollout(text={r.text!r}, stop_reason={r.stop_reason!r})"


def test_rollouts_beams_and_metrics_pickle_for_other_processes(smollm2):
    """Batch results go to other processes (multiprocessing pickles them)."""
    import pickle

    rollouts = weft.generate_batch(smollm2, PROMPTS[:2], weft.Argmax(), max_tokens=6)
    beams = weft.beam_search(smollm2, PROMPTS[0], 2, max_new_tokens=6, num_return_sequences=2)
    fields = ("prompt_tokens", "tokens", "text", "stop_reason", "sequence")
    for r in rollouts:
        back = pickle.loads(pickle.dumps(r))
        assert type(back) is weft.Rollout
        assert [getattr(back, f) for f in fields] == [getattr(r, f) for f in fields]
    for h in beams:
        back = pickle.loads(pickle.dumps(h))
        assert (back.tokens, back.prompt_len, back.score, back.sum_logprobs, back.generated) == (
            h.tokens, h.prompt_len, h.score, h.sum_logprobs, h.generated)
    with pytest.raises(ValueError, match="past the"):
        weft.BeamHypothesis([1, 2], 3, 0.0, 0.0)
    metrics = smollm2.metrics()
    back = pickle.loads(pickle.dumps(metrics))
    assert type(back) is weft.Metrics and back == metrics and hash(back) == hash(metrics)
    assert back.passes == metrics.passes > 0 and back.mean_batch_passes == metrics.mean_batch_passes


def test_generate_batch_takes_the_generation_options(smollm2):
    def alone(prompt, **opts):
        ctx = smollm2.context()
        ctx.fill(prompt)
        g = ctx.generate(weft.Argmax(), **opts)
        g.text()
        return g.tokens()

    opts = dict(max_tokens=12, ignore_eos=True, logit_bias={13: -5.0}, repeat_penalty=1.3)
    rollouts = weft.generate_batch(smollm2, PROMPTS, weft.Argmax(), **opts)
    assert [r.tokens for r in rollouts] == [alone(p, **opts) for p in PROMPTS]
    assert all(len(r.tokens) == 12 for r in rollouts)
    # A stop string cuts the text.
    plain = weft.generate_batch(smollm2, PROMPTS[:1], weft.Argmax(), max_tokens=12)[0]
    stop = plain.text[len(plain.text) // 2 :][:2]
    cut = weft.generate_batch(smollm2, PROMPTS[:1], weft.Argmax(), max_tokens=12, stop=[stop])[0]
    assert cut.text == plain.text[: plain.text.index(stop)] and cut.stop_reason == "stop_string"
    with pytest.raises(TypeError):
        weft.generate_batch(smollm2, PROMPTS, stop=[1.5])


def test_generate_batch_takes_none_as_generate_does(smollm2):
    """`None` for `max_tokens`, `min_tokens` and `seed` is what `Context.generate` makes of
    it (no limit, no minimum, a seed drawn), not a TypeError; a bias may be any mapping; an
    `on_partial` that cannot be called fails before the batch runs."""
    import types

    greedy = weft.generate_batch(smollm2, ["The capital of France is"], max_tokens=None,
                                 min_tokens=None, seed=None, max_length=40)
    assert greedy[0].stop_reason is not None
    biased = weft.generate_batch(smollm2, ["Hi"], max_tokens=2, ignore_eos=True,
                                 logit_bias=types.MappingProxyType({42: 100.0}))
    assert biased[0].tokens == [42, 42]
    passes = smollm2.metrics().passes
    with pytest.raises(TypeError, match="callable"):
        weft.generate_batch(smollm2, ["Hi"] * 4, max_tokens=400, ignore_eos=True, every=1,
                            on_partial=5)
    assert smollm2.metrics().passes == passes, "the batch ran before the callback was checked"


def test_generate_batch_padded_arrays(smollm2):
    pad = 0
    rows = [smollm2.tokenize(p) for p in PROMPTS]
    width = max(map(len, rows))
    ids = np.array([[pad] * (width - len(r)) + r for r in rows], dtype=np.int64)
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=np.int64)
    out_ids, out_mask = weft.generate_batch(
        smollm2, ids, weft.Argmax(), attention_mask=mask, max_tokens=8, padded=True, pad_token_id=pad
    )
    assert out_ids.shape == out_mask.shape and out_ids.shape[0] == 4
    rollouts = weft.generate_batch(smollm2, rows, weft.Argmax(), max_tokens=8)
    for i, r in enumerate(rollouts):
        # ColossalAI's layout: the prompt left-padded as given, then the generation.
        seq = out_ids[i][out_mask[i] == 1].tolist()
        assert seq == r.sequence
        assert out_ids[i, width - len(rows[i]) : width].tolist() == rows[i]
    # Padded wider than the longest prompt (`padding="max_length"`): the width is kept, so
    # the generation starts at column `ids.shape[1]` (it started at the longest prompt's end).
    wide = 3 + width
    ids = np.array([[pad] * (wide - len(r)) + r for r in rows], dtype=np.int64)
    mask = (np.arange(wide)[None, :] >= wide - np.array([len(r) for r in rows])[:, None])
    out_ids, _ = weft.generate_batch(
        smollm2, ids, attention_mask=mask.astype(np.int64), max_tokens=8, padded=True,
        pad_token_id=pad, ignore_eos=True,
    )
    assert out_ids.shape == (4, wide + 8)
    for i, r in enumerate(rollouts):
        assert out_ids[i, :wide].tolist() == ids[i].tolist()
        assert out_ids[i, wide : wide + len(r.tokens)].tolist() == r.tokens


def test_generate_batch_seeds_and_its_default_sampler():
    """`seed=None` draws a seed per call, as `Context.generate` does (every call repeated the
    same rollouts); rows of neighbouring seeds share nothing (seed 101's row 0 was seed
    100's row 1); the default sampler is the engine's (it was always greedy)."""
    sampled = weft.Engine("smollm2-135m", threads=2, sampler=weft.Temperature(1.5))
    group = ["Once upon a time"] * 4

    def texts(**opts):
        return [r.text for r in weft.generate_batch(sampled, group, max_tokens=12, **opts)]

    a, b = texts(seed=100), texts(seed=101)
    assert texts(seed=100) == a, "a seed gives the same rollouts"
    assert len(set(a)) > 1, "the engine's sampler was not used: every row is greedy"
    assert not set(a) & set(b), (a, b)
    assert texts() != texts()


def test_generate_batch_streams_partial_rollouts_every_k_tokens(smollm2):
    whole = weft.generate_batch(smollm2, PROMPTS, weft.Argmax(), max_tokens=12)
    seen = []
    streamed = weft.generate_batch(
        smollm2, PROMPTS, weft.Argmax(), max_tokens=12, every=4,
        on_partial=lambda rs: seen.append([(len(r.tokens), r.stop_reason) for r in rs]),
    )
    assert [r.tokens for r in streamed] == [r.tokens for r in whole]
    # After tokens 4 and 8 of the unfinished rollouts (the end itself is the result).
    assert len(seen) == 2 and all(len(s) == len(PROMPTS) for s in seen)
    assert all(reason is None for s in seen for _, reason in s)
    assert [n for n, _ in seen[0]] == [min(4, len(r.tokens)) for r in whole]

    def fails(rollouts):
        raise KeyError("from on_partial")

    with pytest.raises(KeyError, match="from on_partial"):
        weft.generate_batch(smollm2, PROMPTS, max_tokens=8, every=2, on_partial=fails)
    with pytest.raises(weft.ConfigError, match="every > 0"):
        weft.generate_batch(smollm2, PROMPTS, max_tokens=8, on_partial=print)

    def nested(rollouts):
        smollm2.context().generate(max_tokens=1).text()

    with pytest.raises(weft.ContextBusy):
        weft.generate_batch(smollm2, PROMPTS[:1], max_tokens=4, every=2, on_partial=nested)


def cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_engine_embeddings_match_llama_cpp(smollm2, reference):
    cases = [
        c for c in reference("embeddings.json")["cases"]
        if c["model"] == "smollm2" and c["pooling"] == "mean"
    ]
    # llama-embedding split its prompt at newlines: it embedded each text up to the first.
    texts = [c["text"].split("\n")[0] for c in cases]
    got = smollm2.embed(texts, pooling="mean")
    assert got.shape == (len(texts), len(cases[0]["embedding"]))
    for v, c in zip(got, cases):
        assert cosine(v, np.array(c["embedding"])) > 0.99
    one = smollm2.embed(texts[0])
    assert one.shape == (got.shape[1],) and cosine(one, got[0]) > 0.99999
    # None is the model's own pooling (a decoder's: mean), as for weft.Embedder.
    assert np.array_equal(smollm2.embed(texts, pooling=None), got)


def test_minilm_embeddings_match_the_reference(reference):
    ref = reference("minilm.json")
    cases = ref["cases"] if isinstance(ref, dict) else ref
    embedder = weft.Embedder("all-minilm-l6-v2", threads=2)
    got = embedder.embed([c["text"] for c in cases])
    assert got.shape[1] == embedder.dimensions == 384
    for v, c in zip(got, cases):
        assert cosine(v, np.array(c["embedding"])) > 0.999
    # Inputs embed() cannot take say what it takes.
    with pytest.raises(TypeError, match="not bytes"):
        embedder.embed(b"abc")
    with pytest.raises(TypeError, match="a str or a list of str"):
        embedder.embed([1, 2])
    with pytest.raises(weft.ConfigError, match="weft embed --pooling none"):
        embedder.embed("abc", pooling="none")


def test_ctrl_c_stops_a_long_embedding_list(smollm2):
    texts = [f"sentence number {i} about the sea and a lighthouse" for i in range(3000)]
    few = smollm2.embed(texts[:40])
    passes = smollm2.metrics().passes
    with ctrl_c_after(0.3):
        smollm2.embed(texts)
    # The interrupt stopped the list part-way (one pass per text).
    ran = smollm2.metrics().passes - passes
    assert 0 < ran < len(texts) // 2, ran
    # Embedding in groups changes no bits, and the engine is free again.
    assert np.array_equal(smollm2.embed(texts[:40]), few)
    assert smollm2.metrics().kv_pages_used == 0


def test_ctrl_c_stops_an_embedding_waiting_for_kv_pages():
    """A context holds most of a 16-page cache: the text to embed waits (up to 30 s) for
    pages; a Ctrl-C 0.3 s in stops the wait at once (it waited the 30 s, then failed)."""
    import time

    small = weft.Engine("smollm2-135m", threads=2, kv_tokens=512, n_ctx=512, prefix_cache=False)
    holder = small.context()
    holder.fill("A long text that holds pages. " * 40)
    holder.forward().run()
    text = " ".join(f"Sentence {i} of the text to embed." for i in range(30))
    started = time.monotonic()
    with ctrl_c_after(0.3):
        small.embed(text)
    assert time.monotonic() - started < 10
    del holder
    assert small.metrics().kv_pages_used == 0
    assert small.embed(text).shape == (576,)
