#!/usr/bin/env python
"""One pure-decode step (B rows, one new token each, ~128 tokens of context a row), timed three ways
per model of a pair, against the memory floor (issue 53, part of the GPU kit):

  graph   the engine's ModelRunner replaying its CUDA graph of the step (CUDA with flashinfer only;
          elsewhere recorded as skipped, with the reason)
  eager   the same runner with graphs off (cuda_graph_max_batch=0): flashinfer planned and run eagerly
          on CUDA; on a CPU the engine's CPU path (oneDNN linears or the fused decoder, the C attention
          kernel where it builds; decode.json names the forward and the attention backend)
  hf      transformers' own forward, attn_implementation="sdpa", over a DynamicCache holding the
          context (after a prefill; cropped back to it between steps, outside the timing)
  floor   the bytes a step must read (every weight once, a tied embedding once, an untied input
          embedding not at all) / the device's copy bandwidth, measured here (a --copy-mib MiB tensor
          copied on the device, bytes read + written counted); floor_with_kv_ms adds the KV read

    python benchmarks/kernels/bench_decode_step.py --random-weights --tokenizer DIR --out bench_out/gpu
    python benchmarks/kernels/bench_decode_step.py --small DIR --large DIR --batch 1 16 64
    python benchmarks/kernels/bench_decode_step.py --random-weights --tiny --device cpu --dtype float32   # CPU smoke

The GPU kit runs it on the random-weight pair bench_gpu.py --prepare wrote under the same --out (reused):
    python benchmarks/kernels/bench_decode_step.py --random-weights --tokenizer DIR --out DIR --prefill-backend fa2

How the engine's step is driven: the runtime a worker builds (`engine.model_core.build_runtime`: the KV
pool, its block manager, the scheduler, and the ModelRunner over the chosen attention backend, CUDA graphs
captured where flashinfer serves), for B sequences of random context. The scheduler admits and prefills
them (each forward followed by what ModelCore does after one: num_computed advanced, full blocks
registered); one token is then appended to each, so the scheduler's next batch is a pure decode of B
rows, and the timed step is `runner.forward(batch)` on that batch: packing on the host, the one copy to
the device, the plan, the forward (or the graph's replay) and the float32 logits, i.e. a worker's step
short of sampling. Repeating it rewrites the same KV slot with the same values, so every step is the same.

Each mode: --warmup steps, then --steps timed ones, the median reported (CUDA: events, synchronized
before each step; CPU: perf_counter, torch on --threads threads). As a check that the step timed is a real
step, each engine mode's logits are compared with the hf step's for the same context and new token
(`vs_hf`: rows whose argmax agrees, and the largest logit difference; float32 on CPU agrees within 1e-3,
bfloat16 kernels may flip near-ties). decode.json under --out holds every measurement, the device, versions
and the models' shapes and weight bytes, rewritten after each one (a kill loses the one under way only).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_gpu import demo_pair, pair_arguments, random_pair
from tokenrouter import ModelSpec, SamplingParams
from tokenrouter.bench import machine_info
from tokenrouter.engine import Request, ScheduledBatch, Sequence, dense_checkpoint, usable_cores
from tokenrouter.engine.model import load_model, use_threads
from tokenrouter.engine.model_core import build_runtime

MODES = ("graph", "eager", "hf")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return machine_info()["cpu"] or "unknown CPU"


def time_steps(step, device: torch.device, warmup: int, steps: int, between=None) -> list[float]:
    """Milliseconds of each of `steps` calls of `step` after `warmup` untimed ones; `between` runs
    after every call, untimed."""
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            step()
            ms = (time.perf_counter() - t0) * 1e3
        if between is not None:
            between()
        if i >= warmup:
            times.append(ms)
    return times


def copy_bandwidth(device: torch.device, mib: int) -> dict:
    """The device's copy bandwidth: a `mib` MiB tensor copied into another, bytes read + written
    over the median of 10 copies' times."""
    n = mib << 20
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = statistics.median(time_steps(lambda: dst.copy_(src), device, 2, 10))
    return {"bytes_per_copy": 2 * n, "ms": ms, "gb_per_s": 2 * n / ms / 1e6}


