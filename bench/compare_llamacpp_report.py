#!/usr/bin/env python3
"""compare_llamacpp_report.py [--gpu GPU] WORK ROUNDS THREADS LCP_VERSION MODEL CPU_MODEL ISA BUILD_INFO

The table of bench/compare-llamacpp from its interleaved rounds: WORK holds
llama.<r>.json (llama-bench -o json), ours.<r>.json and int8.<r>.json (Google
Benchmark JSON of touchstone_bench) for r = 1..ROUNDS. Per figure: median over
the rounds, spread = (max - min) / median, and the ratio of the medians (ours /
llama.cpp). A missing or malformed file is an error naming it.

--gpu GPU (bench/compare-llamacpp --cuda): the GPU comparison. GPU is the
device line the script took from nvidia-smi (name, driver, memory, CUDA
version); the report heads with it and llama-bench's GPU, backends and
settings (layers offloaded, flash attention, KV cache types), leaves out the
thread count and the bandwidth columns, and is an error when llama-bench did
not run on CUDA (its "backends" field) or offloaded no layer. Standard library only.
"""
import argparse
import json
import os
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"compare-llamacpp: {path}: {e}")


def summary(xs):
    med = statistics.median(xs)
    spread = (max(xs) - min(xs)) / med if med > 0 else float("nan")
    return med, spread


def collect(work, rounds):
    lc = {"pp": [], "tg": []}
    ours, membw, devices, meta, by_type = {}, [], {}, None, ""
    for r in range(1, rounds + 1):
        llama = load(os.path.join(work, f"llama.{r}.json"))
        meta = meta or llama[0]
        for row in llama:
            lc["pp" if row["n_prompt"] > 0 else "tg"].append(row["avg_ts"])
        for kind in ("ours", "int8"):
            path = os.path.join(work, f"{kind}.{r}.json")
            if kind == "int8" and not os.path.exists(path):
                continue
            j = load(path)
            for k, v in j.get("context", {}).items():
                if k == "bytes_per_token_by_type_MB":
                    by_type = v
                if k.startswith("device."):
                    devices[k[7:] + (" (int8 activations)" if kind == "int8" else "")] = v
            for b in j["benchmarks"]:
                name = b["run_name"]
                if kind == "int8":
                    name = name.replace("cpu_simd/quantized/", "cpu_simd/quantized+int8act/")
                if name.startswith("membw"):
                    membw.append(b.get("bytes_per_second", 0.0))
                elif b.get("tok/s") is not None:
                    ours.setdefault(name, []).append((b["tok/s"], b.get("bytes/token")))
    return lc, ours, membw, devices, meta, by_type


def l3_bytes(line):
    """Bytes of an lscpu cache line such as 'L3 cache 32 MiB (1 instance)'."""
    import re
    m = re.search(r"([0-9.]+)\s*([KMG])i?B", line)
    if not m:
        return float("inf")
    return float(m.group(1)) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def check_gpu_run(work, rounds):
    """Every llama-bench row of a --gpu report ran on CUDA with layers offloaded."""
    for r in range(1, rounds + 1):
        for row in load(os.path.join(work, f"llama.{r}.json")):
            backends = str(row.get("backends", ""))
            if "CUDA" not in backends.upper():
                sys.exit(f"compare-llamacpp: llama.{r}.json: llama-bench ran on "
                         f"{backends or 'no named backend'}, not CUDA (is it the GGML_CUDA build?)")
            if row.get("n_gpu_layers", 1) == 0:
                sys.exit(f"compare-llamacpp: llama.{r}.json: llama-bench offloaded no layer "
                         "(n_gpu_layers 0)")


