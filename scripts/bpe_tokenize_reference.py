#!/usr/bin/env python3
"""Hugging Face reference for weft's BPE `tokenizer.json` loader: the files and the ids.

The models' Hugging Face repositories are out of reach (and no PyPI package ships their
`tokenizer.json`), so the files are made from the GGUF files weft runs, by Hugging Face
`transformers`' own GGUF tokenizer conversion (`TokenizersBackend.from_pretrained(dir,
gguf_file=...)`, what `AutoTokenizer` does once it knows the class), and saved with
`tokenizers`. The ids then come from Hugging Face `tokenizers` loading those files: an
implementation independent of weft's.

usage: python3 -m venv V && V/bin/pip install transformers==5.23.0 tokenizers==0.23.3 gguf==0.19.0
       V/bin/python scripts/bpe_tokenize_reference.py make SMOLLM2.gguf GEMMA3.gguf OUTDIR
       V/bin/python scripts/bpe_tokenize_reference.py fixture OUTDIR REFERENCE/tokenize.json OUT.json
       V/bin/python scripts/bpe_tokenize_reference.py check OUTDIR REFERENCE/tokenize.json

`make` writes OUTDIR/smollm2-135m.tokenizer.json, OUTDIR/gemma3-270m.tokenizer.json and
OUTDIR/smollm2-135m-digits.tokenizer.json: the SmolLM2 file with its pre-tokenizer set to
Sequence[Digits(individual_digits), ByteLevel], the pre-tokenizer HuggingFaceTB's own file uses and
that llama.cpp calls "smollm" (transformers maps that name to nothing, so its conversion keeps
GPT-2's ByteLevel alone; the two agree on every case because no SmolLM2 token holds two digits).
`fixture` writes crates/weft/tests/fixtures/bpe_tokenize.json. `check` compares HF's ids with
llama.cpp's (shared/reference/tokenize.json) and prints every difference.

transformers 5.23 reads GGUF metadata with a module that imports torch for the tensors; only the
metadata is needed here, so that one function is provided from the `gguf` package instead.
"""
import hashlib
import json
import os
import sys
import types

MODELS = {
    "smollm2-135m": "smollm2",
    "gemma3-270m": "gemma3",
    "smollm2-135m-digits": "smollm2",
}


def read_gguf_metadata(path, string_arrays=()):
    """transformers' `read_gguf_metadata` contract: (metadata, tensor names); string arrays are
    read only for the keys asked for (a count otherwise), numeric arrays as lists."""
    import gguf

    reader = gguf.GGUFReader(path)
    md = {}
    for field in reader.fields.values():
        kinds = field.types
        if not kinds:
            continue
        if kinds[0] == gguf.GGUFValueType.ARRAY:
            if kinds[-1] == gguf.GGUFValueType.STRING:
                if field.name in string_arrays:
                    md[field.name] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
                else:
                    md[field.name] = len(field.data)
            else:
                md[field.name] = [field.parts[i].tolist()[0] for i in field.data]
        elif kinds[0] == gguf.GGUFValueType.STRING:
            md[field.name] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            md[field.name] = field.parts[field.data[0]].tolist()[0]
    return md, tuple(t.name for t in reader.tensors)


def convert(gguf_path, out_path):
    import transformers  # noqa: F401  (imported before the reader module is replaced)

    fake = types.ModuleType("transformers.integrations.gguf.reader")
    fake.read_gguf_metadata = read_gguf_metadata
    sys.modules["transformers.integrations.gguf.reader"] = fake
    from transformers import TokenizersBackend

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = TokenizersBackend.from_pretrained(folder, gguf_file=name)
    tok.backend_tokenizer.save(out_path)


def with_digits(src, dst):
    from tokenizers import Tokenizer, pre_tokenizers

    tok = Tokenizer.from_file(src)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.save(dst)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make(smollm2, gemma3, outdir):
    os.makedirs(outdir, exist_ok=True)
    for name, gguf_path in (("smollm2-135m", smollm2), ("gemma3-270m", gemma3)):
        out = os.path.join(outdir, f"{name}.tokenizer.json")
        convert(gguf_path, out + ".tmp")
        os.replace(out + ".tmp", out)
    digits = os.path.join(outdir, "smollm2-135m-digits.tokenizer.json")
    with_digits(os.path.join(outdir, "smollm2-135m.tokenizer.json"), digits + ".tmp")
    os.replace(digits + ".tmp", digits)
    for name in MODELS:
        path = os.path.join(outdir, f"{name}.tokenizer.json")
        print(f"{sha256(path)}  {path}")


def long_text(n_words, seed=4242):
    words = ("the of and to in is was for on that with as by at from it an were which this be or has "
             "government international development approximately tokenization naïve café Zürich "
             "1999 2024 3.14 don't we'll they're ¿qué? 東京 🙂").split()
    out, x = [], seed
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        w = words[x % len(words)]
        if x % 13 == 0:
            w += ","
        elif x % 19 == 0:
            w += ".\n"
        out.append(w)
    return " ".join(out)