def model_shapes(model: torch.nn.Module) -> dict:
    """The shapes that matter to a decode step, the weight bytes (a tied embedding once) and the
    bytes a step must read: every weight, but an untied input embedding (B rows of it)."""
    text = model.config.get_text_config()
    params = {id(p): p for p in model.parameters()}.values()
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    tied = embed.data_ptr() == head.data_ptr()
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return {
        "model_type": text.model_type,
        "hidden_size": text.hidden_size,
        "intermediate_size": getattr(text, "intermediate_size", None),
        "num_hidden_layers": text.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": head.shape[0],
        "tie_word_embeddings": tied,
        "parameters": sum(p.numel() for p in params),
        "dtype": str(embed.dtype).removeprefix("torch."),
        "weight_bytes": weight_bytes,
        "floor_bytes": weight_bytes - (0 if tied else embed.numel() * embed.element_size()),
        "kv_bytes_per_token": 2 * text.num_hidden_layers * kv_heads * head_dim * embed.element_size(),
    }


def contexts(vocab: int, batch: int, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids: [batch, context] of context, and [batch] new tokens (the decode step's)."""
    g = torch.Generator().manual_seed(seed + batch)
    ids = torch.randint(0, vocab, (batch, context + 1), generator=g)
    return ids[:, :-1], ids[:, -1]


class Results:
    """decode.json: written again after every measurement (a kill loses only the one under way)."""

    def __init__(self, path: Path, header: dict):
        self.path = path
        self.data = {**header, "models": {}, "measurements": [], "complete": False}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.replace(self.path)

    def model(self, name: str, info: dict) -> None:
        self.data["models"][name] = info
        self.write()

    def add(self, model: str, batch: int, mode: str, times: list[float] | None, floor: dict, **extra) -> dict:
        entry = {"model": model, "batch": batch, "mode": mode, "floor_ms": floor["ms"]}
        entry["floor_with_kv_ms"] = floor["with_kv_ms"]
        if times is not None:
            ms = statistics.median(times)
            entry.update(ms=ms, times_ms=times, x_floor=ms / floor["ms"])
        entry.update(extra)
        self.data["measurements"].append(entry)
        self.write()
        return entry


def agreement(logits: torch.Tensor, reference: torch.Tensor) -> dict:
    """Rows whose greedy token agrees with the reference's, and the largest logit difference."""
    logits, reference = logits.float().cpu(), reference.float().cpu()
    agree = int((logits.argmax(-1) == reference.argmax(-1)).sum())
    diff = float((logits - reference).abs().max())
    return {"argmax_agree": agree, "rows": logits.shape[0], "max_abs_logit_diff": diff}


# ---- transformers' own step ------------------------------------------------------------------------------
def load_hf(path: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    dense = dense_checkpoint(path)  # a GGUF-backed model (a store one) has its dense copy written once
    model = AutoModelForCausalLM.from_pretrained(dense, dtype=dtype, attn_implementation="sdpa", local_files_only=True)
    return model.to(device).eval()


@torch.inference_mode()
def hf_step(model, ids: torch.Tensor, new: torch.Tensor, args) -> tuple[list[float], torch.Tensor]:
    """Prefill the context into a DynamicCache, then time the one-token step over it (the cache cut
    back to the context after each, untimed). Returns the times and the step's logits."""
    from transformers import DynamicCache

    # `past_key_values` is `cache` from transformers 5.25 on, but 5.17 knows only the former
    warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated", category=FutureWarning)
    device = torch.device(args.device)
    ids, new = ids.to(device), new[:, None].to(device)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    context = ids.shape[1]
    out = {}

    def step():
        out["logits"] = model(input_ids=new, past_key_values=cache, use_cache=True).logits[:, -1]

    def back_to_context():  # a negative count: tokens to remove, in transformers 5.17 (the GPU machine's) and 5.25
        cache.crop(context - cache.get_seq_length())

    times = time_steps(step, device, args.warmup, args.steps, between=back_to_context)
    return times, out["logits"].float().cpu()


# ---- the engine's step -----------------------------------------------------------------------------------
def engine_spec(path: str, args) -> ModelSpec:
    """The spec a worker serving these batches would have: room for every row's context, graphs up
    to the largest batch, no prefix caching (the contexts share nothing anyway)."""
    rows, block = max(args.batch), 16
    per_row = -(-(args.context + 1) // block) * block
    return ModelSpec(
        path=path,
        device=args.device,
        dtype=args.dtype,
        block_size=block,
        kv_cache_tokens=rows * per_row + block,
        max_num_seqs=max(64, rows),
        enable_prefix_caching=False,
        prefill_backend=args.prefill_backend,
        cuda_graph_max_batch=rows,
    )


def decode_batch(rt, ids: torch.Tensor, new: torch.Tensor, forward) -> tuple[ScheduledBatch, list[Sequence]]:
    """B sequences of context `ids`, prefilled through the scheduler and the runner, each then given
    its new token: the scheduler's next batch, returned, is a pure decode of B rows."""
    seqs = []
    for row in range(ids.shape[0]):
        prompt = ids[row].tolist()
        req = Request(f"r{row}", prompt, SamplingParams(), seed=0, stop_token_ids=frozenset(), max_tokens=2)
        seqs.append(Sequence(req, token_ids=list(prompt), num_confirmed=len(prompt)))
        rt.scheduler.add(seqs[-1])
    while any(s.num_uncomputed for s in seqs):
        batch, failed = rt.scheduler.schedule()
        assert batch is not None and not failed, f"the pool does not hold the contexts: {failed}"
        forward(batch)
        for seq, n in zip(batch.seqs, batch.num_new):  # what ModelCore does after a forward
            seq.num_computed += n
            rt.blocks.register_full_blocks(seq)
    for seq, token in zip(seqs, new.tolist()):
        seq.token_ids.append(token)
    batch, failed = rt.scheduler.schedule()
    assert batch is not None and not failed and batch.num_decode == len(batch) == len(seqs)
    return batch, seqs


def graph_skip(rt) -> str | None:
    """Why the graph mode cannot run on this runtime, if it cannot."""
    if rt.attention_backend != "flashinfer":
        return f"attention runs {rt.attention_backend}'s backend ({rt.attention_fallback}): graphs need flashinfer"
    if not rt.runner.graph_sizes:
        return f"CUDA graph capture failed: {rt.runner.graph_error}"
    return None


def engine_mode(name: str, mode: str, spec: ModelSpec, loaded, args, work: dict, res: Results, floors: dict):
    """Every batch size in one mode, on a runtime of its own (freed once this returns)."""
    device = torch.device(args.device)
    if mode == "graph" and device.type != "cuda":
        for b in args.batch:
            res.add(name, b, mode, None, floors[b], skipped="CUDA graphs are captured on CUDA only: a CPU runs eagerly")
        print(f"# {name} {mode}: skipped (CUDA only)", flush=True)
        return
    threads = args.threads if device.type == "cpu" else None
    if mode == "eager":
        spec = spec.model_copy(update={"cuda_graph_max_batch": 0})
    rt = build_runtime(name, spec, loaded, False, None, threads)
    runner = rt.runner
    skip = graph_skip(rt) if mode == "graph" else None
    about = {"attention": rt.attention_backend, "forward": runner.forward_kind, "graph_sizes": runner.graph_sizes}
    for b in args.batch:
        if skip is not None:
            res.add(name, b, mode, None, floors[b], skipped=skip, **about)
            print(f"# {name} B={b} {mode}: skipped ({skip})", flush=True)
            continue
        ids, new, reference = work[b]
        batch, seqs = decode_batch(rt, ids, new, runner.forward)
        if mode == "graph":
            assert runner.graphs.fits(len(batch), batch.num_decode), "a decode step of B rows replays a graph"
        out = {}

        def step(batch=batch):
            out["logits"] = runner.forward(batch).logits

        times = time_steps(step, device, args.warmup, args.steps)
        rows = [next(i for i, s in enumerate(seqs) if s is q) for q in batch.seqs]  # the batch's row order
        vs_hf = agreement(out["logits"], reference[rows])
        e = res.add(name, b, mode, times, floors[b], vs_hf=vs_hf, **about)
        print(f"# {name} B={b} {mode}: {e['ms']:.3f} ms ({e['x_floor']:.2f}x floor), vs hf {vs_hf}", flush=True)
        for seq in seqs:
            rt.scheduler.remove(seq)


def free_memory(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# ---- the run ---------------------------------------------------------------------------------------------
def measure_model(name: str, path: str, args, res: Results, bandwidth: dict) -> None:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    model = load_hf(path, dtype, device)
    shapes = model_shapes(model)
    res.model(name, {"path": path, **shapes})
    floors = {}
    for b in args.batch:
        kv = b * (args.context + 1) * shapes["kv_bytes_per_token"]
        floors[b] = {
            "ms": shapes["floor_bytes"] / bandwidth["gb_per_s"] / 1e6,
            "with_kv_ms": (shapes["floor_bytes"] + kv) / bandwidth["gb_per_s"] / 1e6,
        }
    work = {}
    for b in args.batch:
        ids, new = contexts(shapes["vocab_size"], b, args.context, args.seed)
        times, logits = hf_step(model, ids, new, args)
        work[b] = (ids, new, logits)
        e = res.add(name, b, "hf", times, floors[b], cache="DynamicCache", attention="sdpa")
        print(f"# {name} B={b} hf: {e['ms']:.3f} ms ({e['x_floor']:.2f}x floor)", flush=True)
    del model
    free_memory(args.device)
    threads = args.threads if device.type == "cpu" else None
    spec = engine_spec(path, args)
    loaded = load_model(name, spec, threads)
    for mode in ("graph", "eager"):
        engine_mode(name, mode, spec, loaded, args, work, res, floors)
        free_memory(args.device)
    del loaded
    free_memory(args.device)


def table(res: Results) -> str:
    """model, B, each mode's ms and its ratio to the floor, the floor, and the rows whose greedy token the
    engine's eager step shares with the hf step."""
    rows = {}
    for m in res.data["measurements"]:
        row = rows.setdefault((m["model"], m["batch"]), {})
        row[m["mode"]] = f"{m['ms']:.3f} ({m['x_floor']:.1f}x)" if "ms" in m else "skipped"
        row["floor"] = f"{m['floor_ms']:.3f}"
        if m["mode"] == "eager" and "vs_hf" in m:
            row["agree"] = f"{m['vs_hf']['argmax_agree']}/{m['vs_hf']['rows']}"
    head = "".join(f"{c + ' ms (x floor)':>20}" for c in MODES)
    lines = [f"{'model':<8}{'B':>4}{head}{'floor ms':>10}{'eager=hf':>10}"]
    for (model, b), row in rows.items():
        cells = "".join(f"{row.get(c, '-'):>20}" for c in MODES)
        lines.append(f"{model:<8}{b:>4}{cells}{row.get('floor', '-'):>10}{row.get('agree', '-'):>10}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_arguments(p)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument(
        "--prefill-backend",
        choices=["auto", "fa2", "fa3"],
        default="auto",
        help="flashinfer's prefill kernels (ModelSpec.prefill_backend): fa2 where FA3 did not build",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="decode rows per step")
    p.add_argument("--context", type=int, default=128, help="tokens of context per row")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    p.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: the usable cores)")
    p.add_argument("--copy-mib", type=int, default=None, help="the bandwidth copy's size (default 1024; CPU 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_out/gpu"))
    args = p.parse_args(argv)
    if min(args.batch) < 1 or args.context < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--batch, --context and --steps must be positive, --warmup not negative")
    cpu = torch.device(args.device).type == "cpu"
    args.threads = args.threads or (usable_cores() if cpu else None)
    args.copy_mib = args.copy_mib or (256 if cpu else 1024)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.random_weights:
        models = random_pair(args.out / "random-pair", args.tokenizer, args.tiny)
    elif args.small and args.large:  # a store name as ModelSpec takes it, too
        models = {"small": str(ModelSpec(path=args.small).path), "large": str(ModelSpec(path=args.large).path)}
    else:
        models = demo_pair()
    device = torch.device(args.device)
    if device.type == "cpu":
        use_threads(args.threads)
    elif device.index is not None:
        torch.cuda.set_device(device)  # the events time the current device's stream
    import transformers

    name = device_name(device)
    print(f"# {name}; torch {torch.__version__}, transformers {transformers.__version__}; models {models}", flush=True)
    bandwidth = copy_bandwidth(device, args.copy_mib)
    print(f"# copy bandwidth {bandwidth['gb_per_s']:.1f} GB/s (bytes read + written)", flush=True)
    header = {
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": machine_info(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "copy_bandwidth": bandwidth,
    }
    res = Results(args.out / "decode.json", header)
    t0 = time.perf_counter()
    for name, path in models.items():
        measure_model(name, path, args, res, bandwidth)
    res.data.update(complete=True, wall_s=round(time.perf_counter() - t0, 1))
    res.write()
    print(table(res), flush=True)
    print(f"# {args.out / 'decode.json'}; {res.data['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
