"""Step latency with oneDNN-packed linear layers against torch's default CPU linear, side by side.

    python benchmarks/kernels/bench_linear_kernels.py [--models small large] [--threads 1 2] [--repeats 3]

For each model of the demo pair (from the store) and each torch thread count, one engine per
kernel (`ModelSpec(onednn_linear=False)` then `None`) measures its step-latency profile
(`engine.profile(refresh=True)`, the median of --repeats per point, in the worker's thread) under
a throwaway store home, so the cached profiles are not touched. Prints a markdown table of the
step time per point and the ratio torch / oneDNN.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, store
from tokenrouter.autobatch import latency_profile
from tokenrouter.policies import Single


async def step_times(path, threads: int, onednn: bool | None, repeats: int) -> dict[tuple[int, int], float]:
    spec = ModelSpec(path=path, kv_cache_tokens=4096, onednn_linear=onednn)
    async with Engine(models={"m": spec}, policy=Single("m"), num_threads=threads) as engine:
        kernel = engine.info().models["m"].linear_kernel
        assert (kernel == "onednn") == (onednn is not False), f"asked onednn_linear={onednn}, got {kernel}"
        prof = (await engine.profile(refresh=True))["m"]
    return {(p.b, p.c): p.latency_s for p in prof.step_points}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["small", "large"], help="roles of the demo pair")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the raw step times here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    latency_profile.REPEATS = args.repeats
    demo = {role: store.locate_model(store.DEFAULT_MODELS[role]) for role in args.models}
    rows, raw = [], []
    with tempfile.TemporaryDirectory() as home:
        os.environ["TOKENROUTER_HOME"] = home  # profiles go here; the models are read by path
        for role in args.models:
            for threads in args.threads:
                t = anyio.run(step_times, demo[role], threads, False, args.repeats)
                o = anyio.run(step_times, demo[role], threads, None, args.repeats)
                for point in sorted(t):
                    rows.append((role, threads, point, t[point], o[point]))
                    raw.append(
                        {
                            "model": role,
                            "threads": threads,
                            "b": point[0],
                            "c": point[1],
                            "torch_s": t[point],
                            "onednn_s": o[point],
                        }
                    )
                print(f"{role}, {threads} thread(s): done", flush=True)
    print("| model | threads | decode rows | catch-up tokens | torch (s) | oneDNN (s) | torch / oneDNN |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for role, threads, (b, c), t, o in rows:
        print(f"| {role} | {threads} | {b} | {c} | {t:.3f} | {o:.3f} | {t / o:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
