#!/usr/bin/env python3
"""Independent validation of the Touchstone scalar reference against Hugging Face transformers.

Loads the golden model's GGUF in transformers (dequantized to fp32, eager attention,
deterministic CPU) and compares it with the recorded goldens:

* generation cases: one teacher-forced forward over prompt_ids + greedy_ids[:-1]
  gives HF's logits for every recorded step. Under causal attention HF's own greedy
  decode reproduces greedy_ids exactly iff argmax(row s) == greedy_ids[s] for every s
  (induction over s), and its first divergence is the first s where that fails, so
  this is HF greedy for G steps without re-running the model G times.
  Reported: first divergence (both ids, reference top-2 margin, near-tie flag),
  max-abs / NMSE of the full rows (steps < n_full_steps), of the stored top-K logits
  (all steps) and of the log-sum-exp.
* scoring passages: one forward over token_ids; max-abs / NMSE of the stored top-K
  logits, top-1 agreement, and KL(ref || hf) estimated over the reference top-K ids
  plus one "rest of the vocabulary" bucket (a lower bound of the full KL).

NMSE = sum((ref - hf)^2) / sum(ref^2). Exit status 1 when any greedy sequence
differs (near-ties included; they are flagged), 2 on setup errors.

Memory: one golden (model) at a time, one case at a time; HF returns only the logits
rows a case needs (logits_to_keep) as fp32, and every float64 statistic over the
vocabulary runs in blocks of ROW_BLOCK rows, so a 262,144-token vocabulary needs about
1 MiB per kept position plus ~0.25 GiB, not [T, V] float64 copies.

The GGUF of each golden: --model (one golden only), else the manifest model whose
`golden` names this file, found by its `filename` in --models-dir; else any *.gguf in
--models-dir whose sha256 is the golden's model_sha256. The GGUF's sha256 must equal the
golden's model_sha256.

Standalone (no golden; to compare with the reference before one exists):
  validate_reference.py --generate --model M.gguf --prompt "Once upon a time" --steps 16
prints HF's prompt ids (its tokenizer, loaded from the GGUF; BOS as the GGUF says), the
greedy continuation ids (one full forward per step, no KV cache) and the top-5 logits of
the first step.
"""
import argparse, datetime, gc, hashlib, json, os, platform, resource, sys
from pathlib import Path

import h5py
import numpy as np
import torch

NEAR_TIE = 0.05  # nats: a divergence whose reference top-2 margin is below this is a near-tie
ROW_BLOCK = 64   # rows per float64 block in the full-vocabulary statistics
MARK_BEGIN, MARK_END = "<!-- validate-reference:begin -->", "<!-- validate-reference:end -->"


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def text(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return v.tobytes().decode("utf-8", "replace") if v.dtype == np.uint8 else str(v.tolist())
    return str(v)


def err(ref, hf):
    ref, hf = np.asarray(ref, np.float64), np.asarray(hf, np.float64)
    if ref.size == 0:
        return float("nan"), float("nan")
    d = ref - hf
    return float(np.abs(d).max()), float((d * d).sum() / max((ref * ref).sum(), 1e-300))


def case_names(f, group, order=()):
    """Members in manifest order (`order`), then a root `case_order`, then the file's own order."""
    if group not in f:
        return []
    have = list(f[group].keys())  # h5py lists creation order when the file tracks it
    if "case_order" in f and group == "cases":
        order = list(order) + [text(x) for x in f["case_order"][()]]
    first = [n for n in dict.fromkeys(order) if n in have]
    return first + [n for n in have if n not in first]


def first_file(cands):
    return next((c for c in cands if c.is_file()), None)


def find_model(args, golden_path, want_sha, manifest_models):
    if args.model:
        return Path(args.model)
    mdir, root = Path(args.models_dir), Path(args.manifest).resolve().parent
    for m in manifest_models:
        if Path(str(m.get("golden", ""))).name == golden_path.name:
            for key in ("filename", "gguf", "file", "path", "model_file"):
                if key in m:
                    p = Path(os.path.expanduser(str(m[key])))
                    cands = [p] if p.is_absolute() else [mdir / p, mdir / p.name, root / p, root.parent / p]
                    found = first_file(cands)
                    if found:
                        return found
            break
    for p in sorted(mdir.glob("*.gguf")):  # fall back to the file whose sha256 the golden records
        if want_sha and sha256(p) == want_sha:
            return p
    die(f"no GGUF found for {golden_path} (sha256 {want_sha}) in {mdir}; run ci/fetch_models.py or pass --model")


def load_hf(gguf):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@torch.no_grad()
def forward(model, ids, keep=0):
    """fp32 logits [rows, V] of the last `keep` positions (0: all) as a numpy array."""
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False,
                logits_to_keep=keep)
    logits = out.logits[0].float().numpy()
    del out
    return logits


