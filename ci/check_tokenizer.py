#!/usr/bin/env python3
"""Compares Touchstone's tokenizer with Hugging Face's on real text, for every manifest model.

For each model of goldens/manifest.json, the same corpus of offline text is encoded by
  * HF: AutoTokenizer.from_pretrained(<models dir>, gguf_file=<filename>) (the tokenizer
    transformers builds from the GGUF), text(s) -> input_ids with add_special_tokens=True
    (BOS where the GGUF says add_bos_token), special-token text matched;
  * Touchstone: `<touchstone> --model M.gguf --jsonl IN` (default <touchstone> =
    build/default/bin/touchstone tokenize), IN = one JSON string per line, stdout = one JSON
    array of ids per input line, in order; encode(text, add_bos=true, parse_special=true).
and every text's id sequences must be equal. Reports per model: texts and tokens compared
(tokens = HF tokens), texts that differ, the first differing text (corpus order) with both
id sequences around the first differing position and their token pieces.

Also, always: the ids the goldens were recorded with (case prompt_ids, scoring token_ids,
encoded by Touchstone's tokenizer when the golden was written) against HF on the same text
-- a small check that needs no `tokenize` subcommand.

Corpus (all offline, deterministic order, deduplicated, split at blank lines into texts of
at most --max-chars characters); batches of 64 texts are taken from the category with the
fewest tokens so far until --max-tokens HF tokens:
  passages   goldens/passages/*.txt and the manifest's case prompts
  docs       .rst / .md / .txt / METADATA files shipped inside the installed packages
  docstrings docstrings of the Python stdlib and of installed packages (ast, no import)
  code       Python source files of the stdlib (whitespace, indentation, operators)
  intl       non-English text: the stdlib's test/cjkencodings/*-utf8.txt, every non-ASCII
             line of stdlib / package sources, /usr/share/i18n/locales (if present)

Exit status: 0 all equal, 1 some text differs, 2 setup error (e.g. no tokenize subcommand).
Run it in the validation venv:  ci/validate-reference --check-tokenizer [args]
"""
import argparse, ast, json, os, shlex, subprocess, sys, sysconfig, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_text(p):
    try:
        return p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def pieces(text, max_chars):
    """Splits at blank lines into texts of at most max_chars (a longer paragraph is cut at lines)."""
    out, cur = [], ""
    for para in text.replace("\r\n", "\n").split("\n\n"):
        para = para.strip("\n")
        if not para.strip():
            continue
        while len(para) > max_chars:
            cut = para.rfind("\n", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            out.append(para[:cut])
            para = para[cut:].lstrip("\n")
        if cur and len(cur) + 2 + len(para) > max_chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if cur:
        out.append(cur)
    return out


def py_files(base, exclude=("site-packages",)):
    return sorted(p for p in Path(base).rglob("*.py") if not any(x in p.parts for x in exclude))


def docstrings(path):
    src = read_text(path)
    if src is None:
        return
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node, clean=True)
            if d and len(d) > 40:
                yield d


