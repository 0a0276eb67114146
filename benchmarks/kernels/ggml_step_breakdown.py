#!/usr/bin/env python
"""One llama.cpp decode step of a GGUF model, timed op by op, on the engine's thread count (2).

What it measures: llama-cpp-python's own llama.cpp (its low-level API, no `Llama` object) loads the
store's GGUF, prefills a --prompt-tokens prompt, then decodes --steps single tokens (teacher-forced:
the next token of a fixed text, since which token is fed does not change the work). Three contexts
on the one model run the same steps, interleaved step by step so a drift of the machine hits all:

  plain       no callback: llama_decode's wall time, the figure to compare a step against
  asks-only   an eval callback that answers no to every node: the graph still runs in one piece,
              this prices the Python callbacks alone (one per node per step)
  timed       the callback answers yes for every node that computes (not the empty NONE, VIEW,
              RESHAPE, PERMUTE, TRANSPOSE): each node's compute time is read

How: llama.cpp hands its scheduler the context's `cb_eval` (ggml_backend_sched_eval_callback,
`bool cb(struct ggml_tensor * t, bool ask, void * user_data)`). With a callback the scheduler walks
the graph asking (ask=True) node by node; once a node is wanted it computes the nodes asked so far
as one graph view, then calls back with ask=False (the `llama-eval-callback` tool reads tensors this
way). Wanting every node therefore splits the graph into one ggml_graph_compute per node, and the
time from the ask=True that wanted a node to its ask=False is that node's compute (plus the empty
nodes before it, which cost nothing). That split is the callback's cost: each node becomes its own
graph compute (plan, thread-pool wake and join; the unsplit graph only syncs its threads at a barrier
between nodes), and Python runs twice per node. So a node's time carries one such round trip (a few
us, which shows on the small ops), and the output prices it: each variant's wall time against the
plain step's, and the nodes' sum against it (medians of per-step differences, the steps run side by side).

The node is read through ctypes: `struct ggml_tensor` as include/ggml.h of llama-cpp-python 0.3.36
lays it out (checked on every node: the name field must equal ggml_get_name), its op named by
ggml_op_desc (the unary or GLU op for those), its src[0] giving the weight's type, shape and
buffer for MUL_MAT and GET_ROWS. Rows group by (op, type, shape): a weight's ggml shape is
ne0 x ne1, ne0 the input (K) dim, so ffn_down of the 1.5B is 8960x1536; other ops show their output's
type and shape. The buffer says whether llama.cpp's CPU backend repacked the weight for this CPU
(CPU_REPACK: interleaved layouts with their own kernels; on the AVX-512 EPYC here Q4_K is, Q5_0, Q6_K
and Q8_0 are not); the load log's buffer lines are kept too. Figures are medians over steps.

    python benchmarks/kernels/ggml_step_breakdown.py --model qwen-coder-1.5b \
        --json benchmarks/results/step-breakdown/ggml-1.5b.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import llama_cpp
    from llama_cpp import llama_cpp as llama
except ImportError:  # main() says what to install; --help needs none
    llama_cpp = llama = None

from tokenrouter import store
from tokenrouter.bench import machine_info
from tokenrouter.bench.machine import CpuMeter

THREADS = 2  # the engine's: the machine's cores
GGML_MAX_DIMS = 4  # include/ggml.h of llama-cpp-python 0.3.36 (ggml 0.25.3)
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = GGML_MAX_NAME = 64
EMPTY_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}  # no compute on the CPU backend
WEIGHT_OPS = {"MUL_MAT", "MUL_MAT_ID", "GET_ROWS"}  # described by their src[0]
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
TEXT = (  # the prompt and the fed tokens: this, repeated
    "def merge_sorted(left: list[int], right: list[int]) -> list[int]:\n"
    "    merged, i, j = [], 0, 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            merged.append(left[i])\n            i += 1\n"
    "        else:\n            merged.append(right[j])\n            j += 1\n"
    "    return merged + left[i:] + right[j:]\n\n\n"
)


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of include/ggml.h (llama-cpp-python 0.3.36), the fields in its order."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def load_ggml() -> ctypes.CDLL:
    """libggml-base of this llama-cpp-python (the one its libllama uses), its getters declared."""
    ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    for name, args in [
        ("ggml_get_name", [ctypes.c_void_p]),
        ("ggml_op_desc", [ctypes.c_void_p]),
        ("ggml_op_name", [ctypes.c_int]),
        ("ggml_type_name", [ctypes.c_int]),
        ("ggml_backend_buffer_name", [ctypes.c_void_p]),
    ]:
        getattr(ggml, name).argtypes = args
        getattr(ggml, name).restype = ctypes.c_char_p
    return ggml


class NodeTimer:
    """The eval callback: with `timing`, wants every computing node and times it; else wants none."""

    def __init__(self, ggml: ctypes.CDLL, timing: bool):
        self.ggml = ggml
        self.timing = timing
        self.nodes: list[tuple[tuple[str, str, str, str], float]] = []  # this step's (key, seconds)
        self.wanted_at = 0.0
        self.asks = 0  # asks so far (the graph's nodes, empty ones too, once per step)
        self.callback = llama.ggml_backend_sched_eval_callback(self.on_node)

    def on_node(self, address: int, ask: bool, user_data: int) -> bool:
        if ask:
            self.asks += 1
            if not self.timing or self.ggml.ggml_op_name(GgmlTensor.from_address(address).op).decode() in EMPTY_OPS:
                return False
            self.wanted_at = time.perf_counter()
            return True
        seconds = time.perf_counter() - self.wanted_at
        self.nodes.append((self.describe(address), seconds))
        return True

    def describe(self, address: int) -> tuple[str, str, str, str]:
        """(op, type, shape, buffer) of a node: its weight's for MUL_MAT and GET_ROWS, its own else."""
        node = GgmlTensor.from_address(address)
        assert node.name == self.ggml.ggml_get_name(address), "struct ggml_tensor does not match this ggml"
        op = self.ggml.ggml_op_desc(address).decode()
        source = GgmlTensor.from_address(node.src[0]) if op in WEIGHT_OPS and node.src[0] else node
        dims = list(source.ne)
        while len(dims) > 1 and dims[-1] == 1:
            dims.pop()
        buffer = self.ggml.ggml_backend_buffer_name(source.buffer).decode() if op in WEIGHT_OPS else ""
        return op, self.ggml.ggml_type_name(source.type).decode(), "x".join(map(str, dims)), buffer