def blocks(n):
    return (slice(i, min(i + ROW_BLOCK, n)) for i in range(0, n, ROW_BLOCK))


def lse_rows(logits):
    """float64 log-sum-exp of every row of fp32 `logits`, ROW_BLOCK rows at a time."""
    out = np.empty(len(logits))
    for b in blocks(len(logits)):
        out[b] = np.logaddexp.reduce(logits[b].astype(np.float64), axis=-1)
    return out


def check_case(model, g):
    prompt = np.asarray(g["prompt_ids"][()], np.int64)
    greedy = np.asarray(g["greedy_ids"][()], np.int64)
    G, P = len(greedy), len(prompt)
    # positions P-1 .. P+G-2 of prompt + greedy[:-1], i.e. its last G positions
    logits = forward(model, np.concatenate([prompt, greedy[:-1]]), keep=G)
    assert logits.shape[0] == G, (logits.shape, G)
    hf_ids = logits.argmax(-1)
    tk_ids, tk_log = g["topk_ids"][()].astype(np.int64), g["topk_logits"][()]
    r = dict(P=P, G=G, div=None)
    bad = np.nonzero(hf_ids != greedy)[0]
    if bad.size:
        s = int(bad[0])
        top2 = np.sort(tk_log[s])[::-1][:2]
        margin = float(top2[0] - top2[1]) if top2.size > 1 else float("inf")
        r["div"] = dict(step=s, ref=int(greedy[s]), hf=int(hf_ids[s]), ref_margin=margin,
                        hf_margin=float(logits[s, hf_ids[s]]) - float(logits[s, greedy[s]]),
                        near_tie=margin < NEAR_TIE, n_bad=int(bad.size))
    F = g["full_logits"].shape[0] if "full_logits" in g else 0
    r["full"] = err(g["full_logits"][()], logits[:F]) if F else (float("nan"),) * 2
    r["F"] = F
    r["topk"] = err(tk_log, np.take_along_axis(logits, tk_ids, 1))
    r["lse"] = float(np.abs(g["lse"][()] - lse_rows(logits)).max()) if "lse" in g else float("nan")
    return r


def check_scoring(model, g):
    ids = np.asarray(g["token_ids"][()], np.int64)
    R = len(ids) - 1
    logits = forward(model, ids)[:-1]  # fp32 [R, V]
    tk_ids, tk_log = g["topk_ids"][()].astype(np.int64), g["topk_logits"][()].astype(np.float64)
    hf_tk = np.take_along_axis(logits, tk_ids, 1).astype(np.float64)
    ref_lse = g["lse"][()].astype(np.float64)
    tgt = ids[1:]
    hf_lse, lq_tail = np.empty(R), np.empty(R)
    for b in blocks(R):  # float64 over the vocabulary, ROW_BLOCK rows at a time
        x = logits[b].astype(np.float64)
        hf_lse[b] = np.logaddexp.reduce(x, axis=-1)
        np.put_along_axis(x, tk_ids[b], -np.inf, 1)
        lq_tail[b] = np.logaddexp.reduce(x, axis=-1) - hf_lse[b]
        del x
    # KL(ref || hf) over the top-K ids + one tail bucket holding the remaining mass (the same
    # estimate as parity/metrics kl_divergence_topk; a lower bound of the full KL).
    lp_ref, lp_hf = tk_log - ref_lse[:, None], hf_tk - hf_lse[:, None]
    p_ref = np.exp(lp_ref)
    p_tail = np.clip(1 - p_ref.sum(1), 0, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_tail > 0, p_tail * (np.log(p_tail) - lq_tail), 0.0)
    kl = np.maximum((p_ref * (lp_ref - lp_hf)).sum(1) + tail, 0)
    ref_top1 = tk_ids[np.arange(len(tk_ids)), tk_log.argmax(1)]
    hf_nll = hf_lse - logits[np.arange(R), tgt].astype(np.float64)
    r = dict(N=len(ids), topk=err(tk_log, hf_tk), top1=float((logits.argmax(-1) == ref_top1).mean()),
             kl_mean=float(kl.mean()), kl_p99=float(np.percentile(kl, 99)), kl_max=float(kl.max()),
             hf_ppl=float(np.exp(hf_nll.mean())),
             lse=float(np.abs(ref_lse - hf_lse).max()))
    if "target_logits" in g:
        t = g["target_logits"][()].astype(np.float64)
        r["target"] = float(np.abs(t - logits[np.arange(R), tgt]).max())
        r["ref_ppl"] = float(np.exp((ref_lse - t).mean()))
    return r


def rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@torch.no_grad()
def generate(args):
    """--generate: HF's greedy continuation of --prompt for --steps steps, no golden needed."""
    from transformers import AutoTokenizer
    gguf = Path(args.model)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = tok(args.prompt, add_special_tokens=not args.no_bos).input_ids
    model = load_hf(gguf)
    print(f"model: {gguf} (sha256 {sha256(gguf)})")
    print(f"versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) +
          f"; fp32, eager, CPU, {torch.get_num_threads()} thread{'' if torch.get_num_threads() == 1 else 's'}")
    print(f"prompt: {args.prompt!r}")
    print(f"prompt_ids ({len(ids)}): {ids}")
    seq, out = list(ids), []
    for step in range(args.steps):
        row = forward(model, seq, keep=1)[0]  # full forward each step: no KV cache involved
        nxt = int(row.argmax())
        if step == 0:
            lse = float(np.logaddexp.reduce(row.astype(np.float64)))
            top = np.argsort(-row, kind="stable")[:args.top]
            print(f"step 0 top-{args.top} (logit; log-sum-exp {lse:.6f}):")
            for t in top:
                print(f"  {int(t):7d}  {float(row[t]):+.6f}  {tok.convert_ids_to_tokens(int(t))!r}")
        out.append(nxt)
        seq.append(nxt)
    print(f"greedy_ids ({len(out)}): {out}")
    print(f"greedy_text: {tok.decode(out)!r}")
    return 0


def versions():
    import gguf, transformers
    from importlib.metadata import version
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "gguf": version("gguf"),
            "numpy": np.__version__, "h5py": h5py.__version__}


def shown(path):  # repo-relative when inside the repository
    root = Path(__file__).resolve().parent.parent
    p = Path(path).resolve()
    return p.relative_to(root) if p.is_relative_to(root) else p


def g3(x):
    return "-" if x is None or x != x else f"{x:.3g}"


