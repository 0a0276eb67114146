#!/usr/bin/env python
"""Paged attention on CPU, one layer's call: torch's backend (SDPA over gathered contexts) against
the C kernel (engine/attention/cpu_paged.py), on the demo 1.5B's heads (12 query, 2 KV, 128 wide),
in bf16 and float32, for the steps the engine runs: decode rows (1, 4, 16), a verifier's check
(16 rows of 5 tokens) and a prefill. The K/V of the step are written into the cache in both (the
backends' own `forward`). Median of 5 repeats after a warm-up; 2 threads.

    python benchmarks/kernels/bench_cpu_attention.py --json benchmarks/results/cpu-attention/attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.kernels.bench_gqa_attention import QUICK, per_call_us
from tokenrouter.bench import machine_info
from tokenrouter.engine.attention import cpu_paged
from tokenrouter.engine.attention.cpu_paged import CpuPagedAttention
from tokenrouter.engine.attention.torch_paged import TorchPagedAttention
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.testing.paged_steps import consecutive_tables, step_metadata

HEADS, KV_HEADS, DIM, BLOCK = 12, 2, 128, 16
STEPS = {  # name: rows as (tokens cached, new tokens)
    "decode 1 x 256": [(255, 1)],
    "decode 1 x 1024": [(1023, 1)],
    "decode 4 x 256": [(255, 1)] * 4,
    "decode 16 x 256": [(255, 1)] * 16,
    "check 16 x 5 at 256": [(251, 5)] * 16,
    "prefill 512": [(0, 512)],
}


def main(args) -> None:
    torch.set_num_threads(2)
    kernel, why = cpu_paged.load()
    if kernel is None:
        raise SystemExit(f"no C attention kernel on this machine: {why}")
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        cache = KVCache(KVLayout(1, KV_HEADS, DIM, dtype), 2048 * 16 // BLOCK, BLOCK, torch.device("cpu"))
        for t in (*cache.k, *cache.v):
            t.copy_(torch.randn(t.shape))
        backends = {"torch": TorchPagedAttention(cache), "c_kernel": CpuPagedAttention(cache, kernel)}
        for name, rows in STEPS.items():
            meta = step_metadata(rows, consecutive_tables(rows, BLOCK), BLOCK)
            n = meta.slot_mapping.numel()
            q = torch.randn(n, HEADS, DIM, dtype=dtype)
            k, v = (torch.randn(n, KV_HEADS, DIM, dtype=dtype) for _ in range(2))
            calls = 20 if n > 64 else 200
            row = {"dtype": str(dtype)[6:], "step": name}
            for label, backend in backends.items():
                backend.plan(meta)
                timing = QUICK if args.quick else {"calls": calls}
                row[f"{label}_us"] = per_call_us(lambda: backend.forward(0, q, k, v, meta, DIM**-0.5, None), **timing)
            row["c_kernel_speedup"] = row["torch_us"] / row["c_kernel_us"]
            out.append(row)
            print(f"{row['dtype']:8} {name:22} torch {row['torch_us']:8.0f} us  C kernel {row['c_kernel_us']:8.0f} us")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": machine_info(), "kernel_level": kernel.level, "rows": out}
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="every step called once (a smoke test, not a measurement)")
    main(p.parse_args())