def new_context(model, prompt_tokens: int, flash_attn: str, timer: NodeTimer | None):
    params = llama.llama_context_default_params()
    params.n_ctx = 256
    params.n_batch = params.n_ubatch = prompt_tokens
    params.n_threads = params.n_threads_batch = THREADS
    params.flash_attn_type = FLASH_ATTN[flash_attn]
    if timer is not None:
        params.cb_eval = timer.callback
    context = llama.llama_init_from_model(model, params)
    assert context, "llama_init_from_model failed"
    return context


def decode(context, tokens: list[int]) -> float:
    """llama_decode of `tokens` after what the context holds; its wall seconds."""
    array = (llama.llama_token * len(tokens))(*tokens)
    started = time.perf_counter()
    status = llama.llama_decode(context, llama.llama_batch_get_one(array, len(tokens)))
    llama.llama_synchronize(context)
    assert status == 0, f"llama_decode returned {status}"
    return time.perf_counter() - started


def tokenize(model, count: int) -> list[int]:
    vocab = llama.llama_model_get_vocab(model)
    text = (TEXT * 20).encode()
    array = (llama.llama_token * len(text))()
    n = llama.llama_tokenize(vocab, text, len(text), array, len(text), False, False)
    assert n >= count, f"the text gives {n} tokens, {count} wanted"
    return list(array[:count])


def per_op_rows(steps: list[list[tuple[tuple, float]]]) -> list[dict]:
    """Rows by (op, type, shape, buffer): calls per step, medians over steps of us/call and ms/step."""
    per_step = []
    for nodes in steps:
        totals = defaultdict(lambda: [0, 0.0])
        for key, seconds in nodes:
            totals[key][0] += 1
            totals[key][1] += seconds
        per_step.append(totals)
    rows = []
    for key in {k for totals in per_step for k in totals}:
        seen = [totals[key] for totals in per_step if key in totals]
        calls = round(statistics.median(calls for calls, _ in seen))
        us_per_call = round(statistics.median(1e6 * s / c for c, s in seen), 2)
        ms_per_step = round(statistics.median(1e3 * s for _, s in seen), 4)
        rows.append(dict(zip(["op", "type", "shape", "buffer"], key)) | {"calls": calls, "steps_seen": len(seen)})
        rows[-1] |= {"us_per_call": us_per_call, "ms_per_step": ms_per_step}
    return sorted(rows, key=lambda row: -row["ms_per_step"])


