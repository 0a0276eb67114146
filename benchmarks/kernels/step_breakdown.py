#!/usr/bin/env python
"""One engine decode step of a store model, timed part by part: the counterpart of
ggml_step_breakdown.py, on the same 2 threads and the same kind of steps.

The engine serves the model alone (`Single`) and writes --tokens greedy tokens after a short
prompt; every forward of one row (a decode step) is timed and each part's time summed within it.
Figures are medians over those steps.

  fused (default)  the fused decoder (engine/model/fused_decoder.py): each `FusedLinears` call
                   by its weights' types and shapes and its epilogue, the attention backend's
                   call (the KV write and the C kernel), the rotary product, the embedding, and
                   the final norm and the output head (one `FusedLinears` call, "store", where
                   the head is a block linear); "other" is the rest of the forward (Python)
  --layers-in-c    the fused decoder as it serves, its layers in one C call a step
                   (engine/model/layer_stack.py): that call is one part; without it, the
                   fused decoder's Python loop (TOKENROUTER_FUSED_LAYERS=python), each call a part
  --unfused        transformers' forward (TOKENROUTER_FUSED_LAYERS=off): forward hooks on every
                   block linear (by type and shape) and on the norms, attention, MLP and layer
                   modules; a module's own time is its time less its children's

`step` is the forward's wall time; `wall/token` is the request's (prefill, sampling and the
engine's own step included). The timers cost a little (about 1 us a part; hooks more): the parts
of the unfused forward are inflated by its hooks, the step without them is in the JSON too.

    python benchmarks/kernels/step_breakdown.py --model qwen-coder-1.5b \
        --json benchmarks/results/step-breakdown/ours-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams, store
from tokenrouter.bench import machine_info
from tokenrouter.engine.attention.cpu_paged import CpuPagedAttention
from tokenrouter.engine.model import fused_decoder
from tokenrouter.engine.model.layer_stack import LayerStack
from tokenrouter.engine.quant import FusedLinears, GGUFBlockLinear
from tokenrouter.policies import Single
from tokenrouter.testing import loaded_model

THREADS = 2
PROMPT = "Write a Python function that checks whether a number is prime, with tests."


class Parts:
    """Each decode step's time per part, and the step's own."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None
        self.calls: dict[str, int] = defaultdict(int)

    def add(self, key: str, seconds: float) -> None:
        if self.current is not None:
            self.current[key] = self.current.get(key, 0.0) + seconds
            self.calls[key] += 1

    def timed(self, key_of, fn):
        """fn, its time added under key_of(args) while a step is being timed."""

        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(key_of(*args), time.perf_counter() - t)

        return run


def linear_key(group: FusedLinears, *_) -> str:
    kinds = "+".join(sorted({layer.kind for layer in group.layers}))
    shapes = "|".join(f"{layer.out_features}x{layer.in_features}" for layer in group.layers)
    return f"{group.epilogue} {kinds} {shapes}"


def install_fused(parts: Parts) -> None:
    """Time the fused decoder's calls: class-level wrappers, so every instance the engine makes."""
    FusedLinears.__call__ = parts.timed(linear_key, FusedLinears.__call__)
    CpuPagedAttention.forward = parts.timed(lambda *a: "attention (KV write + C kernel)", CpuPagedAttention.forward)
    fused_decoder.rope = parts.timed(lambda *a: "rope", fused_decoder.rope)
    LayerStack.__call__ = parts.timed(lambda *a: "layers (one C call)", LayerStack.__call__)
    step = fused_decoder.FusedDecoder.__call__

    def whole(self, input_ids, *rest):
        one_row = input_ids.shape[0] == 1
        parts.current = {} if one_row else None
        t = time.perf_counter()
        out = step(self, input_ids, *rest)
        if one_row:
            parts.current["step"] = time.perf_counter() - t
            parts.steps.append(parts.current)
        parts.current = None
        return out

    fused_decoder.FusedDecoder.__call__ = whole


