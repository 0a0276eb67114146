#!/usr/bin/env python
"""The engine's C kernels at every CPU level this machine runs, side by side: the GGUF block
kernels on the demo pair's layer shapes and types, and the attention kernel on a decode step, a
speculative check and a step of many decode rows.

Each level's libraries are built as TOKENROUTER_CPU_LEVEL builds them (native/cpu.py: plain C,
AVX2 + FMA + F16C, AVX512 VNNI) into a folder of their own, and called through the same bindings
the engine uses. A block kernel's call cycles through copies of its weight that together outsize
the CPU's caches (as a model's layers do: a decode step reads each weight from memory); an
attention call likewise through copies of its KV cache. Per shape and rows the levels alternate
call by call, each timed --rounds times; the tables show medians, and each level's time over the
highest level's.

    python benchmarks/kernels/bench_cpu_levels.py --json benchmarks/results/cpu-levels/kernels.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from tokenrouter.bench import machine_info
from tokenrouter.engine import native
from tokenrouter.engine.attention import cpu_paged
from tokenrouter.engine.quant import gguf_native, probe

# (type, out, in): the demo 1.5B's gate/up and down, its q/o, its head; the 0.5B's gate/up and head
LAYERS = [
    ("Q4_K", 8960, 1536),
    ("Q6_K", 1536, 8960),
    ("Q4_K", 1536, 1536),
    ("Q6_K", 151936, 1536),
    ("Q5_0", 4864, 896),
    ("Q8_0", 151936, 896),
]
ROWS = (1, 4, 16)
WORKING_SET = 256 << 20
# (name, rows as (context, new tokens), heads, KV heads): the demo 1.5B's attention, float16 KV
ATTENTION = [
    ("decode", [(511, 1)], 12, 2),
    ("check of 4", [(600, 4)], 12, 2),
    ("16 decode rows", [(300 + 45 * i, 1) for i in range(16)], 12, 2),
]
HEAD_DIM, BLOCK = 128, 16


def built(levels: list[str], folder: Path) -> tuple[dict, dict]:
    """level -> (GGUF library, attention kernel), each built for its level."""
    gguf, attention = {}, {}
    for level in levels:
        at = native.cpu.at(level)
        path = native.build.build(gguf_native.SOURCES, folder / level, at)
        gguf[level] = gguf_native.bind(ctypes.CDLL(str(path)), path)
        path = native.build.build(cpu_paged.SOURCES, folder / level, at)
        attention[level] = cpu_paged.bind(ctypes.CDLL(str(path)), path)
    return gguf, attention


def interleaved(calls: dict, rounds: int) -> dict:
    """name -> median seconds of calls[name](), the names alternating call by call."""
    times: dict = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def block_kernels(libs: dict, rounds: int) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for kind, n, k in LAYERS:
        blocks = probe.random_blocks(kind, (n, k), gen)
        copies = max(1, WORKING_SET // blocks.numel())
        weights = {lv: [gguf_native.repack(lb, kind, blocks, (n, k)) for _ in range(copies)] for lv, lb in libs.items()}
        for rows in ROWS:
            x = torch.randn(rows, k, generator=gen)

            def call(lv, x=x):
                return lambda: [gguf_native.matmul(libs[lv], kind, w, (n, k), x, packed=True) for w in weights[lv]]

            ms = {lv: 1e3 * t / copies for lv, t in interleaved({lv: call(lv) for lv in libs}, rounds).items()}
            out.append({"kind": kind, "shape": [n, k], "rows": rows, "ms": ms})
            print(f"{kind} {n}x{k} {rows} rows: " + "  ".join(f"{lv} {v:.3f} ms" for lv, v in ms.items()), flush=True)
        weights.clear()  # before the next shape's copies
    return out


def attention_kernels(kernels: dict, rounds: int) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(1)
    for name, rows, heads, kv_heads in ATTENTION:
        need = [-(-(c + t) // BLOCK) for c, t in rows]
        order = torch.randperm(sum(need), generator=gen).tolist()  # each row's blocks scattered over the pool
        tables, at = [], 0
        for m in need:
            tables.append(order[at : at + m])
            at += m
        slots = sum(need) * BLOCK * kv_heads * HEAD_DIM * 2 * 2  # K and V, float16
        copies = max(1, (64 << 20) // slots)
        caches = [
            [torch.randn(sum(need) * BLOCK, kv_heads, HEAD_DIM, generator=gen).half() for _ in range(2)]
            for _ in range(copies)
        ]
        tokens = sum(t for _, t in rows)
        q = torch.randn(tokens, heads, HEAD_DIM, generator=gen)
        token_row = torch.tensor([r for r, (_, t) in enumerate(rows) for _ in range(t)], dtype=torch.int32)
        token_keys = torch.tensor([c + i + 1 for c, t in rows for i in range(t)], dtype=torch.int32)
        width = max(need)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        outs = torch.empty(tokens, heads, HEAD_DIM)

        def call(lv):
            def run():
                for k, v in caches:
                    rc = kernels[lv].attention(
                        *(q.data_ptr(), q.stride(0), q.stride(1), outs.data_ptr(), 0),
                        *(k.data_ptr(), v.data_ptr(), 2, sum(need)),
                        *(tokens, heads, kv_heads, HEAD_DIM),
                        *(token_row.data_ptr(), token_keys.data_ptr(), table.data_ptr(), len(rows), width, BLOCK),
                        *(0, HEAD_DIM**-0.5, torch.get_num_threads()),
                    )
                    assert rc == 0

            return run

        us = {lv: 1e6 * t / copies for lv, t in interleaved({lv: call(lv) for lv in kernels}, rounds).items()}
        out.append({"step": name, "rows": rows, "heads": heads, "kv_heads": kv_heads, "us": us})
        print(f"attention, {name}: " + "  ".join(f"{lv} {v:.0f} us" for lv, v in us.items()), flush=True)
    return out


def table(kernels: list[dict], attention: list[dict], levels: list[str]) -> str:
    top = levels[-1]
    head = " | ".join(levels) + " | " + " | ".join(f"{lv} / {top}" for lv in levels[:-1])
    lines = [f"| GGUF block kernel | rows | {head} |", "|---|---:|" + "---:|" * (2 * len(levels) - 1)]
    for r in kernels:
        ms = r["ms"]
        cells = [f"{ms[lv]:.3f} ms" for lv in levels] + [f"{ms[lv] / ms[top]:.2f}" for lv in levels[:-1]]
        lines.append(f"| {r['kind']} {r['shape'][0]}x{r['shape'][1]} | {r['rows']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"| attention (12/2 heads, dim 128, float16 KV) | {head} |",
        "|---|" + "---:|" * (2 * len(levels) - 1),
    ]
    for r in attention:
        us = r["us"]
        cells = [f"{us[lv]:.0f} us" for lv in levels] + [f"{us[lv] / us[top]:.2f}" for lv in levels[:-1]]
        lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--levels", nargs="+", default=native.cpu.runnable(), help="default: every level this CPU runs")
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        libs, kernels = built(a.levels, Path(tmp))
        blocks = block_kernels(libs, a.rounds)
        attention = attention_kernels(kernels, a.rounds)
    text = table(blocks, attention, a.levels)
    print(text)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        body = {
            "command": "python benchmarks/kernels/" + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": machine_info(),
            "threads": a.threads,
            "levels": a.levels,
            "block_kernels": blocks,
            "attention": attention,
            "table": text,
        }
        Path(a.json).write_text(json.dumps(body, indent=1) + "\n")


if __name__ == "__main__":
    main()
