#!/usr/bin/env python
"""Whether greedy Speculative's answers are the large model's in bf16: which of a step's
computations give a row a result that depends on the other rows of the call.

Speculative is lossless when the target scores a draft exactly as it would decode that token
alone. In float32 the engine met that on all 164 HumanEval problems; in bf16 (the CPU default)
it did not until the block kernels served every step and attention padded every row's keys to a
multiple of 16 (docs/evaluation.md). The checks, 2 threads, on this machine:

1. Each CPU linear kernel (`engine/quant/`): row 0 of a call of M rows (1 to 300) against a
   call of row 0 alone, at the demo pair's MLP and head shapes, on 1 and 2 threads: oneDNN's
   packed linear and torch's own in float32 and bf16, torch's int4 and int8 kernels (bf16
   activations), the GGUF block kernels. `--linears` runs only this (docs/policies.md, "Same
   tokens at any load"):

       python benchmarks/kernels/bench_batch_invariance.py --linears \
           --json benchmarks/results/batch-invariance/linears.json
2. The attention call (`grouped_sdpa`, SDPA on the demo 1.5B's heads, one query row as in a
   decode step, bf16): a context of c keys padded with masked keys to width W. A decode step
   pads every row to the batch's widest block table, so W depends on the batch; the torch
   backend pads every row to a multiple of 16 (`KEY_MULTIPLE`) at least, and the result must be
   the same for every W from there on (the widths short of it differ). Then the C kernel
   (engine/attention/cpu_paged.py, the CPU default): the same query decoded alone, beside rows
   of other lengths, and as the last of a verifier's 4 checked tokens.
3. The demo 1.5B itself (gguf+bf16 and gguf), with each attention backend: three tokens decoded
   one step at a time against the same three in one extend step (a verifier's check), the last
   token's attention output and logits compared bitwise.
4. With `--speculative N`: greedy Speculative(4) on the demo pair against the large model alone,
   N prompts of bench_routing.TASKS at once, 128 tokens, in each of the two modes: how many
   answers are equal, and where the others first part.

    python benchmarks/kernels/bench_batch_invariance.py --speculative 8 \
        --json benchmarks/results/batch-invariance/invariance.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams, Single
from tokenrouter.bench import machine_info
from tokenrouter.engine import Request, ScheduledBatch, SeqStatus, Sequence
from tokenrouter.engine.attention import cpu_paged
from tokenrouter.engine.attention.cpu_paged import CpuPagedAttention
from tokenrouter.engine.attention.torch_paged import TorchPagedAttention, grouped_sdpa, padded
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.engine.model import ModelRunner, load_model
from tokenrouter.engine.quant import gguf_native, int4, int8_weights, onednn, probe
from tokenrouter.engine.quant.gguf_blocks import GGUFBlockLinear
from tokenrouter.policies import Speculative
from tokenrouter.store import ensure_model
from tokenrouter.testing.paged_steps import consecutive_tables, step_metadata

ROWS = (1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 128, 300)
SHAPES = ((1536, 8960), (8960, 1536), (896, 4864), (1536, 151936))  # (in, out): the demo pair's MLP and head


def linear_kernels(threads: tuple[int, ...] = (1, 2)) -> dict:
    """For each kernel, shape and thread count, the call sizes M at which row 0 differs from row 0
    computed alone (bf16 activations for torch's quantized kernels, as they serve)."""
    out: dict = {}
    lib = gguf_native.load()[0]
    for k, n in SHAPES:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(n, k, generator=gen) * 0.02
        x = torch.randn(max(ROWS), k, generator=gen)
        kernels = {
            "int4 (_weight_int4pack_mm_for_cpu)": (int4.Int4Linear.from_dense(w), torch.bfloat16),
            "int8 (_weight_int8pack_mm)": (int8_weights.Int8WeightLinear(w), torch.bfloat16),
        }
        for dtype in (torch.float32, torch.bfloat16):
            if not onednn.not_refused(dtype):
                continue  # torch's bf16 linear raises on this CPU
            dense = torch.nn.Linear(k, n, bias=False)
            dense.weight.data = w.to(dtype)
            name = str(dtype).removeprefix("torch.")
            kernels[f"{name}, oneDNN packed"] = (onednn.PackedLinear(dense), dtype)
            kernels[f"{name}, torch's linear"] = (dense, dtype)
        if lib is not None and k % 256 == 0:
            blocks = probe.random_blocks("Q4_K", (n, k), gen)
            kernels["GGUF block kernels (Q4_K)"] = (GGUFBlockLinear(lib, "Q4_K", blocks, (n, k)), torch.float32)
        for t in threads:
            torch.set_num_threads(t)
            with torch.inference_mode():
                for name, (kernel, dtype) in kernels.items():
                    xs = x.to(dtype)
                    alone = kernel(xs[:1])
                    differ = [m for m in ROWS if not torch.equal(kernel(xs[:m])[:1], alone)]
                    out[f"{name}, {k}->{n}, {t} thread(s)"] = differ
                    print(f"{name:36s} {k:5d}->{n:6d} {t} thread(s): row 0 differs at M = {differ}", flush=True)
    torch.set_num_threads(2)
    return out


def attention_widths() -> dict:
    """For each context length c: the widths from padded(c) to c + 80 that give padded(c)'s
    result (what the backend computes), and those from c up to padded(c) that do not."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 12, 2, 128
    out = {}
    for ctx in (7, 23, 40, 100, 300, 700):
        q = torch.randn(1, heads, 1, dim).bfloat16()
        k, v = (torch.randn(1, kv_heads, ctx + 80, dim).bfloat16() for _ in range(2))

        def at(width, q=q, k=k, v=v, ctx=ctx):
            mask = torch.zeros(1, 1, 1, width, dtype=torch.bool)
            mask[..., :ctx] = True
            return grouped_sdpa(q, k[:, :, :width], v[:, :, :width], mask, dim**-0.5)

        ref = at(padded(ctx))
        wider = range(padded(ctx), ctx + 80)
        same = [w for w in wider if torch.equal(at(w), ref)]
        short = [w for w in range(ctx, padded(ctx)) if not torch.equal(at(w), ref)]
        out[str(ctx)] = {"padded": padded(ctx), "wider_equal": f"{len(same)}/{len(wider)}", "short_differ": short}
        print(
            f"context {ctx:4d}: widths {padded(ctx)}..{ctx + 79} equal to {padded(ctx)}'s: {len(same)}/{len(wider)};"
            f" widths short of it that differ: {short}"
        )
    return out


def c_kernel_steps() -> dict:
    """The C kernel, bf16, the 1.5B's heads: a query over c keys decoded alone against the same
    query beside rows of c + 16, c + 80 and 1000 keys, and as the last of 4 checked tokens."""
    kernel, why = cpu_paged.load()
    if kernel is None:
        return {"skipped": why}
    torch.manual_seed(0)
    heads, kv_heads, dim, block = 12, 2, 128, 16
    cache = KVCache(KVLayout(1, kv_heads, dim, torch.bfloat16), 256, block, "cpu")
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape))
    backend = CpuPagedAttention(cache, kernel)

    def last_output(rows: list[tuple[int, int]], q: torch.Tensor) -> torch.Tensor:
        """rows (tokens cached, new tokens), the last row's blocks 0.., the others' after them; q is
        the last row's queries, random ones before them."""
        tables = [*consecutive_tables(rows[:-1], block, first=64), *consecutive_tables(rows[-1:], block)]
        meta = step_metadata(rows, tables, block)
        slots = meta.slot_mapping
        extra = sum(n for _, n in rows[:-1])
        qs = torch.cat([torch.randn(extra, heads, dim).bfloat16(), q])
        k = cache.k[0][slots].clone()  # write back what is there: the cache stays as it was
        v = cache.v[0][slots].clone()
        return backend.forward(0, qs, k, v, meta, dim**-0.5, None)[-1]

    out = {}
    for ctx in (7, 23, 40, 100, 191, 300, 700):
        q = torch.randn(4, heads, dim).bfloat16()
        alone = last_output([(ctx - 1, 1)], q[-1:])
        beside = [last_output([(w - 1, 1), (ctx - 1, 1)], q[-1:]) for w in (ctx + 16, ctx + 80, 1000)]
        checked = last_output([(ctx - 4, 4)], q)
        out[str(ctx)] = {
            "beside_wider_rows_equal": all(torch.equal(b, alone) for b in beside),
            "in_a_check_equal": torch.equal(checked, alone),
        }
        print(f"C kernel, context {ctx:4d}: {out[str(ctx)]}")
    return out


def decode_against_extend(quantization: str, attention: str) -> dict:
    """The demo 1.5B: decode 3 tokens one at a time, or score them in one extend step."""
    path = ensure_model("qwen-coder-1.5b")
    loaded = load_model("large", ModelSpec(path=path, quantization=quantization), threads=2)
    layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
    prompt = [(37 * i + 11) % 5000 + 100 for i in range(20)]
    extra = [1550, 374, 220]
    captured: dict[str, torch.Tensor] = {}

    def run(extend: bool) -> torch.Tensor:
        cache = KVCache(layout, 16, 16, "cpu")
        backend = TorchPagedAttention(cache) if attention == "torch" else CpuPagedAttention(cache, cpu_paged.load()[0])
        forward = backend.forward

        def layer0(layer_idx, q, k, v, meta, scaling, window):
            out = forward(layer_idx, q, k, v, meta, scaling, window)
            if layer_idx == 0:
                captured["attention"] = out[-1].clone()
            return out

        backend.forward = layer0
        runner = ModelRunner(loaded, backend, 16)
        req = Request("r", prompt, SamplingParams(), seed=0, stop_token_ids=frozenset(), max_tokens=8)
        seq = Sequence(req, list(prompt), status=SeqStatus.RUNNING)
        seq.block_table = [0, 1, 2]  # room for 48 tokens, as a scheduler's lookahead gives
        runner.forward(ScheduledBatch([seq], [len(prompt)], 0))
        seq.num_computed = len(prompt)
        if extend:
            seq.token_ids += extra
            return runner.forward(ScheduledBatch([seq], [len(extra)], 0)).logits[-1]
        for token in extra:
            seq.token_ids.append(token)
            logits = runner.forward(ScheduledBatch([seq], [1], 1)).logits[-1]
            seq.num_computed += 1
        return logits

    decoded = run(extend=False)
    decoded_attention = captured["attention"]
    scored = run(extend=True)
    result = {
        "attention": attention,
        "linear_kernel": loaded.linear_kernel,
        "layer0_attention_equal": torch.equal(decoded_attention, captured["attention"]),
        "layer0_attention_max_abs_diff": (decoded_attention.float() - captured["attention"].float()).abs().max().item(),
        "logits_equal": torch.equal(decoded, scored),
        "logits_max_abs_diff": (decoded - scored).abs().max().item(),
        "argmax_equal": int(decoded.argmax()) == int(scored.argmax()),
    }
    print(f"demo 1.5B, {quantization}, {attention} attention: {result}")
    return result


def speculative_against_large(quantization: str, prompts: int, tokens: int = 128) -> dict:
    """Greedy Speculative(4) against the large model alone, the same prompts in flight at once."""
    from bench_routing import TASKS

    specs = {
        role: ModelSpec(path=ensure_model(name), quantization=quantization)
        for role, name in (("small", "qwen-coder-0.5b"), ("large", "qwen-coder-1.5b"))
    }
    params = SamplingParams(max_tokens=tokens, temperature=0)
    texts = TASKS[:prompts]

    async def answers(policy, models) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in texts]
        async with Engine(models={m: specs[m] for m in models}, policy=policy, num_threads=2) as engine:

            async def one(i: int) -> None:
                out[i] = (await engine.generate(texts[i], params)).token_ids

            async with anyio.create_task_group() as tg:
                for i in range(len(texts)):
                    tg.start_soon(one, i)
        return out

    large = anyio.run(answers, Single("large"), ["large"])
    spec = anyio.run(answers, Speculative(k=4), ["small", "large"])
    first = [next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(large, spec)]
    result = {
        "prompts": len(texts),
        "tokens": tokens,
        "equal": sum(x == y for x, y in zip(large, spec)),
        "first_difference": first,
    }
    print(f"Speculative(4) against the large model alone, {quantization}: {result}")
    return result


def main(args) -> None:
    torch.set_num_threads(2)
    results = {
        "meta": {"machine": machine_info(), "threads": 2, "torch": torch.__version__},
        "linear_rows_that_differ": linear_kernels(),
    }
    if args.linears:
        return write(results, args.json)
    results |= {
        "attention_padded_width": attention_widths(),
        "c_kernel_attention": c_kernel_steps(),
        "decode_against_extend": {
            f"{q}, {a} attention": decode_against_extend(q, a) for q in ("gguf+bf16", "gguf") for a in ("torch", "cpu")
        },
    }
    if args.speculative:
        results["speculative_against_large"] = {
            q: speculative_against_large(q, args.speculative) for q in ("gguf+bf16", "gguf")
        }
    write(results, args.json)


def write(results: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--speculative", type=int, default=0, metavar="N", help="also Speculative(4) on N prompts")
    parser.add_argument("--linears", action="store_true", help="only the linear kernels (1.)")
    main(parser.parse_args())
