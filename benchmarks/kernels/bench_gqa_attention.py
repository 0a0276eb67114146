#!/usr/bin/env python
"""Decode attention on CPU, grouped-query heads: SDPA's `enable_gqa` against the torch backend's
`grouped_sdpa` (each KV head's query heads as its rows), on the demo 1.5B's heads (12 query,
2 KV, 128 wide), in bf16 and float32, at 1, 4 and 16 decode rows. Median of 5 repeats of 200
calls each, after a warm-up; 2 threads.

    python benchmarks/kernels/bench_gqa_attention.py --json benchmarks/results/gqa-attention/gqa.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tokenrouter.bench import machine_info
from tokenrouter.engine.attention.torch_paged import grouped_sdpa

HEADS, KV_HEADS, DIM = 12, 2, 128
QUICK = {"calls": 1, "repeats": 1, "warmup": 0}  # --quick: every case once, a smoke test's timing


def per_call_us(f, calls: int = 200, repeats: int = 5, warmup: int = 20) -> float:
    for _ in range(warmup):
        f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def main(args) -> None:
    torch.set_num_threads(2)
    t = QUICK if args.quick else {}
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for batch, context in ((1, 160), (1, 512), (4, 256), (16, 256)):
            q = torch.randn(batch, HEADS, 1, DIM, dtype=dtype)
            k, v = (torch.randn(batch, KV_HEADS, context, DIM, dtype=dtype) for _ in range(2))
            mask = torch.ones(batch, 1, 1, context, dtype=torch.bool)
            mask[..., context - 10 :] = False
            sdpa = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), **t)
            grouped = per_call_us(lambda: grouped_sdpa(q, k, v, mask, DIM**-0.5), **t)
            rows.append(
                {
                    "dtype": str(dtype)[6:],
                    "rows": batch,
                    "context": context,
                    "enable_gqa_us": sdpa,
                    "grouped_us": grouped,
                    "speedup": sdpa / grouped,
                }
            )
            print(
                f"{rows[-1]['dtype']} rows={batch} context={context}: "
                f"enable_gqa {sdpa:.0f} us, grouped {grouped:.0f} us"
            )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="every case called once (a smoke test, not a measurement)")
    main(p.parse_args())
