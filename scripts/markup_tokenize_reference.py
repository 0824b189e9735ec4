#!/usr/bin/env python3
"""llama.cpp's ids for angle-bracket markup: HTML-like tags, special-token text and near misses.

Gemma 3's vocabulary holds user-defined tokens that look like tags (`<b>`, `</s>`, `<h1>`, ...)
beside control tokens (`<bos>`, `<start_of_turn>`, `<unusedN>`), and llama.cpp overrides some of
those types by their text, so these strings check which tokens are cut out of the input with
special-token parsing on and off. Each text is tokenized by llama.cpp's own `llama-tokenize`, with
the model's default BOS rule, once with special tokens parsed and once with `--no-parse-special`.

usage: python3 scripts/markup_tokenize_reference.py LLAMA_TOKENIZE [OUT.json]

LLAMA_TOKENIZE is the `llama-tokenize` binary of a llama.cpp build (e.g. from the sdist of the
PyPI package llama-cpp-python 0.3.36, which vendors llama.cpp 0c1e57098, the commit of
shared/reference; see shared/reference/README.md for the build). The models are read from
$WEFT_HOME/models (default ~/.cache/weft/models); any weft test that loads them fetches them.
OUT defaults to crates/weft-core/tests/fixtures/markup_tokenize.json.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

# Fixture key -> file name in $WEFT_HOME/models.
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

TEXTS = [
    # `</s>` alone, in runs of tags, between words, doubled, and next to brackets.
    "</s>",
    "<s>",
    "<s>hello</s>",
    "<b>bold</b><i>it</i></s><u>u</u>",
    "text</s>more</s>end",
    "</s></s></s>",
    "<s></s><s></s>",
    "<</s>><<s>>",
    "</s >< /s></S>",
    # Formatting and structure tags, nested, with spaces, newlines and tabs around them.
    "<b>x</b>",
    "<h1>Title</h1><p>text</p>",
    "<div><span>a</span></div>",
    "<ul><li>one</li><li>two</li></ul>",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    " <b> bold </b> ",
    "\n<div>\n  </div>\n\n",
    "\t\t<code>fn main() {}</code>\n</s>  ",
    "x<sub>2</sub>+y<sup>3</sup></s>",
    # Unicode around tags.
    "café <em>naïve</em> 日本語</s>",
    "🙂<strong>ü</strong>🙂</s>ß",
    # Control tokens as text.
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<unused5>",
    "<mask>",
    "<pad>",
    "<eos>",
    "<bos>",
    "<bos><eos></s><pad>",
    "<unk><mask><unused0></s>",
    "<start_of_image><end_of_image>[multimodal]",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<reponame>x<filename>y<|endoftext|></s>",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenize(binary, model, text, parse_special):
    # The text goes through a file, verbatim: llama-tokenize reads -f as raw bytes, and
    # --no-escape keeps backslashes as they are.
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [binary, "-m", model, "-f", path, "--ids", "--no-escape", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    # The ids are printed as one Python-style list on the last line.
    return json.loads(out.strip().splitlines()[-1])


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    binary = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        root, "crates/weft-core/tests/fixtures/markup_tokenize.json")
    home = os.environ.get("WEFT_HOME") or os.path.expanduser("~/.cache/weft")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True)
    version = (version.stdout + version.stderr).strip().splitlines()[0]
    models = {}
    for key, name in MODELS.items():
        path = os.path.join(home, "models", name)
        models[key] = {"file": name, "sha256": sha256(path), "path": path}
    cases = []
    for text in TEXTS:
        case = {"text": text}
        for key, m in models.items():
            case[f"{key}_ids"] = tokenize(binary, m["path"], text, True)
            case[f"{key}_ids_no_special"] = tokenize(binary, m["path"], text, False)
        cases.append(case)
    for m in models.values():
        del m["path"]
    fixture = {
        "about": "llama.cpp's llama-tokenize ids, model's default BOS rule; `<model>_ids` with "
                 "special tokens parsed, `<model>_ids_no_special` with --no-parse-special. "
                 "Made by scripts/markup_tokenize_reference.py.",
        "llama_cpp": version,
        "models": models,
        "cases": cases,
    }
    text = json.dumps(fixture, ensure_ascii=False, indent=1)
    # One line per id list.
    text = re.sub(r"\[[\d,\s]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {len(cases)} cases to {out} ({version})")


if __name__ == "__main__":
    main()