def main():
    ap = argparse.ArgumentParser(description="bench/compare-llamacpp's report")
    ap.add_argument("--gpu", help="GPU mode: the device line (name, driver, CUDA version)")
    ap.add_argument("--caches", default="", help="the host's caches, lscpu's lines joined by ';'")
    for name in ("work", "rounds", "threads", "version", "model", "cpu", "isa", "build_info"):
        ap.add_argument(name)
    a = ap.parse_args()
    work, threads, version, model, cpu, isa = a.work, a.threads, a.version, a.model, a.cpu, a.isa
    rounds = int(a.rounds)
    gpu = a.gpu is not None
    if gpu:
        check_gpu_run(work, rounds)
    lc, ours, membw, devices, meta, by_type = collect(work, rounds)
    info = dict(l.split("=", 1) for l in open(a.build_info).read().splitlines() if "=" in l)
    if gpu:
        print(f"GPU: {a.gpu}; host CPU: {cpu}; {rounds} interleaved rounds")
    else:
        print(f"host: {cpu}; ISA: {isa.strip()}; {threads} threads; {rounds} interleaved rounds")
        if a.caches:
            print(f"caches: {a.caches.replace(';', '; ')}")
    print(f"model: {model} ({os.path.getsize(model) / 1e6:.1f} MB)")
    print(f"llama.cpp: llama-cpp-python {version} vendor, build {meta.get('build_commit', '?')}, "
          f"{meta.get('backends', '?')}; built by ci/llamacpp in {info.get('build_seconds', '?')} s "
          f"with {info.get('compiler', '?')}")
    if gpu:
        print(f"llama.cpp: GPU {meta.get('gpu_info', '?')}, CUDA architectures "
              f"{info.get('cuda_archs', '?')}, {info.get('nvcc', 'nvcc ?')}; llama-bench "
              f"n_gpu_layers {meta.get('n_gpu_layers', '?')}, flash_attn "
              f"{meta.get('flash_attn', '?')}, KV {meta.get('type_k', '?')}/"
              f"{meta.get('type_v', '?')}, n_ubatch {meta.get('n_ubatch', '?')}")
    for name, dev in sorted(devices.items()):
        print(f"ours: {name}: {dev}")
    pp, pp_s = summary(lc["pp"])
    tg, tg_s = summary(lc["tg"])
    print(f"\nllama.cpp pp256 median {pp:8.1f} tok/s (spread {pp_s:5.1%})   "
          f"tg64 median {tg:8.1f} tok/s (spread {tg_s:5.1%})")
    bw = statistics.median(membw) if membw else None
    print(f"\n{'ours (median of rounds)':44s} {'tok/s':>9s} {'spread':>7s} {'llama.cpp':>9s} "
          f"{'ratio':>7s} {'spread/lc':>9s}" + (f" {'of BW bound':>11s}" if bw else ""))
    for name, vals in sorted(ours.items()):
        if "prefill/256" in name:
            ref, ref_s = pp, pp_s
        elif "decode/ctx:0" in name:
            ref, ref_s = tg, tg_s
        else:
            continue
        med, s = summary([v[0] for v in vals])
        bound = ""
        bpt = vals[0][1]
        if "decode" in name and bw and bpt:
            bound = f"{med / (bw / bpt):11.1%}"
        rel = f"{s / ref_s:8.2f}x" if ref_s > 0 else "      n/a"
        print(f"{name:44s} {med:9.1f} {s:7.1%} {ref:9.1f} {med / ref:6.2f}x {rel} {bound}".rstrip())
    bpt = next((v[0][1] for n, v in sorted(ours.items()) if "decode" in n and v[0][1]), None)
    if bw and bpt and not gpu:
        print(f"{'llama.cpp tg64':44s} {tg:9.1f} {'':7s} {'':9s} {'':7s} {'':9s} "
              f"{tg / (bw / bpt):11.1%}")
    if bw:
        print(f"\nread bandwidth ({threads} threads, median of {len(membw)}): {bw / 1e9:.1f} GB/s; "
              "decode bound = bandwidth / bytes streamed per token"
              + (f" ({bpt / 1e6:.1f} MB: {by_type.replace(',', ', ')} MB by tensor type)"
                 if bpt and by_type else ""))
        l3 = next((c for c in a.caches.split(";") if c.startswith("L3 ")), "")
        if bpt and l3:
            print(f"decode streams {bpt / 1e6:.0f} MB per token against {l3}: "
                  + ("memory-bound (the weights do not fit in L3)" if bpt > l3_bytes(l3)
                     else "the weights fit in L3 (decode runs from cache)"))
    if gpu:
        print("ratio: median of ours / median of llama.cpp over the same rounds (decode/ctx:0 "
              "against tg64, prefill/256 against pp256); spread/lc: our spread over llama.cpp's")
    else:
        print("ratio: median of ours / median of llama.cpp over the same rounds; spread/lc: our "
              "spread over llama.cpp's (the #15 target is <= 2x)")


if __name__ == "__main__":
    main()
