#!/usr/bin/env python3
"""llguidance_vocab_test.py TOUCHSTONE MANIFEST MODEL_DIR

The tokenizer the NumPy engine gives llguidance (examples/llguidance_grammar.py,
GGUFVocab) must tokenize text as the model's tokenizer does (`touchstone
tokenize`, model/tokenizer, checked against HF elsewhere): every manifest prompt
and grammar file, and strings that exercise the pre-tokenizer (spaces, digits,
contractions, newlines, accents, symbols), on every model of the manifest. Exit
77 (SKIP) without numpy or a model; 1 naming the first differing string.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
touchstone, manifest, model_dir = sys.argv[1:4]
try:
    from touchstone_engine.examples.gguf_reader import GGUFFile
    from touchstone_engine.examples.llguidance_grammar import GGUFVocab
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

m = json.load(open(manifest))
root = os.path.dirname(manifest)
texts = [c["prompt"] for c in m["cases"] if "prompt" in c]
texts += [open(os.path.join(root, c["grammar"]["file"])).read()
          for c in m["cases"] if "file" in c.get("grammar", {})]
texts += ["Answer: yes.", "Température : 21 °C", "height_m", "it's, they're, we'll",
          "  two  spaces   and\ttab\n\nnew lines \n", "x 123 4567 89.5e-3", "Über naïve café",
          "{\"name\": \"Ana\", \"age\": 42}", "emoji 🙂 and 中文", "a  \n  b", " leading", "end "]
failed = 0
for model in m["models"]:
    path = os.path.join(model_dir, model["filename"])
    if not os.path.exists(path):
        print(f"SKIP: {path} not fetched (ci/fetch_models.py)")
        sys.exit(77)
    g = GGUFFile(path)
    vocab = GGUFVocab({k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")})
    run = subprocess.run([touchstone, "tokenize", "--model", path, "--no-bos", "--no-parse-special",
                          "--jsonl", "-"], input="\n".join(json.dumps(t) for t in texts) + "\n",
                         capture_output=True, text=True, check=True)
    want = [json.loads(line) for line in run.stdout.splitlines()]
    for t, w in zip(texts, want):
        got = vocab(t.encode("utf-8"))
        if got != w:
            failed += 1
            print(f"FAIL: {model['name']}: {t[:60]!r}: GGUFVocab {got[:12]} vs touchstone {w[:12]}")
    print(f"{model['name']}: {len(texts)} texts compared")
sys.exit(1 if failed else 0)