def report(golden, attrs, gguf, sha, cases, scoring):
    L = [f"### {text(attrs.get('model_name', golden.stem))}", "",
         f"- date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
         f"- golden: `{shown(golden)}` (format_version {text(attrs.get('format_version', '?'))}, "
         f"recorded by `{text(attrs.get('reference_version', '?'))}` at revision `{text(attrs.get('reference_revision', '?'))}`)",
         f"- model: `{gguf.name}`, sha256 `{sha}`",
         "- " + ", ".join(f"{k} {v}" for k, v in versions().items()),
         f"- HF: fp32 dequantized GGUF, eager attention, CPU, deterministic algorithms, {torch.get_num_threads()} thread{'' if torch.get_num_threads() == 1 else 's'}",
         "", "| case | P | G | greedy | full max-abs | full NMSE | top-K max-abs | top-K NMSE | lse max-abs |",
         "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for n, r in cases.items():
        d = r["div"]
        gr = "identical" if d is None else (
            f"**differs** at step {d['step']}: ref {d['ref']} / hf {d['hf']}, ref top-2 margin {d['ref_margin']:.3g}, "
            f"hf prefers by {d['hf_margin']:.3g}; argmax differs at {d['n_bad']}/{r['G']} teacher-forced steps"
            + (" (near-tie)" if d["near_tie"] else ""))
        L.append(f"| {n} | {r['P']} | {r['G']} | {gr} | {g3(r['full'][0])} ({r['F']} rows) | "
                 f"{g3(r['full'][1])} | {g3(r['topk'][0])} | {g3(r['topk'][1])} | {g3(r['lse'])} |")
    if scoring:
        L += ["", "| scoring passage | N | top-K max-abs | top-K NMSE | top-1 agree | KL mean | KL p99 | KL max | "
              "target max-abs | lse max-abs | PPL ref / hf |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for n, r in scoring.items():
            L.append(f"| {n} | {r['N']} | {g3(r['topk'][0])} | {g3(r['topk'][1])} | {r['top1']:.4f} | "
                     f"{g3(r['kl_mean'])} | {g3(r['kl_p99'])} | {g3(r['kl_max'])} | {g3(r.get('target'))} | "
                     f"{g3(r['lse'])} | {r.get('ref_ppl', float('nan')):.6g} / {r['hf_ppl']:.6g} |")
    n_div = sum(r["div"] is not None for r in cases.values())
    n_tie = sum(r["div"] is not None and r["div"]["near_tie"] for r in cases.values())
    L += ["", f"Greedy sequences: {len(cases) - n_div}/{len(cases)} identical"
          + (f" ({n_tie} of the differences at near-ties, margin < {NEAR_TIE} nats)." if n_tie else "."), ""]
    return "\n".join(L), n_div


def write_doc(path, body):
    path = Path(path)
    block = f"{MARK_BEGIN}\n{body}\n{MARK_END}\n"
    old = path.read_text() if path.exists() else ""
    if MARK_BEGIN in old and MARK_END in old:
        new = old[:old.index(MARK_BEGIN)] + block + old[old.index(MARK_END) + len(MARK_END):].lstrip("\n")
    else:
        new = (old.rstrip("\n") + "\n\n" if old else "# Independent validation\n\n"
               "Generated by `ci/validate-reference`.\n\n") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def main():
    global NEAR_TIE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("goldens", nargs="*", help="golden .h5 files (default: all in the manifest)")
    ap.add_argument("--manifest", default=str(Path(__file__).resolve().parent.parent / "goldens/manifest.json"))
    ap.add_argument("--model", help="GGUF path (default: the manifest model of each golden, from --models-dir)")
    ap.add_argument("--models-dir", default=os.environ.get("TOUCHSTONE_MODEL_DIR") or os.environ.get(
        "TOUCHSTONE_MODELS") or os.path.expanduser("~/.cache/touchstone/models"),
        help="model cache (default $TOUCHSTONE_MODEL_DIR or ~/.cache/touchstone/models)")
    ap.add_argument("--cases", help="comma-separated subset of case and scoring-passage names")
    ap.add_argument("--write-doc", help="also write the markdown section to this file")
    ap.add_argument("--near-tie", type=float, default=NEAR_TIE, help="near-tie margin in nats (flag only)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    g = ap.add_argument_group("standalone greedy run (--generate; needs --model and --prompt)")
    g.add_argument("--generate", action="store_true", help="print HF's greedy ids for --prompt and exit")
    g.add_argument("--prompt", help="prompt text for --generate")
    g.add_argument("--steps", type=int, default=16, help="greedy steps for --generate (default 16)")
    g.add_argument("--top", type=int, default=5, help="top-N logits of the first step (default 5)")
    g.add_argument("--no-bos", action="store_true", help="do not add BOS (default: as the GGUF tokenizer says)")
    args = ap.parse_args()
    NEAR_TIE = args.near_tie

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    if args.generate:
        if not args.model or args.prompt is None:
            die("--generate needs --model and --prompt")
        return generate(args)
    goldens = [Path(p) for p in args.goldens]
    manifest = json.loads(Path(args.manifest).read_text()) if Path(args.manifest).exists() else {}
    if not goldens:
        root = Path(args.manifest).parent
        for m in manifest.get("models", []):
            g = Path(m["golden"])
            goldens.append(first_file([root / g, root.parent / g, root / g.name]) or root / g)
    if not goldens:
        die("no goldens given and no manifest models found")
    if args.model and len(goldens) > 1:
        die("--model applies to one golden; name it, or let the manifest pick each golden's GGUF")
    sections, total_div = [], 0
    for golden in goldens:
        if not golden.is_file():
            die(f"golden file {golden} does not exist (record it first)")
        stem = next((m["name"] for m in manifest.get("models", []) if Path(str(m.get("golden", ""))).name == golden.name), None)
        order = {k: [c["name"] for c in manifest.get(k, []) if c.get("model") in (None, stem)]
                 for k in ("cases", "scoring")}
        with h5py.File(golden, "r") as f:
            attrs = {k: f.attrs[k] for k in f.attrs}
            want = text(attrs["model_sha256"]) if "model_sha256" in attrs else None
            gguf = find_model(args, golden, want, manifest.get("models", []))
            sha = sha256(gguf)
            if want and sha != want:
                die(f"{gguf} sha256 {sha} != golden model_sha256 {want}")
            print(f"[validate] {golden}: loading {gguf}", file=sys.stderr)
            model = load_hf(gguf)
            only = set(args.cases.split(",")) if args.cases else None
            cases, scoring = {}, {}
            for n in case_names(f, "cases", order["cases"]):
                if only is None or n in only:
                    cases[n] = check_case(model, f["cases"][n])
                    print(f"[validate]   case {n}: {'ok' if cases[n]['div'] is None else 'DIFFERS'} "
                          f"(peak RSS {rss_gib():.2f} GiB)", file=sys.stderr)
            for n in case_names(f, "scoring", order["scoring"]):
                if only is None or n in only:
                    scoring[n] = check_scoring(model, f["scoring"][n])
                    print(f"[validate]   scoring {n}: top-1 agree {scoring[n]['top1']:.4f}", file=sys.stderr)
            del model
            gc.collect()
            print(f"[validate]   peak RSS so far {rss_gib():.2f} GiB", file=sys.stderr)
        body, n_div = report(golden, attrs, gguf, sha, cases, scoring)
        sections.append(body)
        total_div += n_div
    out = "## Independent validation against Hugging Face transformers\n\n" + "\n".join(sections)
    print(out)
    if args.write_doc:
        write_doc(args.write_doc, out)
    if total_div:
        print(f"[validate] FAIL: {total_div} greedy sequence(s) differ", file=sys.stderr)
    return 1 if total_div else 0


if __name__ == "__main__":
    sys.exit(main())
