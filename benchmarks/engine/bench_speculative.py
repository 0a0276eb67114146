#!/usr/bin/env python
"""Verifying policies on the demo pair: Speculative(k="auto") against the large model alone and
RStitch, in one run, on the coding questions of bench_routing.py (every request writes exactly
--max-tokens tokens, greedy).

  large        the large model alone through this engine (policy Single)
  speculative  Speculative(draft="small", target="large", k=auto): lossless, so its greedy
               tokens must equal the large model's
  speculative-int8  the same with the small model's linear layers in int8 (ModelSpec
               quantization="int8"), only with --int8-draft: a quarter of the weight bytes per draft step
  routed       RStitch(tau) (default 0.03): the small model writes, the large one where unsure
  bild         BiLD(fallback, rollback), only when --bild is given

Repeats are interleaved and each (system, C) is the median of --repeats runs (tokenrouter.bench).
After the run, every speculative answer is compared with the large model's own answer to the
same request. A difference is looked up: the large model (Hugging Face, float32, eager) scores
the common prefix and the script prints its top-2 logit gap at the first differing position;
a gap near zero is a float32 near-tie that a different batch shape may flip, not a lost token.

    python benchmarks/engine/bench_speculative.py --json benchmarks/results/speculative/speculative.json
    python benchmarks/engine/bench_speculative.py --quick     # tiny pair (a perturbed-copy drafter), seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_routing import TASKS, tasks_workload
from tokenrouter.api import chat_ids
from tokenrouter.bench import BenchConfig, markdown, run_bench
from tokenrouter.bench.report import write_json
from tokenrouter.policies import BiLD, RStitch, Speculative


def model_paths(args) -> dict[str, str]:
    if args.quick:
        from tokenrouter.testing import build_perturbed_copy, build_tiny_model, build_tokenizer

        root = tempfile.mkdtemp(prefix="tokenrouter-bench-")
        large = build_tiny_model(f"{root}/large", "qwen2", tokenizer=build_tokenizer(), seed=2, logit_scale=3.0)
        return {"small": str(build_perturbed_copy(large, f"{root}/small", noise=0.01)), "large": str(large)}
    if args.small and args.large:
        return {"small": args.small, "large": args.large}
    from tokenrouter.store import ensure_model

    return {"small": str(ensure_model("qwen-coder-0.5b")), "large": str(ensure_model("qwen-coder-1.5b"))}


def differences(result, tokenizer, large_path: str) -> list[dict]:
    """Every (C, session, turn) whose speculative tokens differ from the large model's alone, with
    the large model's top-2 logit gap at the first differing position (float32, eager)."""
    from transformers import AutoModelForCausalLM

    by = {}
    for run in result.runs:
        by.setdefault((run.concurrency, run.system), []).append(run)
    found, model = [], None
    for (c, system), runs in sorted(by.items()):
        if not system.startswith("speculative") or (c, "large") not in by:
            continue
        ref = by[(c, "large")][0].outputs()
        for run in runs:
            for key, tokens in sorted(run.outputs().items()):
                want = ref.get(key)
                if want is None or tokens == want:
                    continue
                at = next(i for i, (a, b) in enumerate(zip(tokens, want)) if a != b)
                if model is None:
                    model = AutoModelForCausalLM.from_pretrained(large_path, dtype=torch.float32).eval()
                prompt = chat_ids(tokenizer, [{"role": "user", "content": TASKS[key[0] % len(TASKS)]}])
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + want[:at]])).logits[0, -1]
                top2 = logits.topk(2)
                found.append(
                    {
                        "system": system,
                        "concurrency": c,
                        "repeat": run.repeat,
                        "session": key[0],
                        "turn": key[1],
                        "position": at,
                        "speculative_token": tokens[at],
                        "large_token": want[at],
                        "top2_tokens": top2.indices.tolist(),
                        "top2_logit_gap": float(top2.values[0] - top2.values[1]),
                    }
                )
    return found


def main(args) -> None:
    from tokenrouter.config import ModelSpec
    from tokenrouter.engine import load_tokenizer

    paths = model_paths(args)
    others = {"speculative": Speculative(draft="small", target="large", k=args.k)}
    systems = ["large", "speculative", *(["routed"] if args.tau > 0 else [])]
    options = {}
    if args.int8_draft:  # the same small checkpoint, int8 (ModelSpec quantization), as a second drafter
        paths["small8"], options["small8"] = paths["small"], {"quantization": "int8"}
        others["speculative-int8"] = Speculative(draft="small8", target="large", k=args.k)
        systems.insert(2, "speculative-int8")
    if args.bild:
        others["bild"] = BiLD(fallback=args.bild[0], rollback=args.bild[1])
        systems.append("bild")
    if args.systems:
        unknown = sorted(set(args.systems) - set(systems))
        if unknown:
            raise SystemExit(f"--systems: {unknown[0]!r} is not one of {', '.join(systems)}")
        systems = [s for s in systems if s in args.systems]
    cfg = BenchConfig(
        models=paths,
        policy=RStitch(tau=args.tau),
        other_policies=others,
        systems=systems,
        workloads=[tasks_workload(args.max_tokens)],
        concurrency=args.concurrency,
        repeats=args.repeats,
        min_requests=args.min_requests,
        kv_cache_tokens=args.kv_cache_tokens,
        reuse_engines=True,
        model_options=options,
    )
    command = shlex.join([sys.executable, *sys.argv])
    print(f"# {command}")
    tokenizer = load_tokenizer(ModelSpec(path=paths["small"]))
    result = anyio.run(lambda: run_bench(cfg, tokenizer, command=command, progress=print))
    diffs = differences(result, tokenizer, paths["large"])
    compared = sum(len(r.outputs()) for r in result.runs if r.system.startswith("speculative"))
    print()
    print(markdown(result), end="")
    print(f"\nspeculative vs large alone: {len(diffs)} of {compared} answers differ")
    for d in diffs:
        print(
            f"  {d['system']} C={d['concurrency']} #{d['repeat'] + 1} session {d['session']}: "
            f"first at token {d['position']}, "
            f"top-2 logit gap {d['top2_logit_gap']:.4f} ({d['speculative_token']} vs {d['large_token']})"
        )
    for w in result.warnings:
        print(f"warning: {w}")
    if args.json:
        path = write_json(result, args.json)
        data = json.loads(path.read_text(encoding="utf-8"))
        data["speculative_vs_large"] = {"compared": compared, "differences": diffs}
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _k(value: str):
    return value if value == "auto" else int(value)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small")
    p.add_argument("--large")
    p.add_argument("--k", type=_k, default="auto", help="Speculative's draft length, or auto (default)")
    p.add_argument("--tau", type=float, default=0.03, help="RStitch's tau (default 0.03); 0: no routed system")
    p.add_argument("--int8-draft", action="store_true", help="also Speculative with the small model in int8")
    p.add_argument("--bild", type=float, nargs=2, metavar=("FALLBACK", "ROLLBACK"), help="also run BiLD")
    p.add_argument("--systems", nargs="+", help="run only these of the systems above")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--max-tokens", type=int, default=48, help="tokens every request writes (EOS ignored)")
    p.add_argument("--min-requests", type=int, default=8, help="requests per level: max(this, C)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-cache-tokens", type=int, default=8192)
    p.add_argument("--json", help="write every run, the medians, the machine and the differences here")
    p.add_argument("--quick", action="store_true", help="tiny pair, a drafter that is a perturbed copy")
    a = p.parse_args()
    torch.set_num_threads(1)  # the main thread runs no torch op; workers set their own threads
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    main(a)
