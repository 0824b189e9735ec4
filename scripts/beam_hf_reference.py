"""Expected results of Hugging Face beam search on toy models, for weft::beam's unit tests.

The search below follows transformers v5.23's `GenerationMixin._beam_search`
(generation/utils.py) in its own formulation — `num_beams` fixed running slots whose copies of
the prompt start at -1e9, a finished set padded with -1e9 placeholders, -1e9 penalties instead of
filtering, float32 throughout — with numpy in place of torch, for one prompt. Its helpers are
`_get_top_k_continuations`, `_get_running_beams_for_next_iteration`, `_update_finished_beams`,
`_check_early_stop_heuristic` and `_beam_search_has_unfinished_sequences`; stopping criteria are
EOS ids on the last token and the length limit. weft's `BeamScorer` keeps only real beams
instead: the fixture checks that the two agree.

A toy model's log-probabilities come from an integer hash of the sequence (splitmix64), turned
into logits with exact float64 operations and log-softmaxed in float64, then rounded to float32;
the Rust test computes the same numbers the same way.

usage: python3 -m venv V && V/bin/pip install numpy
       V/bin/python scripts/beam_hf_reference.py crates/weft/tests/fixtures/beam_hf_reference.json
"""

import json
import math
import random
import sys

import numpy as np

MASK = (1 << 64) - 1
NEG = np.float32(-1.0e9)


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def toy_logprobs(model, seq):
    """log_softmax of the toy model's logits after `seq`, as float32."""
    h = model["seed"]
    for t in seq:
        h = splitmix64(h ^ t)
    logits = []
    for v in range(model["vocab"]):
        u = (splitmix64((h + v) & MASK) >> 11) / 9007199254740992.0  # exact: 53 bits / 2^53
        l = u * model["spread"]
        if v in model["eos"]:
            l = l + model["eos_bias"]
        logits.append(l)
    m = max(logits)
    z = 0.0
    for l in logits:
        z = z + math.exp(l - m)
    lse = m + math.log(z)
    return np.array([l - lse for l in logits], dtype=np.float32)


def topk(a, k):
    """Indices of the k largest, largest first (ties: lower index first)."""
    return np.argsort(-a, kind="stable")[:k]


def hf_beam_search(model, prompt, c):
    nb, alpha, es = c["num_beams"], c["length_penalty"], c["early_stopping"]
    vocab, eos = model["vocab"], model["eos"]
    plen = len(prompt)
    max_length = plen + c["max_new_tokens"]
    k = max(2, 1 + len(eos)) * nb
    top_nb = np.array([True] * nb + [False] * (k - nb))
    running = [list(prompt) for _ in range(nb)]
    running_scores = np.full(nb, NEG, dtype=np.float32)
    running_scores[0] = 0.0
    seqs = [list(prompt) for _ in range(nb)]
    scores = np.full(nb, NEG, dtype=np.float32)
    finished = np.zeros(nb, dtype=bool)
    unsatisfied = True
    cur_len = plen
    while True:
        lp = np.stack([toy_logprobs(model, s) for s in running])
        acc = (lp + running_scores[:, None]).reshape(-1)
        idx = topk(acc, k)
        top_scores = acc[idx]
        top_seqs = [running[i // vocab] + [int(i % vocab)] for i in idx]
        hits = np.array([cur_len + 1 >= max_length or s[-1] in eos for s in top_seqs])

        penalised = top_scores + hits.astype(np.float32) * NEG
        ridx = topk(penalised, nb)
        next_running = [top_seqs[i] for i in ridx]
        next_scores = penalised[ridx]

        just = hits & top_nb
        cand = top_scores / ((cur_len + 1 - plen) ** alpha)
        cand = cand + np.float32(bool(finished.all()) and es is True) * NEG
        cand = cand + np.float32(not unsatisfied) * NEG
        cand = cand + (~just).astype(np.float32) * NEG
        merged_seqs = seqs + top_seqs
        merged_scores = np.concatenate([scores, cand])
        merged_finished = np.concatenate([finished, just])
        midx = topk(merged_scores, nb)
        seqs = [merged_seqs[i] for i in midx]
        scores = merged_scores[midx]
        finished = merged_finished[midx]

        running, running_scores = next_running, next_scores
        cur_len += 1
        if es == "never" and alpha > 0.0:
            best_len = max_length - plen
        else:
            best_len = cur_len - plen
        best = running_scores[0] / (best_len**alpha)
        worst = np.where(finished, scores.min(), NEG)
        unsatisfied = unsatisfied and bool(np.any(best > worst))
        open_beam = not (bool(finished.all()) and es is True)
        if not (unsatisfied and open_beam and not hits.all()):
            break
    n = c["num_return_sequences"]
    assert finished[:n].all(), "placeholder in the output: a degenerate case"
    return [{"tokens": seqs[i], "score": float(scores[i])} for i in range(n)]


def greedy(model, prompt, c):
    """generate() with num_beams=1 decodes greedily (`_sample`) whatever `early_stopping` says:
    argmax until an EOS id or the length limit. It reports no score; weft's is the normalised
    sum, as for beams."""
    seq, total = list(prompt), np.float32(0.0)
    for _ in range(c["max_new_tokens"]):
        lp = toy_logprobs(model, seq)
        t = int(np.argmax(lp))
        seq.append(t)
        total = total + lp[t]
        if t in model["eos"]:
            break
    score = total / ((len(seq) - len(prompt)) ** c["length_penalty"])
    return [{"tokens": seq, "score": float(score)}]


def main():
    rng = random.Random(14)
    cases = []
    while len(cases) < 160:
        vocab = rng.choice([6, 8, 10])
        eos = rng.choice([[], [0], [0], [0, 1]])
        nb = rng.randint(1, 4)
        if max(2, 1 + len(eos)) * nb > vocab:
            continue
        model = {
            "seed": rng.getrandbits(64),
            "vocab": vocab,
            "spread": rng.choice([4.0, 8.0, 16.0]),
            "eos": eos,
            "eos_bias": rng.choice([0.0, 1.5, 3.0]),
        }
        config = {
            "num_beams": nb,
            "max_new_tokens": rng.randint(1, 7),
            "length_penalty": rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0]),
            "early_stopping": rng.choice([True, False, "never"]),
            "num_return_sequences": rng.randint(1, nb),
        }
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
        search = greedy if nb == 1 else hf_beam_search
        expected = search(model, prompt, config)
        cases.append({"model": model, "prompt": prompt, "config": config, "expected": expected})
    with open(sys.argv[1], "w") as f:
        json.dump({"generator": "scripts/beam_hf_reference.py", "cases": cases}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
