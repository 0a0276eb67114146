"""The Hugging Face baselines of the single-model benchmark (benchmarks/anchors/bench_single.py):
`model.generate` on static, left-padded batches, and transformers' continuous batching.

Both run the same prompts (token ids) with the same output lengths as the engine, greedy with EOS
off, and return a `RunResult`: the run's wall time, each request's latency and tokens.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenrouter.bench import percentile
from tokenrouter.bench.machine import CpuMeter
from tokenrouter.engine import dense_checkpoint
from tokenrouter.engine.quant import onednn as onednn_linear


@dataclass
class RunResult:
    """One measured run of one system over every prompt."""

    wall_s: float
    latencies_s: list[float]  # per prompt, in prompt order
    tokens: list[list[int]]  # generated tokens, per prompt
    extra: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tok_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    def summary(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "tok_per_s": self.tok_per_s,
            "num_tokens": self.num_tokens,
            "p50_s": percentile(self.latencies_s, 0.5),
            "p99_s": percentile(self.latencies_s, 0.99),
            "mean_latency_s": statistics.fmean(self.latencies_s),
            **self.extra,
        }

    def with_cpu(self, cpu: CpuMeter) -> RunResult:
        self.extra["cpu_self_cores"] = cpu.self_cores
        self.extra["cpu_foreign_cores"] = cpu.foreign_cores
        return self


def per_request(max_tokens, n: int) -> list[int]:
    """Output length of each request: one int for all, or a list (mixed lengths)."""
    return [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)


# ---- static batches: model.generate -----------------------------------------------------------
def load_hf(model_path: Path, dtype: str = "float32", device: str = "cpu", onednn: bool = False):
    """The model as transformers loads it; `onednn=True` swaps its float32 CPU linear layers for
    the engine's oneDNN ones (engine/quant/onednn.py), so `generate` runs the engine's kernels
    and a comparison measures scheduling and batching alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        dense_checkpoint(model_path), dtype=getattr(torch, dtype), attn_implementation="sdpa", local_files_only=True
    )
    model = model.to(device).eval()
    if onednn:
        if not onednn_linear.applies(model.device, model.dtype):
            raise RuntimeError(f"oneDNN linear layers need float32 on CPU, not {model.dtype} on {model.device}")
        onednn_linear.pack_linears(model)
    return model


def hf_generate_run(model, pad_id: int, prompts, concurrency: int, max_tokens) -> RunResult:
    """Static batches: a batch runs until its longest request is done, as with EOS in real use."""
    from transformers import GenerationConfig

    lengths = per_request(max_tokens, len(prompts))
    n = len(prompts)
    lat = [0.0] * n
    toks: list[list[int]] = [[] for _ in range(n)]
    t0 = time.perf_counter()
    for start in range(0, n, concurrency):
        batch = prompts[start : start + concurrency]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for j, p in enumerate(batch):  # left padding
            ids[j, width - len(p) :] = torch.tensor(p)
            mask[j, width - len(p) :] = 1
        longest = max(lengths[start : start + concurrency])
        gc = GenerationConfig(
            max_new_tokens=longest,
            min_new_tokens=longest,  # belt and braces: EOS is off anyway (eos_token_id=None below)
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad_id,
            bos_token_id=None,
        )
        tb = time.perf_counter()
        with torch.inference_mode():
            ids, mask = ids.to(model.device), mask.to(model.device)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        dt = time.perf_counter() - tb
        for j in range(len(batch)):
            lat[start + j] = dt
            toks[start + j] = out[j, width : width + lengths[start + j]].tolist()
    return RunResult(time.perf_counter() - t0, lat, toks)


def hf_generate_measure(args, model, pad_id, prompts, lengths, warm_prompts, c: int) -> RunResult:
    hf_generate_run(model, pad_id, warm_prompts[: args.warmup_prompts], c, args.warmup_tokens)  # warm-up
    with CpuMeter() as cpu:
        res = hf_generate_run(model, pad_id, prompts, c, lengths)
    return res.with_cpu(cpu)


