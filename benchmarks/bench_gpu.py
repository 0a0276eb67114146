#!/usr/bin/env python
"""The GPU benchmark: the single-model and routed comparisons on one GPU with two models, ~10 min.

Runs, one after the other, each in a fresh process (a fresh CUDA context):

  1. bench_single.py on the large model: this engine (flashinfer, CUDA graphs) against Hugging
     Face `generate` and transformers' continuous batching, C = 1 and 16.
  2. bench_routing.py on the pair, both models on the same GPU, each worker on its own CUDA
     stream: RStitch through this engine against standard serving (with and without prefix
     caching) and lockstep, C = 1, 4 and 16.
  3. The engine alone with CUDA graphs off (`cuda_graph_max_batch=0`), C = 16, for the graphs' share.

    python benchmarks/bench_gpu.py                                  # demo pair from the store
    python benchmarks/bench_gpu.py --small DIR --large DIR
    python benchmarks/bench_gpu.py --random-weights                 # no weights at hand: the demo
        # pair's shapes and tokenizer with random weights (speed only; routing is then arbitrary)

Every table goes to stdout and, with the commands, to --out (default bench_out/gpu/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent

# Qwen2.5-Coder-0.5B/1.5B-Instruct's shapes (the demo pair), for --random-weights.
DEMO_SHAPES = {
    "small": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, tie_word_embeddings=True),
    "large": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, tie_word_embeddings=True),
}  # fmt: skip


def random_pair(root: Path, tokenizer_dir: Path | None) -> dict[str, str]:
    """The demo pair's architecture with random bfloat16 weights; the tokenizer from tokenizer_dir
    (the demo pair's, 151,936 tokens) or a small one built here."""
    import torch
    from transformers import AutoTokenizer

    from tokenrouter.testing import build_tiny_model, build_tokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True) if tokenizer_dir else build_tokenizer()
    paths = {}
    for i, (name, shape) in enumerate(DEMO_SHAPES.items()):
        paths[name] = str(build_tiny_model(
            root / name, "qwen2", dtype=torch.bfloat16, seed=i, tokenizer=tok, logit_scale=8.0,
            max_position_embeddings=32768, **shape,
        ))  # fmt: skip
    return paths


def demo_pair() -> dict[str, str]:
    from tokenrouter.store import ensure_model

    return {"small": str(ensure_model("qwen-coder-0.5b")), "large": str(ensure_model("qwen-coder-1.5b"))}


def run(cmd: list[str], log: Path) -> tuple[int, float]:
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        rc = proc.wait()
    return rc, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small")
    p.add_argument("--large")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--tokenizer", type=Path, default=None, help="with --random-weights: a tokenizer directory")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench_out/gpu"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if args.random_weights:
        models = random_pair(args.out / "random-pair", args.tokenizer)
    elif args.small and args.large:
        models = {"small": args.small, "large": args.large}
    else:
        models = demo_pair()
    import torch

    gpu = torch.cuda.get_device_name(args.device) if torch.cuda.is_available() else "no CUDA device"
    print(f"# {gpu}; models {models}", flush=True)
    steps = {
        "single": [py, str(HERE / "bench_single.py"), "--model", models["large"], "--device", args.device,
                   "--concurrency", "1", "16", "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
                   "--json", str(args.out / "single.json")],
        "routed": [py, str(HERE / "bench_routing.py"), "--small", models["small"], "--large", models["large"],
                   "--device", args.device, "--tau", str(args.tau), "--max-tokens", str(args.max_tokens),
                   "--repeats", str(args.repeats), "--json", str(args.out / "routed.json")],
        "eager": [py, str(HERE / "bench_routing.py"), "--small", models["small"], "--large", models["large"],
                  "--device", args.device, "--tau", str(args.tau), "--max-tokens", str(args.max_tokens),
                  "--repeats", str(args.repeats), "--systems", "routed", "--concurrency", "16",
                  "--cuda-graph-max-batch", "0", "--json", str(args.out / "routed-eager.json")],
    }  # fmt: skip
    summary = {"gpu": gpu, "models": models, "steps": {}}
    for name, cmd in steps.items():
        rc, wall = run(cmd, args.out / f"{name}.log")
        summary["steps"][name] = {"command": shlex.join(cmd), "rc": rc, "wall_s": round(wall, 1)}
        print(f"# {name}: exit {rc}, {wall:.0f} s", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return max(s["rc"] for s in summary["steps"].values())


if __name__ == "__main__":
    sys.exit(main())
