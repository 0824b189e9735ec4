#!/usr/bin/env python3
"""Regenerate weft-core's dequantization fixtures (crates/weft-core/tests/fixtures/dequant/).

The fixtures pin weft's Rust dequantizers (`weft_core::quant`) to an *independent* reference:
llama.cpp's own Python package gguf-py and its `gguf.quants.dequantize`. Each case is a slice
of raw ggml blocks plus the f32 values gguf-py decodes them to; the Rust test
`crates/weft-core/tests/dequant_reference.rs` decodes the same bytes and compares.

Two kinds of cases:

* real: for every tensor type a model file contains, one tensor of that type (the first in file
  order with enough blocks) gives two cases: a few blocks from its start and a few from its
  middle. Source string: "<model>:<tensor name>[<first block>..<end block>)" where blocks are
  ggml blocks of the flattened tensor data (one element for F32/F16/BF16).
* synthetic: for every type weft dequantizes (including those the models do not use),
  deterministic blocks from a seeded numpy RNG: random quant bytes, sane finite scale fields
  (including zero, negative, subnormal-f16 and large scales), and for the plain float types
  random bit patterns plus special values (signed zeros, subnormals, infinities, one quiet NaN).

gguf-py (0.19) has no dequantizer for Q8_K and Q8_1 (they are ggml's activation formats for dot
products). For those two the reference is computed here with numpy from ggml's documented
formula `x = d * q` (d: f32 for Q8_K, f16 for Q8_1), and the manifest says so in "reference".
Note also that gguf-py's GGML_QUANT_SIZES lists Q8_1 as 40 bytes per block (the old layout
with f32 d and s); ggml's block_q8_1 is 36 bytes (f16 d, f16 s, 32 x i8), which is what weft
and this script use.

Regenerate (from the repository root):

    pip install gguf numpy
    python3 scripts/gen_dequant_fixtures.py \\
        --smollm2 PATH/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --gemma3  PATH/gemma-3-270m-q4_k_m.gguf
    cargo test -p weft-core --test suite dequant_reference::

Without --smollm2/--gemma3 the models are looked up as $WEFT_HOME/models/<file name above>
($WEFT_HOME defaults to ~/.cache/weft). The output is deterministic: rerunning with the same
models and gguf-py version rewrites identical files. The script deletes stale *.raw / *.f32
files in the output directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "crates" / "weft-core" / "tests" / "fixtures" / "dequant"

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

QK_K = 256

# (elements per block, bytes per block) as in ggml's ggml-common.h. Not taken from gguf-py's
# GGML_QUANT_SIZES because that table has a stale size for Q8_1 (40 instead of 36).
BLOCK = {
    T.F32: (1, 4),
    T.F16: (1, 2),
    T.BF16: (1, 2),
    T.Q4_0: (32, 18),
    T.Q4_1: (32, 20),
    T.Q5_0: (32, 22),
    T.Q5_1: (32, 24),
    T.Q8_0: (32, 34),
    T.Q8_1: (32, 36),
    T.Q2_K: (QK_K, 84),
    T.Q3_K: (QK_K, 110),
    T.Q4_K: (QK_K, 144),
    T.Q5_K: (QK_K, 176),
    T.Q6_K: (QK_K, 210),
    T.Q8_K: (QK_K, 292),
}

# Byte offsets of the f16 scale fields in each block type, filled with sane values in
# synthetic blocks (everything else is random bytes). Q8_1's `s` and Q8_K's f32 `d` and
# `bsums` are handled separately.
F16_SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],  # d, m
    T.Q5_0: [0],
    T.Q5_1: [0, 2],  # d, m
    T.Q8_0: [0],
    T.Q8_1: [0],  # d (s = d * sum(q) is computed)
    T.Q2_K: [80, 82],  # d, dmin
    T.Q3_K: [108],
    T.Q4_K: [0, 2],  # d, dmin
    T.Q5_K: [0, 2],  # d, dmin
    T.Q6_K: [208],
}

# Blocks per real case (each case is taken twice: start and middle of the tensor).
REAL_BLOCKS = {1: 128, 32: 8, QK_K: 4}
# Blocks per synthetic case; the first few blocks get the special scales below.
SYNTH_BLOCKS = {1: 512, 32: 8, QK_K: 6}
# Scales of the first synthetic blocks: zero, negative, smallest normal f16, an f16
# subnormal, a large value, negative zero. The remaining blocks get N(0, 0.05) scales.
SPECIAL_SCALES = [0.0, -1.5, 6.103515625e-05, 2.0**-20, 1000.0, -0.0]

SEED = 20240917


def ggml_dequantize_numpy(raw: np.ndarray, qtype: T) -> np.ndarray:
    """ggml's formula for the types gguf-py cannot dequantize: x = d * q."""
    n_el, n_bytes = BLOCK[qtype]
    blocks = raw.reshape(-1, n_bytes)
    if qtype == T.Q8_K:
        # block_q8_K: f32 d, int8 qs[256], int16 bsums[16]
        d = blocks[:, 0:4].copy().view("<f4").astype(np.float32)
        q = blocks[:, 4 : 4 + QK_K].copy().view(np.int8).astype(np.float32)
    elif qtype == T.Q8_1:
        # block_q8_1: f16 d, f16 s, int8 qs[32]
        d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)
        q = blocks[:, 4:36].copy().view(np.int8).astype(np.float32)
    else:
        raise NotImplementedError(qtype.name)
    return (d * q).astype(np.float32).reshape(-1)


