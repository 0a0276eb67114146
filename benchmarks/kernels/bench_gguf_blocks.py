#!/usr/bin/env python
"""The GGUF block kernels per layer, beside torch's int4 kernel and oneDNN's bf16 linear.

One layer shape at a time, at 1-32 rows, each kernel cycling through copies of its weight that
together outsize the CPU's caches, as a model's layers do (a single copy would sit in the cache
and look several times faster than a decode step reads it): `probe.measure_quantized`, the very
measurement the engine's rows probe makes (random Q4_K blocks, or Q8_0 where rows are not whole
256-blocks). Shapes: the demo 1.5B's MLP layers (gate/up 8960x1536, down 1536x8960) and the
0.5B's (4864x896: Q8_0 blocks here; the model's own are Q5_0). Medians of every copy timed twice.

    python benchmarks/kernels/bench_gguf_blocks.py --json benchmarks/results/gguf-blocks/layers.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from tokenrouter.bench import machine_info
from tokenrouter.engine.quant import gguf_native, probe

SHAPES = [(8960, 1536), (1536, 8960), (4864, 896)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()
    lib, why = gguf_native.load()
    if lib is None:
        raise SystemExit(f"no GGUF block kernels here: {why}")
    rows = []
    for shape in SHAPES:
        t = probe.measure_quantized(shape, a.threads)
        for kernel, by_rows in t.items():
            rows.append({"shape": list(shape), "kernel": kernel, "ms": {int(r): v for r, v in by_rows.items()}})
        print(f"{shape[0]}x{shape[1]} (out x in), ms per call:", flush=True)
        for kernel, by_rows in t.items():
            print(f"  {kernel:9s} " + "  ".join(f"{r} rows {v:.3f}" for r, v in by_rows.items()), flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        out = {
            "command": "python benchmarks/kernels/"
            + " ".join(shlex.quote(x) for x in [Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": machine_info(),
            "threads": a.threads,
            "library": lib.path.name,
            "layers": rows,
        }
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)  # measure_quantized sets its own
    main()