EXTRA = [
    "", " ", "  ", "\n", "\t", "a", "Hello", " Hello", "  Hello", "Hello ", "Hello  ", "hello world  ",
    "Café", "naïve résumé", "ÀÉÎÕÜ àéîõü", "e\u0301 vs \u00e9", "Tiếng Việt rất đẹp", "İstanbul ıi IŞIK",
    "Straße ẞ", "ﬁﬂ ＡＢＣ１２３", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "नमस्ते दुनिया", "مرحبا بالعالم", "שָׁלוֹם", "สวัสดีครับ",
    "我爱自然语言处理，特别是分词。", "東京は日本の首都です。カタカナ ｶﾀｶﾅ", "안녕하세요 세계", "𠀀𪜀 𫠠 丽",
    "I ❤️ NY 👍🏽 🎉", "👨\u200d👩\u200d👧\u200d👦 family", "🇺🇸🇯🇵 🏳️\u200d🌈", "👩\u200d💻👩🏽\u200d🚀",
    "0", "12", "123", "1234567890", "3.14159 2,718 1e-9 -42 +7 0x1F 1_000", "٣٤٥ ๓๔ ²³ ½ Ⅻ",
    "a1b22c333d4444", " 2024-05-17T12:34:56Z", "v1.2.3-rc.4",
    "  two\n\nthree\n\n\nfour    four\t\ttabs\r\nCRLF \n \n", "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "\t\t\t\tindented\n\t\t", "trailing spaces    ", "   ", " \u00a0\u2009\u3000 mixed\u2028spaces\u0085",
    "I'm you're he's we've they'll she'd can't won't Y'ALL'D 'S 'tis",
    "don't DON'T Don'T", "it’s curly ’s",
    "def f(x):\n    return {'a': [1, 2, 3]}  # dict\n", "fn main() { let v: Vec<u8> = vec![]; }",
    "<html><body><table><tr><td>cell</td></tr></table></body></html>", "<b>bold</b> <i>it</i> <unknown>",
    "SELECT * FROM t WHERE x >= 10 AND y != 'z';", "a+b=c; x*=2; y/=3; z**=4; !@#$%^&*()_+-=[]{}|;:,.<>?/~`",
    "https://example.com/a/b?x=1&y=%20#top mailto:a@b.org", "C:\\Users\\me\\file.txt",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>", "<|im_start|><|im_end|>", "x<|im_start|>y", "<|im_start", "|im_end|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>", "a<end_of_turn>b",
    "<bos>", "<eos> <pad> <unk> <mask>", "<start_of_image>", "[multimodal]",
    "<unused0> <unused99>", "<0x41> <0xZZ>", "▁ ▁▁ a▁b", "\u2581\u2581\u2581",
    "\x00\x01\x07\x1b\x7f", "\ufffd \ufeff\u200b\u200c\u200d\u2060", "\U000F0000 \ue001 \U0010FFFF",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "The quick brown fox jumps over the lazy dog! " * 8,
    long_text(1500),
]


def cases(reference):
    texts = [c["text"] for c in json.load(open(reference, encoding="utf-8"))["cases"]]
    return list(dict.fromkeys(texts + EXTRA))


def hf_ids(tok, text):
    with_special = tok.encode(text, add_special_tokens=True).ids
    tok.encode_special_tokens = True
    no_special = tok.encode(text, add_special_tokens=True).ids
    tok.encode_special_tokens = False
    plain = tok.encode(text, add_special_tokens=False).ids
    return with_special, no_special, tok.decode(plain, skip_special_tokens=False)


# The split regexes weft implements by hand (as llama.cpp does) rather than with a regex engine.
SPLIT_REGEXES = {
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def split_words(reference):
    """HF's words for each text under each split regex (Split(Regex, "isolated"))."""
    from tokenizers import Regex, pre_tokenizers

    out = {}
    for name, pattern in SPLIT_REGEXES.items():
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        out[name] = {"pattern": pattern,
                     "cases": [{"text": t, "words": [w for w, _ in split.pre_tokenize_str(t)]}
                               for t in cases(reference)]}
    return out


def fixture(outdir, reference, out):
    import tokenizers
    from tokenizers import Tokenizer

    toks = {name: Tokenizer.from_file(os.path.join(outdir, f"{name}.tokenizer.json")) for name in MODELS}
    doc = {
        "tool": f"Hugging Face tokenizers {tokenizers.__version__} (Python) on tokenizer.json files made from "
                "the GGUF files by transformers 5.23.0 (scripts/bpe_tokenize_reference.py)",
        "fields": "ids: add_special_tokens, special tokens parsed; ids_no_special: add_special_tokens with "
                  "encode_special_tokens (special-token text is plain text); decoded: decode(ids of "
                  "encode(add_special_tokens=False)), skip_special_tokens=False",
        "models": {},
    }
    for name, tok in toks.items():
        path = os.path.join(outdir, f"{name}.tokenizer.json")
        rows = []
        for text in cases(reference):
            ids, no_special, decoded = hf_ids(tok, text)
            rows.append({"text": text, "ids": ids, "ids_no_special": no_special, "decoded": decoded})
        doc["models"][name] = {"sha256": sha256(path), "size": os.path.getsize(path), "cases": rows}
    doc["split_regexes"] = split_words(reference)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True, indent=None)
        f.write("\n")
    print(f"{len(rows)} cases x {len(toks)} tokenizers -> {out}")


def check(outdir, reference):
    from tokenizers import Tokenizer

    ref = json.load(open(reference, encoding="utf-8"))["cases"]
    failures = 0
    for name, key in MODELS.items():
        tok = Tokenizer.from_file(os.path.join(outdir, f"{name}.tokenizer.json"))
        bad = 0
        for case in ref:
            ids, no_special, _ = hf_ids(tok, case["text"])
            for got, field in ((ids, f"{key}_ids"), (no_special, f"{key}_ids_no_special")):
                if got != case[field]:
                    bad += 1
                    print(f"{name} {field} {case['text']!r}\n  llama.cpp {case[field]}\n  HF        {got}")
        print(f"{name}: {2 * len(ref) - bad}/{2 * len(ref)} id lists equal llama.cpp's")
        failures += bad
    return failures


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(*args)
    elif cmd == "fixture":
        fixture(*args)
    elif cmd == "check":
        sys.exit(1 if check(*args) else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
