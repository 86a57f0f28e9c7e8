#!/usr/bin/env python3
"""The engine x serving check x model table of docs/serving-checks.md: runs
`touchstone parity --serving-only` (quick plan, one thread) for every engine
below that runs here and prints one Markdown table: per check, PASS / FAIL /
KNOWN_DIVERGENCE with the worst NMSE and max |diff| (or "bitwise"), and NOT
SUPPORTED where the engine cannot run a check.

usage: tools/serving-table/serving_table.py [BUILD_DIR] [--plan quick|full] [--out FILE.md] [--reuse]
BUILD_DIR defaults to build/default; reports go to BUILD_DIR/reports/serving-table/.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = ["serving.batch_invariance", "serving.content_isolation", "serving.prefix_fork",
          "serving.speculative_verify"]
MODELS = ["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"]
LLAMACPP_KD = os.path.join(ROOT, "backends/llamacpp/known_divergences.json")
SERVER_KD = os.path.join(ROOT, "tests/http/llama_server_known_divergences.json")
# llama-server (built by ci/llamacpp) over HTTP: "llama-server -np N" rows start
# it through tests/http/llama_server_parity.py with N parallel slots.
SERVER_WRAPPER = os.path.join(ROOT, "tests/http/llama_server_parity.py")
MODEL_DIR = os.environ.get("TOUCHSTONE_MODEL_DIR",
                           os.path.expanduser("~/.cache/touchstone/models"))
# The NumPy engine's interpreter: TOUCHSTONE_PYTHON, else Debian's (python3-numpy).
NUMPY = (f"exec:{os.environ.get('TOUCHSTONE_PYTHON', '/usr/bin/python3')} "
         "-m touchstone_engine.examples.numpy_llama")
# (label, --backend, weights, profile or None, known-divergences file or None, models)
ENGINES = [
    ("reference", "reference", "full_precision", None, None, MODELS),
    ("cpu_simd", "cpu_simd", "full_precision", None, None, MODELS),
    ("cpu_simd", "cpu_simd", "quantized", None, None, MODELS),
    ("llamacpp (C API)", "llamacpp", "full_precision", None, LLAMACPP_KD, MODELS[:1]),
    ("llamacpp (C API)", "llamacpp", "quantized", "quantized_int8", LLAMACPP_KD, MODELS),
    ("NumPy engine (Python)", NUMPY, "full_precision", None, None, MODELS),
    ("llama-server -np 1 (HTTP)", "llama-server 1", "quantized", "quantized_int8", SERVER_KD,
     MODELS),
    ("llama-server -np 4 (HTTP)", "llama-server 4", "quantized", "quantized_int8", SERVER_KD,
     MODELS),
]


def llama_server():
    if os.environ.get("TOUCHSTONE_LLAMA_SERVER"):
        return os.environ["TOUCHSTONE_LLAMA_SERVER"]
    with open(os.path.join(ROOT, "ci/llamacpp"), encoding="utf-8") as f:
        ver = next(line.split("=", 1)[1].split()[0].strip('"') for line in f
                   if line.startswith("LCP_VERSION="))
    prefix = os.environ.get("TOUCHSTONE_LLAMACPP_PREFIX",
                            os.path.expanduser(f"~/.cache/touchstone/llama.cpp-{ver}"))
    return os.path.join(prefix, "bin/llama-server")


def gguf_of(model):
    with open(os.path.join(ROOT, "goldens/manifest.json"), encoding="utf-8") as f:
        m = next(x for x in json.load(f)["models"] if x["name"] == model)
    return os.path.join(MODEL_DIR, m["filename"])


def cell(row):
    if row is None:
        return "not run"
    verdict = {"PASS": "PASS", "FAIL": "**FAIL**", "KNOWN_DIVERGENCE": "KNOWN"}[row["verdict"]]
    if row["nmse_max"] == 0 and row["max_abs"] == 0 and not row.get("backend_error"):
        return f"{verdict}, bitwise"
    return f"{verdict}, NMSE {row['nmse_max']:.1e}, max \\|Δ\\| {row['max_abs']:.2g}"


def run(touchstone, backend, weights, profile, kd, model, plan, out_dir, env, reuse):
    name = f"{backend.split()[-1].split('.')[-1]}-{weights}-{model}".replace(":", "_")
    if backend.startswith("llama-server"):
        name = f"llama-server-np{backend.split()[1]}-{model}"
    path = os.path.join(out_dir, name + ".json")
    if reuse and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        if report.get("complete") and report["backend"].get("batching"):
            return report, []
    args = ["--weights", weights, "--model", model, "--serving-only", "--serving-plan", plan,
            "--threads", "1", "--json", path]
    cmd = [touchstone, "parity", "--backend", backend] + args
    if backend.startswith("llama-server"):
        cmd = [sys.executable, SERVER_WRAPPER, touchstone, llama_server(), gguf_of(model),
               os.path.join(out_dir, name), backend.split()[1], "--"] + args
    if profile:
        cmd += ["--profile", profile]
    if kd:
        cmd += ["--known-divergences", kd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode == 3 or not os.path.exists(path):  # UNSUPPORTED (or did not start)
        return None, p.stdout.strip().splitlines()[-1:] or [p.stderr.strip()[-200:]]
    with open(path, encoding="utf-8") as f:
        return json.load(f), []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build/default"))
    ap.add_argument("--plan", default="quick")
    ap.add_argument("--out")
    ap.add_argument("--reuse", action="store_true",
                    help="use a complete report of an earlier run in the reports folder")
    a = ap.parse_args()
    touchstone = os.path.join(a.build, "bin/touchstone")
    out_dir = os.path.join(a.build, "reports/serving-table")
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), LP_NUM_THREADS="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    lines = ["| engine | weights / profile | model | batching / fork | "
             + " | ".join(c.split(".")[1] for c in CHECKS) + " |",
             "|---|---|---|---|" + "---|" * len(CHECKS)]
    host = ""
    for label, backend, weights, profile, kd, models in ENGINES:
        for model in models:
            report, why = run(touchstone, backend, weights, profile, kd, model, a.plan, out_dir,
                               env, a.reuse)
            print(f"{label} {weights} {model}: {'done' if report else why}", file=sys.stderr)
            if report is None:
                continue
            info = report["backend"]
            host = host or info.get("device", "")
            rows = {r["name"]: r for r in report["cases"]}
            unsupported = {n.get("check", n.get("name", "")) if isinstance(n, dict) else n
                           for n in report.get("not_supported", [])}
            cells = ["NOT SUPPORTED" if c in unsupported else cell(rows.get(c)) for c in CHECKS]
            prof = report.get("profile", profile or "")
            mode = f"{info.get('batching', '?')} / {info.get('fork', '?')}"
            lines.append(f"| {label} | {weights} / {prof} | {model} | {mode} | "
                         + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if host:
        print(f"Device: {host}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