def corpus_sources(manifest, max_chars):
    """category -> generator of texts (lazy: files are read only as far as needed)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])

    def passages():
        for p in sorted((ROOT / "goldens/passages").glob("*.txt")):
            yield from pieces(read_text(p) or "", max_chars)
        for c in manifest.get("cases", []):
            yield c["prompt"]

    def docs():
        files = sorted(p for p in site.rglob("*") if p.is_file() and (
            p.suffix.lower() in (".rst", ".md", ".txt") or p.name == "METADATA"))
        for p in files:
            yield from pieces(read_text(p) or "", max_chars)

    def docs_py():
        for base in (stdlib, site):
            for p in py_files(base, exclude=("site-packages", "test", "tests") if base == stdlib else ("tests",)):
                for d in docstrings(p):
                    yield from pieces(d, max_chars)

    def code():
        for p in py_files(stdlib, exclude=("site-packages", "test", "tests")):
            yield from pieces(read_text(p) or "", max_chars)

    def intl():
        for p in sorted((stdlib / "test/cjkencodings").glob("*-utf8.txt")):
            yield from pieces(read_text(p) or "", max_chars)
        loc = Path("/usr/share/i18n/locales")
        if loc.is_dir():
            for p in sorted(loc.iterdir()):
                t = read_text(p) if p.is_file() else None
                if t and any(ord(ch) > 127 for ch in t):
                    yield from pieces(t, max_chars)
        for base in (stdlib, site):
            for p in py_files(base):
                t = read_text(p)
                if not t:
                    continue
                lines = [ln.strip() for ln in t.splitlines() if any(ord(ch) > 127 for ch in ln)]
                if lines:
                    yield from pieces("\n".join(lines), max_chars)

    return {"passages": passages(), "docs": docs(), "docstrings": docs_py(), "code": code(), "intl": intl()}


def build_corpus(manifest, hf_tok, max_tokens, max_chars):
    """Round-robin over the categories, dedup, until the HF token count reaches max_tokens.
    Returns [(category, text)] and HF ids for each."""
    srcs = corpus_sources(manifest, max_chars)
    seen, texts, ids, ntok = set(), [], [], 0
    counts = {k: [0, 0] for k in srcs}
    active = list(srcs)
    while active and ntok < max_tokens:
        # next batch from the category with the fewest tokens so far (balanced by tokens)
        for cat in [min(active, key=lambda k: counts[k][1])]:
            batch = []
            for t in srcs[cat]:
                if t in seen or not t.strip():
                    continue
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError:  # lone surrogates: not representable as UTF-8
                    continue
                seen.add(t)
                batch.append(t)
                if len(batch) == 64:
                    break
            if not batch:
                active.remove(cat)
                continue
            enc = hf_tok(batch, add_special_tokens=True)["input_ids"]
            for t, e in zip(batch, enc):
                texts.append((cat, t))
                ids.append(list(e))
                ntok += len(e)
                counts[cat][0] += 1
                counts[cat][1] += len(e)
            if ntok >= max_tokens:
                break
    return texts, ids, counts


def touchstone_encode(cmd, gguf, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="ascii") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=True) + "\n")
        path = f.name
    try:
        argv = shlex.split(cmd) + ["--model", str(gguf), "--jsonl", path]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError as e:
        die(f"cannot run {cmd!r}: {e}")
    finally:
        os.unlink(path)
    if p.returncode != 0:
        die(f"`{' '.join(argv[:-1])} <texts.jsonl>` failed (exit {p.returncode}): {p.stderr.strip()[-800:]}\n"
            "Touchstone needs a `tokenize --model M.gguf --jsonl FILE` subcommand (see docs/validation.md, "
            "'Tokenizer check'); pass --touchstone CMD to use another command with that interface.")
    lines = p.stdout.splitlines()
    if len(lines) != len(texts):
        die(f"{cmd}: {len(lines)} output lines for {len(texts)} texts")
    return [json.loads(ln) for ln in lines]


def first_diff(a, b):
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def show_mismatch(tok, cat, text, hf, ts, ctx=8):
    i = first_diff(hf, ts)
    lo = max(0, i - ctx)
    def fmt(ids):
        part = ids[lo:i + ctx]
        return f"{'... ' if lo else ''}{part}{' ...' if len(ids) > i + ctx else ''}", \
            [tok.convert_ids_to_tokens(int(x)) if 0 <= x < len(tok) else f"<bad id {x}>" for x in part]
    shown = text if len(text) <= 600 else text[:600] + f"... ({len(text)} chars)"
    hf_s, hf_p = fmt(hf)
    ts_s, ts_p = fmt(ts)
    return "\n".join([
        f"  first differing text ({cat}, {len(text)} chars): {shown!r}",
        f"  first difference at token {i} (HF {len(hf)} tokens, Touchstone {len(ts)} tokens)",
        f"  HF         ids[{lo}:]: {hf_s}", f"             pieces: {hf_p}",
        f"  Touchstone ids[{lo}:]: {ts_s}", f"             pieces: {ts_p}"])


# The byte-level pre-tokenizers whose original tokenizer.json splits digits off first
# (Sequence[Digits(individual_digits=True), ByteLevel]); llama.cpp names them by
# tokenizer.ggml.pre and isolates \p{N} first, as Touchstone does.
DIGIT_FIRST_PRE = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva", "command-r"}


def restore_pretokenizer(tok, gguf):
    """transformers builds a "gpt2" GGUF tokenizer with a plain ByteLevel pre-tokenizer and
    ignores tokenizer.ggml.pre; for the digit-first families (SmolLM2's tokenizer.json:
    Digits(individual) then ByteLevel) that splits "\n\n1" as "\n","\n","1" where the
    model's own tokenizer gives "\n\n","1". Put the original pre-tokenizer back."""
    from gguf import GGUFReader
    from tokenizers import pre_tokenizers as pt
    f = GGUFReader(str(gguf)).fields
    def field(k):
        return bytes(f[k].parts[f[k].data[0]]).decode() if k in f else None
    model, pre = field("tokenizer.ggml.model"), field("tokenizer.ggml.pre")
    if model == "gpt2" and pre in DIGIT_FIRST_PRE:
        tok.backend_tokenizer.pre_tokenizer = pt.Sequence(
            [pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)])
        return (f"HF pre-tokenizer: GGUF pre '{pre}': Sequence[Digits(individual), ByteLevel] as in the "
                f"original tokenizer.json (transformers' GGUF loader gives plain ByteLevel; --hf-pretokenizer gguf keeps it)")
    return None