def reference(raw: np.ndarray, qtype: T) -> tuple[np.ndarray, str]:
    """Dequantize with gguf-py; fall back to the numpy formula only where gguf-py has none."""
    if qtype in (T.Q8_K, T.Q8_1):
        # gguf-py 0.19 raises NotImplementedError for both; check so a future gguf-py that
        # gains them is used (and would expose any disagreement).
        try:
            out = gguf.quants.dequantize(raw, qtype)
        except NotImplementedError:
            return ggml_dequantize_numpy(raw, qtype), (
                f"numpy formula x = d * q (gguf-py {gguf_version()} cannot dequantize "
                f"{qtype.name})"
            )
        return np.asarray(out, dtype=np.float32).reshape(-1), "gguf-py"
    out = gguf.quants.dequantize(raw, qtype)
    assert out.dtype == np.float32, (qtype, out.dtype)
    return np.asarray(out).reshape(-1), "gguf-py"


def gguf_version() -> str:
    try:
        from importlib.metadata import version

        return version("gguf")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


def default_model_path(file_name: str) -> Path:
    home = os.environ.get("WEFT_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "weft"
    return base / "models" / file_name


def real_cases(model: str, path: Path) -> list[tuple[str, T, np.ndarray, str]]:
    """(name, type, raw bytes, source) for every tensor type in the model file."""
    reader = GGUFReader(path)
    by_type: dict[T, list] = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type, []).append(t)

    cases = []
    for qtype in sorted(by_type, key=lambda q: q.value):
        if qtype not in BLOCK:
            sys.exit(f"{path}: tensor type {qtype.name} has no dequantizer in weft; extend the script")
        n_el, n_bytes = BLOCK[qtype]
        count = REAL_BLOCKS[n_el]
        tensors = by_type[qtype]
        # First tensor in file order with room for two disjoint slices, else the largest.
        tensor = next(
            (t for t in tensors if int(t.n_elements) // n_el >= 2 * count),
            max(tensors, key=lambda t: int(t.n_elements)),
        )
        n_blocks = int(tensor.n_elements) // n_el
        count = min(count, n_blocks // 2)
        data = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(-1)
        assert data.size == n_blocks * n_bytes, (tensor.name, data.size, n_blocks, n_bytes)
        for where, first in (("start", 0), ("mid", n_blocks // 2)):
            raw = np.array(data[first * n_bytes : (first + count) * n_bytes])
            name = f"{model}_{qtype.name.lower()}_{where}"
            source = f"{model}:{tensor.name}[{first}..{first + count})"
            cases.append((name, qtype, raw, source))
    return cases


def synthetic_raw(qtype: T, rng: np.random.Generator) -> np.ndarray:
    n_el, n_bytes = BLOCK[qtype]
    n_blocks = SYNTH_BLOCKS[n_el]

    if qtype in (T.F32, T.F16, T.BF16):
        if qtype == T.F32:
            bits = rng.integers(0, 2**32, size=n_blocks, dtype=np.uint64).astype(np.uint32)
            exp_all_ones, man_mask, dt = 0x7F800000, 0x007FFFFF, "<u4"
            specials = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF,
                        0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F800000]
        elif qtype == T.F16:
            bits = rng.integers(0, 2**16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
            exp_all_ones, man_mask, dt = 0x7C00, 0x03FF, "<u2"
            specials = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                        0x7E00, 0x3C00]
        else:
            bits = rng.integers(0, 2**16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
            exp_all_ones, man_mask, dt = 0x7F80, 0x007F, "<u2"
            specials = [0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
                        0x7FC0, 0x3F80]
        # No random NaNs (their payload is not meaningful); one quiet NaN is among the specials.
        is_nan = ((bits & exp_all_ones) == exp_all_ones) & ((bits & man_mask) != 0)
        top_exponent_bit = exp_all_ones & ~(exp_all_ones >> 1)
        bits[is_nan] ^= np.array(top_exponent_bit, dtype=bits.dtype)  # now finite
        bits[: len(specials)] = specials
        return bits.astype(dt).view(np.uint8).copy()

    blocks = rng.integers(0, 256, size=(n_blocks, n_bytes), dtype=np.uint16).astype(np.uint8)

    def scale_values(n: int) -> np.ndarray:
        v = rng.normal(0.0, 0.05, size=n)
        k = min(n, len(SPECIAL_SCALES))
        v[:k] = SPECIAL_SCALES[:k]
        return v

    if qtype == T.Q8_K:
        # f32 d, then consistent bsums (sums of the quants over groups of 16).
        blocks[:, 0:4] = scale_values(n_blocks).astype("<f4").view(np.uint8).reshape(n_blocks, 4)
        q = blocks[:, 4 : 4 + QK_K].copy().view(np.int8).astype(np.int16)
        bsums = q.reshape(n_blocks, 16, 16).sum(axis=-1).astype("<i2")
        blocks[:, 260:292] = bsums.view(np.uint8).reshape(n_blocks, 32)
        return blocks.reshape(-1)

    for off in F16_SCALE_OFFSETS[qtype]:
        v = scale_values(n_blocks)
        rng.shuffle(v[1:])  # vary which block gets which special scale per field
        blocks[:, off : off + 2] = v.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_1:
        d = blocks[:, 0:2].copy().view("<f2").astype(np.float32).reshape(-1)
        qsum = blocks[:, 4:36].copy().view(np.int8).astype(np.float32).sum(axis=-1)
        blocks[:, 2:4] = (d * qsum).astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smollm2", type=Path, default=default_model_path(MODELS["smollm2"]))
    ap.add_argument("--gemma3", type=Path, default=default_model_path(MODELS["gemma3"]))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    for p in (args.smollm2, args.gemma3):
        if not p.is_file():
            sys.exit(f"model file not found: {p} (pass --smollm2/--gemma3 or set WEFT_HOME)")

    # Sanity: our block table agrees with gguf-py's wherever gguf-py can dequantize the type.
    for qtype, size in BLOCK.items():
        if qtype in (T.Q8_1,):
            continue  # gguf-py's table says 40 bytes (stale); ggml's block_q8_1 is 36
        assert tuple(gguf.GGML_QUANT_SIZES[qtype]) == size, (qtype, gguf.GGML_QUANT_SIZES[qtype])

    cases = real_cases("smollm2", args.smollm2) + real_cases("gemma3", args.gemma3)
    rng = np.random.default_rng(SEED)
    for qtype in BLOCK:  # dict order: fixed
        cases.append((f"synthetic_{qtype.name.lower()}", qtype, synthetic_raw(qtype, rng), "synthetic"))

    args.out.mkdir(parents=True, exist_ok=True)
    for stale in list(args.out.glob("*.raw")) + list(args.out.glob("*.f32")):
        stale.unlink()

    manifest_cases = []
    total = 0
    for name, qtype, raw, source in cases:
        n_el, n_bytes = BLOCK[qtype]
        assert raw.dtype == np.uint8 and raw.size % n_bytes == 0, name
        values, ref = reference(raw, qtype)
        n_elements = raw.size // n_bytes * n_el
        assert values.shape == (n_elements,), (name, values.shape, n_elements)
        (args.out / f"{name}.raw").write_bytes(raw.tobytes())
        (args.out / f"{name}.f32").write_bytes(values.astype("<f4").tobytes())
        total += raw.size + 4 * n_elements
        manifest_cases.append(
            {
                "name": name,
                "type": qtype.name,
                "n_elements": n_elements,
                "source": source,
                "reference": ref,
            }
        )
        print(f"{name:28} {qtype.name:5} {n_elements:5} elements  {ref if ref != 'gguf-py' else ''}")

    manifest = {
        "generator": "scripts/gen_dequant_fixtures.py",
        "reference": f"gguf-py {gguf_version()} gguf.quants.dequantize",
        "cases": manifest_cases,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{len(manifest_cases)} cases, {total} bytes of fixtures in {args.out}")


if __name__ == "__main__":
    main()
