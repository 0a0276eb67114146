#!/usr/bin/env python
"""Memory at load: the peak RSS while an engine loads its models, against the RSS it then holds.

Each configuration runs in a fresh process: it starts an Engine on the given models (the demo
pair by default), records VmHWM (the process's peak resident set) and VmRSS once every worker
is ready, serves one short greedy request, and reports both. A 16 GB laptop must be able to
start the default pair, so the peak should stay within 10% of what the engine holds afterwards.

    python benchmarks/engine/bench_load_memory.py --out benchmarks/results/load_memory/load_memory.json
    python benchmarks/engine/bench_load_memory.py --onednn false      # torch's linear layers
    python benchmarks/engine/bench_load_memory.py --precision gguf gguf+bf16 bfloat16 float32 --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokenrouter import store

CHILD = r"""
import json, sys, anyio, torch
from tokenrouter import Engine, ModelSpec, SamplingParams, store
from tokenrouter.policies import RStitch

def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

from tokenrouter.api.setup import spec_in_precision

onednn = {"auto": None, "true": True, "false": False}[sys.argv[1]]
precision = sys.argv[2]
models = {
    m: spec_in_precision(store.model_dir(store.DEFAULT_MODELS[m]), precision, onednn_linear=onednn)
    for m in ("small", "large")
}
torch.set_num_threads(1)

async def main():
    before = vm("VmRSS")
    async with Engine(models=models, policy=RStitch(tau=0.03)) as e:
        ready = {"peak": vm("VmHWM"), "rss": vm("VmRSS")}
        out = await e.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=8))
        served = {"peak": vm("VmHWM"), "rss": vm("VmRSS")}
        kv = {m: s.kv_cache_bytes for m, s in e.stats().items()}
        loaded = {m: {"precision": l.precision, "linear_kernel": l.linear_kernel} for m, l in e.info().models.items()}
    print(json.dumps({"before_bytes": before, "ready": ready, "served": served, "kv_cache_bytes": kv,
                      "tokens": len(out.token_ids), "loaded": loaded}))

anyio.run(main)
"""


def run(onednn: str, precision: str, tree: Path | None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, onednn, precision],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    rec["peak_over_steady"] = rec["ready"]["peak"] / rec["served"]["rss"]
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onednn", nargs="+", choices=("auto", "true", "false"), default=["auto"])
    p.add_argument(
        "--precision",
        nargs="+",
        choices=("auto", "float32", "bfloat16", "gguf", "gguf+bf16"),
        default=["auto"],
        help="what the models compute in, as the command line's --precision (default auto: gguf+bf16 for store models)",
    )
    p.add_argument("--tree", type=Path, default=None, help="run a checkout's package instead of the installed one")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--cold-kernels",
        action="store_true",
        help="empty the store's kernel cache (<home>/kernels) first: the first gguf run builds the kernels, "
        "later ones read them",
    )
    args = p.parse_args()
    kernels_dir = store.home_dir() / "kernels"
    if args.cold_kernels:
        shutil.rmtree(kernels_dir, ignore_errors=True)
    rows = {}
    for precision in args.precision:
        for onednn in args.onednn:
            name = f"precision={precision} onednn_linear={onednn}"
            name += f" (run {sum(k.startswith(name) for k in rows) + 1})" if name in rows else ""
            cached = sorted(f.name for f in kernels_dir.glob("*.safetensors")) if kernels_dir.is_dir() else []
            rec = rows[name] = run(onednn, precision, args.tree)
            rec["kernel_cache_before"] = cached  # the store's built GGUF kernels when the run started
            gb = 1e9
            print(
                f"{name}: peak at load {rec['ready']['peak'] / gb:.2f} GB, steady "
                f"{rec['served']['rss'] / gb:.2f} GB (peak/steady {rec['peak_over_steady']:.3f}), {rec['seconds']} s",
                file=sys.stderr,
            )
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "models": "the demo pair (Qwen2.5-Coder-0.5B/1.5B-Instruct, Q4_K_M GGUF); what each computes in: "
        "runs[...].loaded",
        "tree": "installed" if args.tree is None else "a checkout",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