def squeeze(s):
    """repr of a text with whitespace runs longer than 3 written as ' '*56."""
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(repr(s[i]) + f"*{j - i}" if s[i].isspace() and j - i > 3 else repr(s[i:j]))
        i = j
    return "+".join(out).replace("'+'", "")


def diff_pattern(tok, hf, ts):
    """The differing span (common token prefix / suffix removed) as (text, HF pieces, TS pieces)."""
    i = first_diff(hf, ts)
    j = 0
    while j < min(len(hf), len(ts)) - i and hf[-1 - j] == ts[-1 - j]:
        j += 1
    a, b = hf[i:len(hf) - j], ts[i:len(ts) - j]
    return (squeeze(tok.decode(a)), " ".join(squeeze(tok.decode([x])) for x in a),
            " ".join(squeeze(tok.decode([x])) for x in b))


def golden_check(tok, golden, manifest, name):
    """HF vs the ids recorded in the golden (Touchstone's tokenizer at recording time)."""
    import h5py
    cases = {c["name"]: c for c in manifest.get("cases", [])}
    n = bad = tokens = 0
    msgs, no_bos = [], []
    with h5py.File(golden, "r") as f:
        for grp, key in (("cases", "prompt_ids"), ("scoring", "token_ids")):
            for cname in (f[grp].keys() if grp in f else []):
                g = f[grp][cname]
                txt_key = "prompt_text" if grp == "cases" else "text"
                if txt_key not in g:
                    continue
                text = g[txt_key][()].tobytes().decode("utf-8", "replace")
                hf = tok(text, add_special_tokens=True)["input_ids"]
                ref = [int(x) for x in g[key][()]]
                n += 1
                tokens += len(ref)
                if hf != ref and hf[1:] == ref and hf[:1] == [tok.bos_token_id]:
                    no_bos.append(f"{grp}/{cname}")  # recorded without BOS (a golden convention)
                elif hf != ref:
                    bad += 1
                    if not msgs:
                        msgs.append(show_mismatch(tok, f"golden {grp}/{cname}", text, hf, ref))
    if no_bos:
        msgs.insert(0, f"  identical after HF's BOS, but recorded without BOS: {', '.join(no_bos)}")
    return n, tokens, bad, msgs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", default=str(ROOT / "goldens/manifest.json"))
    ap.add_argument("--models-dir", default=os.environ.get("TOUCHSTONE_MODEL_DIR")
                    or os.path.expanduser("~/.cache/touchstone/models"))
    ap.add_argument("--models", help="comma-separated subset of manifest model names")
    ap.add_argument("--touchstone", default=f"{ROOT}/build/default/bin/touchstone tokenize",
                    help="command (shell words) given --model M.gguf --jsonl FILE "
                         "(default: build/default/bin/touchstone tokenize)")
    ap.add_argument("--max-tokens", type=int, default=1_200_000, help="HF tokens per model (default 1.2M)")
    ap.add_argument("--max-chars", type=int, default=4000, help="characters per text (default 4000)")
    ap.add_argument("--hf-pretokenizer", choices=("original", "gguf"), default="original",
                    help="original (default): restore the pre-tokenizer of the model's tokenizer.json that "
                         "transformers' GGUF loader drops (digit-first byte-level families); gguf: as loaded")
    ap.add_argument("--golden-only", action="store_true",
                    help="only compare HF with the ids recorded in the goldens (no tokenize subcommand needed)")
    args = ap.parse_args()

    from transformers import AutoTokenizer
    import transformers
    manifest = json.loads(Path(args.manifest).read_text())
    models = manifest.get("models", [])
    if args.models:
        want = set(args.models.split(","))
        models = [m for m in models if m["name"] in want]
    if not models:
        die("no models selected")
    print(f"tokenizer check: HF transformers {transformers.__version__} (tokenizer built from the GGUF) "
          f"vs `{args.touchstone}`" if not args.golden_only else "tokenizer check (golden ids only)")
    rc = 0
    for m in models:
        gguf = Path(args.models_dir) / m["filename"]
        if not gguf.is_file():
            die(f"{gguf} missing; run ci/fetch_models.py")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        note = restore_pretokenizer(tok, gguf) if args.hf_pretokenizer == "original" else None
        print(f"\n== {m['name']} ({gguf.name}; {type(tok).__name__}, {len(tok)} tokens)")
        if note:
            print(note)
        golden = Path(args.manifest).resolve().parent / m.get("golden", "")
        if m.get("golden") and golden.is_file():
            n, tokens, bad, msgs = golden_check(tok, golden, manifest, m["name"])
            print(f"golden ids: {n} texts, {tokens} tokens, {bad} differ" + "".join("\n" + x for x in msgs))
            rc = max(rc, 1 if bad else 0)
        if args.golden_only:
            continue
        t0 = time.time()
        texts, hf_ids, counts = build_corpus(manifest, tok, args.max_tokens, args.max_chars)
        t1 = time.time()
        ts_ids = touchstone_encode(args.touchstone, gguf, [t for _, t in texts])
        t2 = time.time()
        bad = [i for i, (a, b) in enumerate(zip(hf_ids, ts_ids)) if a != b]
        ntok = sum(map(len, hf_ids))
        nchar = sum(len(t) for _, t in texts)
        print("corpus: " + ", ".join(f"{k} {c[0]} texts/{c[1]} tokens" for k, c in counts.items()))
        print(f"compared {len(texts)} texts, {nchar} characters, {ntok} HF tokens "
              f"(HF {t1 - t0:.0f} s incl. reading, Touchstone {t2 - t1:.0f} s): "
              + ("all identical" if not bad else f"{len(bad)} texts differ"))
        if bad:
            per_cat = {}
            for i in bad:
                per_cat[texts[i][0]] = per_cat.get(texts[i][0], 0) + 1
            print(f"  differing texts per category: {per_cat}")
            i = bad[0]
            print(show_mismatch(tok, texts[i][0], texts[i][1], hf_ids[i], ts_ids[i]))
            pats = {}
            for i in bad:
                p = diff_pattern(tok, hf_ids[i], ts_ids[i])
                pats[p] = pats.get(p, 0) + 1
            print(f"  {len(pats)} distinct differing spans (common token prefix/suffix removed), most frequent:")
            for (txt, a, b), c in sorted(pats.items(), key=lambda kv: -kv[1])[:8]:
                print(f"    {c:4d}x  text {txt}:  HF [{a}]  Touchstone [{b}]")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