def install_hooks(parts: Parts, model: torch.nn.Module) -> None:
    """Forward hooks on transformers' modules: self time (less timed children) per kind of module."""
    stack: list[list] = []  # [key, start, children's time]

    def key_of(module) -> str | None:
        if isinstance(module, GGUFBlockLinear):
            return f"linear {module.kind} {module.out_features}x{module.in_features}"
        name = type(module).__name__
        return name if name.endswith(("Attention", "MLP", "RMSNorm", "DecoderLayer", "Embedding", "Model")) else None

    def pre(module, args, kwargs):
        if module is model:  # called as model(input_ids=[1, tokens], ...)
            parts.current = {} if kwargs["input_ids"].shape[-1] == 1 else None
        stack.append([key_of(module), time.perf_counter(), 0.0])

    def post(module, args, out):
        key, start, children = stack.pop()
        took = time.perf_counter() - start
        if stack:
            stack[-1][2] += took
        if module is model:
            if parts.current is not None:
                parts.current["step"] = took
                parts.steps.append(parts.current)
            parts.current = None
        elif key is not None:
            parts.add(key + (" (self)" if children else ""), took - children)

    for module in model.modules():
        if module is model or key_of(module) is not None:
            module.register_forward_pre_hook(pre, with_kwargs=True)
            module.register_forward_hook(post)


async def run(args) -> tuple[Parts, list[float]]:
    parts = Parts()
    if not args.unfused:
        install_fused(parts)
    spec = ModelSpec(path=str(store.ensure_model(args.model)))
    async with Engine(models={"m": spec}, policy=Single("m"), num_threads=THREADS) as e:
        model = loaded_model(e, "m").model
        head, embed, norm = model.get_output_embeddings(), model.get_input_embeddings(), model.model.norm
        if args.unfused:
            install_hooks(parts, model)
        else:
            for name, module in (("output head", head), ("embedding", embed), ("final norm", norm)):
                module.forward = parts.timed(lambda *a, name=name: name, module.forward)
        forward = e.stats()["m"].model_forward
        params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
        walls = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            await e.generate(PROMPT, params)
            walls.append((time.perf_counter() - t) / args.tokens)
    if args.unfused != forward.startswith("transformers"):
        raise SystemExit(f"asked for the {'unfused' if args.unfused else 'fused'} forward, the engine ran {forward!r}")
    return parts, walls


def table(parts: Parts, walls: list[float]) -> tuple[str, list[dict]]:
    steps = parts.steps[2:]  # the first steps warm caches
    keys = sorted(
        {k for s in steps for k in s if k != "step"}, key=lambda k: -statistics.median(s.get(k, 0) for s in steps)
    )
    step = statistics.median(s["step"] for s in steps)
    rows = []
    for k in keys:
        ms = statistics.median(s.get(k, 0.0) for s in steps) * 1000
        per_step = parts.calls[k] / len(parts.steps)
        rows.append({"part": k, "ms_per_step": ms, "calls_per_step": per_step, "us_per_call": 1000 * ms / per_step})
    other = 1000 * statistics.median(s["step"] - sum(v for k, v in s.items() if k != "step") for s in steps)
    lines = ["| part | calls/step | us/call | ms/step | share |", "|---|--:|--:|--:|--:|"]
    for r in rows:
        share = r["ms_per_step"] / (step * 1000)
        cells = f"{r['calls_per_step']:.0f} | {r['us_per_call']:.1f} | {r['ms_per_step']:.3f} | {share:.1%}"
        lines.append(f"| {r['part']} | {cells} |")
    lines.append(f"| other (Python, dispatch) | | | {other:.3f} | {other / (step * 1000):.1%} |")
    lines.append(f"| **step** | | | **{step * 1000:.2f}** | |")
    lines.append(f"| wall per token (the request's) | | | {statistics.median(walls) * 1000:.2f} | |")
    return "\n".join(lines) + "\n", rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--unfused", action="store_true", help="transformers' forward, timed with module hooks")
    p.add_argument("--layers-in-c", action="store_true", help="the layers as served: one C call a step, one part")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    if args.unfused:
        os.environ["TOKENROUTER_FUSED_LAYERS"] = "off"
    elif not args.layers_in_c:  # the Python loop: each call timed on its own
        os.environ["TOKENROUTER_FUSED_LAYERS"] = "python"
    torch.set_num_threads(1)  # the engine's worker sets its own
    parts, walls = anyio.run(run, args)
    text, rows = table(parts, walls)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(["python", *sys.argv]),
            "model": args.model,
            "forward": "transformers (hooks)"
            if args.unfused
            else ("fused, layers in C" if args.layers_in_c else "fused"),
            "machine": machine_info(),
            "rows": rows,
            "steps_ms": [{k: v * 1000 for k, v in s.items()} for s in parts.steps],
            "wall_per_token_ms": [w * 1000 for w in walls],
            "table": text,
        }
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