# ---- transformers' continuous batching ---------------------------------------------------------
def _cb_configs(args, max_seqs: int):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=args.max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # eos_token_id=-1 is "no EOS" for continuous batching (add_request also gets eos_token_id=-1)
    page = args.hf_cb_page_size
    cb = ContinuousBatchingConfig(
        page_size=page,
        num_blocks=math.ceil(args.kv_cache_tokens / page),  # the same KV budget (in tokens) as the engine
        max_batch_tokens=args.max_num_batched_tokens,  # the same step token budget as the engine
        max_requests_per_batch=max_seqs,
        auto_switch_to_flash=False,
        use_cuda_graph=False,
        use_async_batching=False,
        seed=0,
    )
    return gen, cb


def hf_cb_closed_run(manager, prompts, concurrency: int, max_tokens, tag: str) -> RunResult:
    n = len(prompts)
    lengths = per_request(max_tokens, n)
    lat = [0.0] * n
    toks: list[list[int]] = [[] for _ in range(n)]
    submitted: dict[str, tuple[int, float]] = {}
    nxt = 0
    done = 0

    def submit() -> None:
        nonlocal nxt
        rid = f"{tag}-{nxt}"
        submitted[rid] = (nxt, time.perf_counter())
        manager.add_request(prompts[nxt], request_id=rid, max_new_tokens=lengths[nxt], eos_token_id=-1)
        nxt += 1

    t0 = time.perf_counter()
    while nxt < n and len(submitted) < concurrency:
        submit()
    while done < n:
        res = manager.get_result(timeout=1.0)
        if res is None:
            if not manager.is_running():
                raise RuntimeError("hf_cb: the generation thread died")
            continue
        if not res.is_finished():
            continue
        now = time.perf_counter()
        i, ts = submitted.pop(res.request_id)
        if res.error is not None:
            raise RuntimeError(f"hf_cb: request {i} failed: {res.error}")
        lat[i] = now - ts
        toks[i] = list(res.generated_tokens)
        done += 1
        if nxt < n:
            submit()
    return RunResult(time.perf_counter() - t0, lat, toks)


def hf_cb_generate_batch_run(model, args, prompts, concurrency: int, max_tokens: int) -> RunResult:
    gen, cb = _cb_configs(args, concurrency)
    gen.max_new_tokens = max_tokens
    t0 = time.perf_counter()
    outs = model.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb, warmup=False)
    wall = time.perf_counter() - t0
    rows = list(outs.values())
    # generate_batch returns the results in input order; latency from creation to finish (includes queueing)
    lat = [o.lifespan[1] - o.created_time for o in rows]
    return RunResult(wall, lat, [list(o.generated_tokens) for o in rows], {"note": "all submitted at t=0"})


def hf_cb_measure(args, model, prompts, lengths, warm_prompts, c: int) -> RunResult:
    """One measured run on a fresh manager (and so an empty paged cache), as for the engine."""
    if args.hf_cb_api == "generate_batch":
        hf_cb_generate_batch_run(model, args, warm_prompts[: args.warmup_prompts], c, args.warmup_tokens)
        with CpuMeter() as cpu:
            res = hf_cb_generate_batch_run(model, args, prompts, c, max(lengths))
        return res.with_cpu(cpu)
    gen, cb = _cb_configs(args, max(args.max_num_seqs, max(args.concurrency)))
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    try:
        hf_cb_closed_run(manager, warm_prompts[: args.warmup_prompts], c, args.warmup_tokens, "warm")
        with CpuMeter() as cpu:
            res = hf_cb_closed_run(manager, prompts, c, lengths, "run")
        res.with_cpu(cpu)
        cache = manager.batch_processor.cache
        res.extra["hf_cache_num_blocks"] = cache.num_blocks
        res.extra["hf_cache_max_batch_tokens"] = cache.max_batch_tokens
    finally:
        manager.stop(block=True, timeout=30)
        manager.destroy()
    return res