def markdown(report: dict) -> str:
    step, cost = report["step_ms"], report["over_plain_ms"]
    lines = [
        f"### llama.cpp decode step, {report['model']} ({report['gguf']}), {THREADS} threads, flash_attn "
        f"{report['flash_attn']}, KV at {report['prompt_tokens']}+ tokens, medians of {report['steps']} steps",
        "",
        "| op | type | shape (ggml ne0 x ne1: a weight's in x out) | buffer | calls | us/call | ms/step | share |",
        "|---|---|---|---|--:|--:|--:|--:|",
    ]
    for row in report["ops"]:
        share = row["ms_per_step"] / step["node_sum"]
        lines.append(
            f"| {row['op']} | {row['type']} | {row['shape']} | {row['buffer']} | {row['calls']} "
            f"| {row['us_per_call']:.1f} | {row['ms_per_step']:.3f} | {share:.1%} |"
        )
    lines += [
        "",
        f"- step wall, no callback: **{step['plain']:.2f} ms** (other processes: {report['foreign_cores']} cores)",
        f"- with a callback that wants no node: {step['asks_only']:.2f} ms "
        f"({cost['asks_only']:+.2f} ms: {report['graph_nodes_per_step']} Python asks)",
        f"- split per node and timed ({report['timed_nodes_per_step']} computing nodes): {step['timed']:.2f} ms "
        f"({cost['timed']:+.2f} ms: the callback's whole cost)",
        f"- the timed nodes sum to {step['node_sum']:.2f} ms (the shares' whole), {cost['node_sum']:+.2f} ms against "
        "the plain step: per-node thread-pool round trips, less graph build and output copy",
        "- buffers, from llama.cpp's log:",
        *(f"  - `{line}`" for line in report["buffers"]),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder-1.5b", help="a store model with a GGUF")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per context")
    parser.add_argument("--warmup", type=int, default=2, help="untimed decode steps per context first")
    parser.add_argument("--flash-attn", choices=sorted(FLASH_ATTN), default="off", help="off: as `Llama()`")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    if llama is None:
        raise SystemExit("needs llama-cpp-python: pip install 'tokenrouter[anchor]'")

    log: list[str] = []
    log_callback = llama.llama_log_callback(lambda level, text, data: log.append(text.decode(errors="replace")))
    llama.llama_log_set(log_callback, None)
    llama.llama_backend_init()
    gguf = store.gguf_for(store.ensure_model(args.model))
    model_params = llama.llama_model_default_params()
    model_params.n_gpu_layers = 0
    model = llama.llama_model_load_from_file(str(gguf).encode(), model_params)
    assert model, f"could not load {gguf}"
    ggml = load_ggml()
    asks_only, timed = NodeTimer(ggml, timing=False), NodeTimer(ggml, timing=True)
    timers = {"plain": None, "asks_only": asks_only, "timed": timed}
    contexts = {name: new_context(model, args.prompt_tokens, args.flash_attn, timer) for name, timer in timers.items()}
    tokens = tokenize(model, args.prompt_tokens + args.warmup + args.steps)
    walls: dict[str, list[float]] = {name: [] for name in contexts}
    steps: list[list[tuple[tuple, float]]] = []  # the timed context's nodes, per step
    asks: list[int] = []  # the asks-only context's asks, per step
    for context in contexts.values():
        decode(context, tokens[: args.prompt_tokens])
    with CpuMeter() as cpu:  # other processes' cores while the steps run: > 0.1 distorts them
        for position in range(args.prompt_tokens, len(tokens)):
            timed.nodes, asks_only.asks = [], 0
            for name, context in contexts.items():
                walls[name].append(1e3 * decode(context, [tokens[position]]))
            if position >= args.prompt_tokens + args.warmup:
                steps.append(timed.nodes)
                asks.append(asks_only.asks)
    walls = {name: ms[args.warmup :] for name, ms in walls.items()}

    walls["node_sum"] = [1e3 * sum(seconds for _, seconds in nodes) for nodes in steps]
    paired = {name: [ms - plain for ms, plain in zip(walls[name], walls["plain"])] for name in walls if name != "plain"}
    report = {
        "model": args.model,
        "gguf": gguf.name,
        "llama_cpp_python": llama_cpp.__version__,
        "threads": THREADS,
        "prompt_tokens": args.prompt_tokens,
        "steps": args.steps,
        "flash_attn": args.flash_attn,
        "graph_nodes_per_step": round(statistics.median(asks)),
        "timed_nodes_per_step": round(statistics.median(len(nodes) for nodes in steps)),
        "step_ms": {name: round(statistics.median(ms), 3) for name, ms in walls.items()},
        "over_plain_ms": {name: round(statistics.median(ms), 3) for name, ms in paired.items()},  # paired by step
        "step_ms_each": {name: [round(ms, 3) for ms in values] for name, values in walls.items()},
        "buffers": list(dict.fromkeys(line.strip() for line in "".join(log).splitlines() if "buffer" in line)),
        "ops": per_op_rows(steps),
        "foreign_cores": round(cpu.foreign_cores, 2),
        "machine": machine_info(),
    }
    for context in contexts.values():
        llama.llama_free(context)
    llama.llama_model_free(model)
    print(markdown(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
