#!/usr/bin/env python
"""The GPU benchmark: the single-model and routed comparisons on one GPU with two models.

Runs, one after the other, each in a fresh process (a fresh CUDA context), the steps asked for:

  decode  bench_decode_step.py: one decode step of each model at B = 1, 16 and 64 (CUDA-graph replay,
          eager flashinfer, transformers' forward with SDPA) against the memory floor.
  routed  bench_routing.py on the pair, both models on the same GPU, each worker on its own CUDA
          stream: routing through this engine against standard serving (with and without prefix
          caching) and lockstep, C = 1, 4 and 16.
  single  bench_single.py on the large model: this engine (flashinfer, CUDA graphs) against Hugging
          Face `generate` and transformers' continuous batching, C = 1 and 16.
  eager   the routed engine with CUDA graphs off (`cuda_graph_max_batch=0`), C = 16: the graphs' share.
  fa3     the routed engine at C = 16 with prefill on FA3 (the other steps keep what --prefill-backend says).

    python benchmarks/engine/bench_gpu.py                                  # demo pair from the store
    python benchmarks/engine/bench_gpu.py --small DIR --large DIR
    python benchmarks/engine/bench_gpu.py --random-weights                 # no weights at hand: the demo
        # pair's shapes and tokenizer with random weights (speed only; the routed system then runs
        # ScriptedRouter at the real pair's measured large-model share and hand-off rate)
    python benchmarks/engine/bench_gpu.py --random-weights --quick         # the GPU kit's reduced form (below)

--quick is what the GPU kit runs (docs/gpu.md), one step per call: levels C = 16, 64 and 1 in that order,
64 tokens per request, one repeat, decode steps up to 64 rows on CUDA graphs; the single-model step against
HF `generate` only; the routed step with every system at one level before the next (routed, standard
serving with prefix caching, lockstep, the large model alone; --order levels, every engine loaded once), its
JSON rewritten after each run, so a cut loses the last level, not the baselines. --steps runs some steps
only, --step-timeout caps each, --prepare only writes the random-weight pair (the kit does that while it
checks the GPU), --tiny makes that pair tiny (a CPU smoke of the same commands). --prefill-backend fa2
keeps every engine's prefill on flashinfer's FA2 kernels (ModelSpec.prefill_backend).

Every table goes to stdout and, with the commands, to --out (default bench_out/gpu/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent

# Qwen2.5-Coder-0.5B/1.5B-Instruct's shapes (the demo pair), for --random-weights.
DEMO_SHAPES = {
    "small": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "large": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
}


def random_pair(root: Path, tokenizer_dir: Path | None, tiny: bool = False) -> dict[str, str]:
    """The demo pair's architecture with random bfloat16 weights; the tokenizer from tokenizer_dir
    (the demo pair's, 151,936 tokens) or a small one built here. `tiny`: small shapes instead (a CPU
    smoke). A pair already written under `root` (by --prepare) is reused."""
    import torch
    from transformers import AutoTokenizer

    from tokenrouter.testing import build_tiny_model, build_tokenizer

    paths = {name: root / name for name in DEMO_SHAPES}
    if all((p / ".complete").is_file() for p in paths.values()):
        return {name: str(p) for name, p in paths.items()}
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True) if tokenizer_dir else build_tokenizer()
    for i, (name, shape) in enumerate(DEMO_SHAPES.items()):
        shape = {"num_hidden_layers": 2 + 2 * i} if tiny else dict(max_position_embeddings=32768, **shape)
        build_tiny_model(paths[name], "qwen2", dtype=torch.bfloat16, seed=i, tokenizer=tok, logit_scale=8.0, **shape)
        (paths[name] / ".complete").write_text("")
    return {name: str(p) for name, p in paths.items()}


STEPS = ("decode", "routed", "single", "eager", "fa3")


def demo_pair() -> dict[str, str]:
    from tokenrouter.store import ensure_model

    return {"small": str(ensure_model("qwen-coder-0.5b")), "large": str(ensure_model("qwen-coder-1.5b"))}


def _kill_step_on_term(proc: subprocess.Popen) -> None:
    """Killed from outside (timeout(1) sends SIGTERM), take the step's process group along: it runs in a
    session of its own, which nothing else would end."""

    def handler(signum, frame):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run(cmd: list[str], log: Path, timeout: float | None = None) -> tuple[int, float]:
    """Run one step, its output to stdout and `log`; past `timeout` seconds its whole process group is
    killed and the exit status is 124 (as timeout(1) says)."""
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    expired = threading.Event()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        _kill_step_on_term(proc)

        def kill():
            expired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill) if timeout else None
        if timer:
            timer.start()
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        rc = proc.wait()
        if timer:
            timer.cancel()
    if expired.is_set():
        print(f"# killed after {timeout:.0f} s (--step-timeout)", flush=True)
        rc = 124
    return rc, time.perf_counter() - t0


def pair_arguments(p: argparse.ArgumentParser) -> None:
    """The pair's options, shared with bench_decode_step.py: paths, or the demo pair's shapes at random."""
    p.add_argument("--small")
    p.add_argument("--large")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--tokenizer", type=Path, default=None, help="with --random-weights: a tokenizer directory")
    p.add_argument("--tiny", action="store_true", help="with --random-weights: tiny shapes (a CPU smoke)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_arguments(p)
    p.add_argument(
        "--pair-dir", type=Path, default=None, help="with --random-weights: where the pair is (default OUT/random-pair)"
    )
    p.add_argument("--prepare", action="store_true", help="only write the random-weight pair, then exit")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument(
        "--prefill-backend",
        choices=["auto", "fa2", "fa3"],
        default="auto",
        help="flashinfer's prefill kernels in every engine (ModelSpec.prefill_backend): fa2 where FA3 did not build",
    )
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument(
        "--router",
        choices=["rstitch", "scripted"],
        default=None,
        help="the routed system's policy: RStitch(tau), or ScriptedRouter at the demo pair's measured share and "
        "hand-off rate (the default with --random-weights, whose entropy is arbitrary)",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 128; --quick 64)")
    p.add_argument("--repeats", type=int, default=None, help="measured runs per level (default 2; --quick 1)")
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help="levels of the single and routed steps (default: 1 16 and 1 4 16; --quick 16 64 1)",
    )
    p.add_argument(
        "--cuda-graph-max-batch",
        type=int,
        default=None,
        help="decode steps up to this size replay CUDA graphs in the routed and single steps (--quick: 64)",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="the decode step's batch sizes")
    p.add_argument("--single-systems", nargs="+", default=None, help="bench_single.py --systems (default: all)")
    p.add_argument("--routed-systems", nargs="+", default=None, help="bench_routing.py --systems (default: all)")
    p.add_argument("--eager-concurrency", type=int, default=16, help="the level of the step without CUDA graphs")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    p.add_argument("--step-timeout", type=float, default=None, help="kill a step after this many seconds")
    p.add_argument("--quick", action="store_true", help="the GPU kit's reduced form (see above)")
    p.add_argument("--out", type=Path, default=Path("bench_out/gpu"))
    args = p.parse_args()
    if args.quick:
        args.concurrency = args.concurrency or [16, 64, 1]
        args.max_tokens, args.repeats = args.max_tokens or 64, args.repeats or 1
        args.single_systems = args.single_systems or ["engine", "hf_generate"]
        args.routed_systems = args.routed_systems or ["routed", "standard+pc", "lockstep", "large"]
        if args.cuda_graph_max_batch is None:
            args.cuda_graph_max_batch = max(64, *args.concurrency)
    args.max_tokens, args.repeats = args.max_tokens or 128, args.repeats or 2
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if args.random_weights:
        models = random_pair(args.pair_dir or args.out / "random-pair", args.tokenizer, args.tiny)
    elif args.small and args.large:
        models = {"small": args.small, "large": args.large}
    else:
        models = demo_pair()
    if args.prepare:
        print(f"# models ready: {models}", flush=True)
        return 0
    import torch

    gpu = torch.cuda.get_device_name(args.device) if torch.cuda.is_available() else "no CUDA device"
    print(f"# {gpu}; models {models}", flush=True)
    common = [
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
        "--prefill-backend",
        args.prefill_backend,
    ]
    graphs = [] if args.cuda_graph_max_batch is None else ["--cuda-graph-max-batch", str(args.cuda_graph_max_batch)]
    routing = [
        py,
        str(HERE / "bench_routing.py"),
        "--small",
        models["small"],
        "--large",
        models["large"],
        "--tau",
        str(args.tau),
        "--router",
        args.router or ("scripted" if args.random_weights else "rstitch"),
        *common,
    ]
    routing_fa3 = [*routing[: routing.index("--prefill-backend")], "--prefill-backend", "fa3"]
    single_c = [str(c) for c in (args.concurrency or [1, 16])]
    routed_c = [str(c) for c in (args.concurrency or [1, 4, 16])]
    steps = {
        "decode": [
            py,
            str(HERE.parent / "kernels" / "bench_decode_step.py"),
            "--small",
            models["small"],
            "--large",
            models["large"],
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--prefill-backend",
            args.prefill_backend,
            "--batch",
            *[str(b) for b in args.batch],
            "--out",
            str(args.out),
        ],
        "single": [
            py,
            str(HERE.parent / "anchors" / "bench_single.py"),
            "--model",
            models["large"],
            *common,
            "--concurrency",
            *single_c,
            *(["--systems", *args.single_systems] if args.single_systems else []),
            *graphs,
            "--json",
            str(args.out / "single.json"),
        ],
        "routed": [
            *routing,
            "--concurrency",
            *routed_c,
            *(["--systems", *args.routed_systems] if args.routed_systems else []),
            *(["--reuse-engines", "--order", "levels"] if args.quick else []),
            *graphs,
            "--json",
            str(args.out / "routed.json"),
        ],
        "fa3": [
            *routing_fa3,
            "--systems",
            "routed",
            "--concurrency",
            str(args.eager_concurrency),
            *graphs,
            "--json",
            str(args.out / "routed-fa3.json"),
        ],
        "eager": [
            *routing,
            "--systems",
            "routed",
            "--concurrency",
            str(args.eager_concurrency),
            "--cuda-graph-max-batch",
            "0",
            "--json",
            str(args.out / "routed-eager.json"),
        ],
    }
    summary_path = args.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    summary.update(gpu=gpu, models=models)
    summary.setdefault("steps", {})
    rcs = []
    for name in args.steps:
        cmd = steps[name]
        rc, wall = run(cmd, args.out / f"{name}.log", args.step_timeout)
        summary["steps"][name] = {"command": shlex.join(cmd), "rc": rc, "wall_s": round(wall, 1)}
        rcs.append(rc)
        print(f"# {name}: exit {rc}, {wall:.0f} s", flush=True)
        summary_path.write_text(json.dumps(summary, indent=2))
    return max(rcs, default=0)


if __name__ == "__main__":
    sys.exit(main())
