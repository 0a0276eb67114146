"""Which of float32 and bfloat16 computes a model's linear layers faster on this machine: measured,
never assumed.

CPUs of one kind differ from day to day: one with native bf16 (`avx512_bf16`, `amx_bf16`) runs a
bf16 matmul about 3x faster than float32 (it reads half the bytes and computes natively); one
without runs it some 200x slower, and on one without avx512bw/vl/dq (AVX2 CPUs) torch's oneDNN
refuses bf16 outright. So `ModelSpec(dtype="auto")` on CPU times the model's own largest linear
shapes, oneDNN-packed as the engine runs them, at 1, 4 and 16 rows in each dtype, and takes
bfloat16 only where it is at least `BF16_MIN_SPEEDUP` times faster at every size. Where the CPU
level says torch's bf16 ops would raise (`native.cpu`), bf16 is not probed at all; an op that
raises while probing anyway counts as not available here, its reason in the precision line.

Each time is the best of repeated calls (a disturbance only adds time). The answer is cached
under the store home (`probes/<key>.json`, probe_cache.py), keyed by the CPU's model name, flags
and count, torch's version, the threads and the shapes, so a probe runs once per machine kind,
and again where it ran under load or its timings are implausible.
`TOKENROUTER_PROBE_SIMULATE=no-native-bf16` makes the probe report bf16 200x slower than it
measured, as on a CPU without native bf16: benchmarks use it to show nothing gets slower there.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import native
from . import probe_cache
from .onednn import not_refused

log = logging.getLogger(__name__)

BF16_MIN_SPEEDUP = 1.3
ROWS = (1, 4, 16)
# 2: block kernels beside int4; 3: each copy timed twice; 4: 64, 128 rows; 5: two passes; 6: float32;
# 7: best of the calls, the load recorded, the blocks of the model's own type; 8: torch's kernel for that type;
# 9: the CPU level in the key, blocks at every level, kernels that raise left out
PROBE_VERSION = 9
SIMULATE_ENV = "TOKENROUTER_PROBE_SIMULATE"
SLOW_BF16 = 200.0  # what `no-native-bf16` multiplies the measured bf16 times by


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: str  # "float32" or "bfloat16"
    reason: str  # one line: why, from the timings
    timings: dict  # dtype -> rows -> milliseconds per call, summed over the shapes probed
    source: str  # "measured", "cache", or where bf16 cannot run, "cpu level" or "raised" (nothing measured)
    problem: str | None = None  # why the timings are not fully trusted (measured under load, ...), or None

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def choose(timings: dict) -> tuple[str, str]:
    """(dtype, reason) from the timings: bfloat16 only where it is at least BF16_MIN_SPEEDUP times
    faster than float32 at every size probed (and ran at all)."""
    if not timings.get("bfloat16"):
        return "float32", "no bfloat16: torch's bf16 linear raised while probing it on this CPU"
    f32, b16 = timings["float32"], timings["bfloat16"]
    speedups = {int(rows): f32[rows] / b16[rows] for rows in f32}
    shown = ", ".join(f"{s:.2f}x at {r}" for r, s in sorted(speedups.items()))
    if all(s >= BF16_MIN_SPEEDUP for s in speedups.values()):
        return "bfloat16", f"bfloat16 linear layers measured {shown} rows against float32"
    return "float32", f"bfloat16 measured {shown} rows against float32 (needs >= {BF16_MIN_SPEEDUP}x at each)"


def probe_shapes(model: torch.nn.Module, limit: int = 3) -> list[tuple[int, int]]:
    """The model's largest distinct linear shapes (out, in), the output head left out: what a
    decode step spends its time on. Works on a model built on the meta device."""
    head = model.get_output_embeddings()
    shapes = {
        (m.out_features, m.in_features) for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
    }
    return sorted(shapes, key=lambda s: (-s[0] * s[1], s))[:limit]


def measure(shapes: list[tuple[int, int]], threads: int, repeats: int = 7) -> dict:
    """Milliseconds per call of oneDNN's packed linear, summed over `shapes`, per dtype and rows
    (the best of `repeats`, after a warm-up), on `threads` torch threads. A dtype whose ops raise
    is left out (torch's bf16 on a CPU without avx512bw/vl/dq), and the error logged."""
    out: dict = {"float32": {}, "bfloat16": {}}
    for dtype in (torch.float32, torch.bfloat16):
        try:
            out.update(measure_dtype(shapes, threads, dtype, repeats))
        except RuntimeError as e:
            if dtype == torch.float32:
                raise
            log.warning("the bfloat16 probe raised, so bf16 counts as not available here: %s", e)
            out["bfloat16"] = {}
    return simulated(out)


def measure_dtype(shapes: list[tuple[int, int]], threads: int, dtype: torch.dtype, repeats: int) -> dict:
    """{dtype's name: rows -> milliseconds per call, summed over `shapes`}."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    times_of: dict = {}
    try:
        gen = torch.Generator().manual_seed(0)
        for n, k in shapes:
            packed = torch.ops.mkldnn._reorder_linear_weight((torch.randn(n, k, generator=gen) * 0.02).to(dtype))
            for rows in ROWS:
                x = torch.randn(rows, k, generator=gen).to(dtype)
                for _ in range(2):
                    torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                    times.append(time.perf_counter() - t0)
                times_of[rows] = times_of.get(rows, 0.0) + 1e3 * min(times)
            del packed
    finally:
        torch.set_num_threads(before)
    return {str(dtype).removeprefix("torch."): times_of}


def bf16_raises() -> str | None:
    """What torch's oneDNN bf16 linear raises on this CPU (None: it runs), tried on a 16x16 weight."""
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 16, dtype=torch.bfloat16), w, None, "none", [], "")
    except RuntimeError as e:
        log.warning("torch's bf16 linear raised, so bf16 counts as not available here: %s", e)
        return str(e)
    return None


def simulated(timings: dict) -> dict:
    """The timings as a CPU without native bf16 would give them, where SIMULATE_ENV asks: bf16
    dense SLOW_BF16 times slower (the quantized kernels' own conversions of x are not bf16 math)."""
    if os.environ.get(SIMULATE_ENV) == "no-native-bf16" and "bfloat16" in timings:
        return {**timings, "bfloat16": {rows: SLOW_BF16 * v for rows, v in timings["bfloat16"].items()}}
    return timings


QUANTIZED_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
WORKING_SET_BYTES = 256 << 20  # more than any CPU's last-level cache here (this EPYC's: 32 MiB)


def timed_kind(kind: str | None, shape: tuple[int, int]) -> str:
    """The GGUF type the rows probe times the block kernels on: the model's own where they take it
    at this shape, else Q4_K (Q8_0 where rows are no whole 256-blocks)."""
    from .gguf_blocks import fits

    if kind is not None and fits(kind, shape[1]):
        return kind
    return "Q4_K" if shape[1] % 256 == 0 else "Q8_0"


def measure_quantized(
    shape: tuple[int, int], threads: int, repeats: int = 7, kind: str = "Q4_K", dense: str = "bfloat16"
) -> dict:
    """Milliseconds per call, per rows in QUANTIZED_ROWS (medians of `repeats` calls or more, after a
    warm-up), on one shape: oneDNN's packed linear in `dense` ("bfloat16" or "float32": what the
    quantized kernels replace, with and without fast bf16), the GGUF block kernels on blocks of
    `kind` ("blocks") where they built, and torch's kernel for that type ("int4" for Q4_K, "int8"
    for the others: `torch_kernel_for`): at one row where the block kernels are there (all
    `few_kernel` compares), at every size where it might serve. A kernel whose ops raise here
    (oneDNN's bf16 on a CPU without avx512bw/vl/dq) is left out of the timings, and said in the log.

    Each kernel cycles through copies of its weight that together outsize the CPU's caches, as a
    model's layers do: timed on one copy, a layer the cache holds looks 3-5x faster than a decode
    step reads it (bf16 most of all). Every size is measured in two passes over all sizes, and
    the faster median kept: a disturbance only adds time, and one of a second or two (a probe on
    this EPYC had the block kernels 1.5x slower than usual at 32 and 64 rows, and only there)
    would otherwise move the crossover."""
    from . import gguf_native
    from .gguf_blocks import GGUFBlockLinear
    from .int4 import Int4Linear
    from .int8_weights import Int8WeightLinear

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(*shape, generator=gen) * 0.02
        copies = lambda bits, budget=WORKING_SET_BYTES: min(64, max(2, -(-budget * 8 // (bits * w.numel()))))  # noqa: E731
        timing = (shape[1], repeats, gen)
        dtype = getattr(torch, dense)
        kernels = built({dense: lambda: [packed_dense(w, dtype) for _ in range(copies(8 * dtype.itemsize))]})
        lib, _ = gguf_native.load()
        kind = timed_kind(kind, shape)
        if lib is not None:
            values, size = gguf_native.BLOCKS[kind]
            blocks = [random_blocks(kind, shape, gen) for _ in range(copies(8 * size // values))]
            kernels["blocks"] = [GGUFBlockLinear(lib, kind, b, shape) for b in blocks]
        out = timed(kernels, QUANTIZED_ROWS, *timing)
        # torch's kernel for this type (4-bit for Q4_K, int8 per channel for the others): a scout at
        # one row (a working set of 4x this EPYC's 32 MiB cache) ...
        name, bits = torch_kernel_for(kind)
        make = (lambda: Int4Linear.from_dense(w)) if name == "int4" else (lambda: Int8WeightLinear(w))
        scout = built({name: lambda: [make() for _ in range(copies(bits, TORCH_SCOUT_BYTES))]})
        out.update(timed(scout, (1,), *timing))
        if name in out and ("blocks" not in out or out[name][1] < out["blocks"][1]):  # ... and where it may serve
            scouted = out[name][1]
            out.update(timed(built({name: lambda: [make() for _ in range(copies(bits))]}), QUANTIZED_ROWS, *timing))
            if name in out:  # the faster of the two one-row medians, as every size keeps its faster pass
                out[name][1] = min(out[name][1], scouted)
    finally:
        torch.set_num_threads(before)
    return simulated(out)


def built(makers: dict) -> dict:
    """The kernels `makers` build, those that raise here left out (oneDNN's bf16 packing on a CPU
    without avx512bw/vl/dq), and logged."""
    out = {}
    for name, make in makers.items():
        if name == "bfloat16" and not not_refused(torch.bfloat16):
            continue  # the CPU level says it would raise: not tried
        try:
            out[name] = make()
        except RuntimeError as e:
            log.warning("the %s kernel raised while probing, so it counts as not available here: %s", name, e)
    return out


def timed(kernels: dict, sizes, cols: int, repeats: int, gen: torch.Generator) -> dict:
    """`time_kernels`, interleaved; where a call raises, each kernel alone, those that raise left out."""
    try:
        return time_kernels(kernels, sizes, cols, repeats, gen)
    except RuntimeError:
        out = {}
        for name, ks in kernels.items():
            try:
                out.update(time_kernels({name: ks}, sizes, cols, repeats, gen))
            except RuntimeError as e:
                log.warning("the %s kernel raised while probing, so it counts as not available here: %s", name, e)
        return out


TORCH_SCOUT_BYTES = 128 << 20


def torch_kernel_for(kind: str) -> tuple[str, int]:
    """torch's kernel for a GGUF type where the block kernels do not serve it, and its bits a
    weight: Q4_K as 4-bit groups, every other type as int8 per channel (quant/kernels.py)."""
    return ("int4", 4) if kind == "Q4_K" else ("int8", 8)


def time_kernels(kernels: dict, sizes, cols: int, repeats: int, gen: torch.Generator) -> dict:
    """kernel -> rows -> milliseconds per call (each copy called in turn), best of two passes."""
    out: dict = {name: {} for name in kernels}
    for _ in range(2):
        for rows in sizes:
            x = torch.randn(rows, cols, generator=gen).to(torch.bfloat16)
            for name, ks in kernels.items():
                ks[0](x)  # warm-up: oneDNN makes its primitive for this size on the first call
                times = []
                for i in range(max(repeats, 2 * len(ks))):  # every copy twice: one slow call is noise
                    t0 = time.perf_counter()
                    ks[i % len(ks)](x)
                    times.append(time.perf_counter() - t0)
                ms = 1e3 * statistics.median(times)
                out[name][rows] = min(ms, out[name].get(rows, ms))
    return out


def packed_dense(w: torch.Tensor, dtype: torch.dtype):
    """A call of oneDNN's linear on `w` in `dtype`, packed as the engine packs it (x cast to `dtype`)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype))
    return lambda x: torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, None, "none", [], "")


def random_blocks(kind: str, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """Blocks of `kind` of random codes (weights of about 0.02 and less): something to time."""
    from .gguf_native import BLOCKS, SCALES

    n, k = shape
    values, size = BLOCKS[kind]
    b = torch.randint(0, 256, (n, k // values, size), dtype=torch.uint8, generator=gen)
    for at in SCALES[kind]:
        b[..., at : at + 2] = torch.tensor([2e-4], dtype=torch.float16).view(torch.uint8)
    return b.reshape(n, -1)


def few_kernel(timings: dict) -> str:
    """Which quantized kernel serves steps of few rows: the GGUF block kernels where they were
    measured no slower than torch's kernel for the type (int4 or int8) at one row (or it did not
    run), else torch's."""
    name = "int4" if "int4" in timings else "int8"
    blocks, other = timings.get("blocks"), timings.get(name)
    if not other:
        return "blocks"
    one = lambda t: t.get(1, t.get("1"))  # noqa: E731 (keys are strings once cached)
    return "blocks" if blocks and one(blocks) <= one(other) else name


def blocks_beat_float32(timings: dict, rows=None) -> bool:
    """Whether the GGUF block kernels were measured faster than float32 dense at every size (or at
    each of `rows`): a CPU without fast bf16 then computes a GGUF's layers on them (in float32)
    rather than dequantized."""
    blocks, f32 = timings.get("blocks"), timings.get("float32")
    if not (blocks and f32):
        return False
    blocks, f32 = ({int(r): v for r, v in t.items()} for t in (blocks, f32))  # cached JSON keys are strings
    return all(blocks[r] < f32[r] for r in (rows or f32))


COPIES_MIN_SPEEDUP = 1.2


def crossover(timings: dict) -> int:
    """The most rows at which the quantized kernel `few_kernel` picks is not clearly slower than
    bf16, checked from one row up (0: bf16 wins from the first row). Clearly: bf16 at least
    COPIES_MIN_SPEEDUP times faster, as bf16 copies cost the model's weights in bf16 again and
    their dequantization at every load (the demo 0.5B's Q5_0 blocks run 128 rows 1.09x slower
    than bf16 here: not worth 1 GB)."""
    few = timings[few_kernel(timings)]
    if not timings.get("bfloat16"):  # bf16 did not run here: the quantized kernels serve every size
        return max(QUANTIZED_ROWS)
    best = 0
    for rows in sorted(few, key=int):
        if few[rows] >= COPIES_MIN_SPEEDUP * timings["bfloat16"][rows]:
            break
        best = int(rows)
    return best


def quantized_rows(
    shape: tuple[int, int],
    threads: int,
    home: str | Path | None = None,
    kind: str | None = None,
    dense: str = "bfloat16",
) -> tuple[int, dict]:
    """(rows, timings): up to how many rows a step computes this machine's largest layer faster
    from its quantized weights (`kind`: the model's GGUF type there) than from bf16 ones
    (`by_rows.py`; 0 where `dense` is "float32": the quantized kernels are then timed against
    float32 weights); cached as `precision_for` is."""
    kind = timed_kind(kind, shape)
    info = {
        "version": PROBE_VERSION,
        "kind": "quantized-rows",
        **native.cpu_identity(),
        **probe_cache.machine(),
        "torch": torch.__version__,
        "threads": threads,
        "shape": list(shape),
        "blocks": _blocks_built(),
        "block_type": kind,
        "dense": dense,
        "simulate": os.environ.get(SIMULATE_ENV),
    }
    path = probe_cache.probe_path("rows", info, home)
    record = probe_cache.measured(path, info, lambda: measure_quantized(shape, threads, kind=kind, dense=dense))
    return (crossover(record.timings) if dense == "bfloat16" else 0), record.timings


def _blocks_built() -> str | None:
    """The GGUF block kernels' build (its file name holds the source's key), or None."""
    from . import gguf_native

    lib = gguf_native.load()[0]
    return None if lib is None else lib.path.name


def precision_for(
    shapes: list[tuple[int, int]], threads: int, home: str | Path | None = None, refresh: bool = False
) -> PrecisionChoice:
    """The dtype this machine computes these shapes fastest in: from the cache, else measured now
    (about a second) and cached. float32 without a probe where torch's bf16 ops would raise at
    this CPU level."""
    refused = native.cpu.current().torch_bf16
    if refused is not None:
        return PrecisionChoice("float32", f"no bfloat16: {refused}", {}, "cpu level")
    raised = bf16_raises()
    if raised is not None:  # not cached: what raised may run on a later load (another torch)
        return PrecisionChoice("float32", f"no bfloat16: torch's bf16 linear raised here: {raised}", {}, "raised")
    info = {
        "version": PROBE_VERSION,
        **native.cpu_identity(),
        **probe_cache.machine(),
        "torch": torch.__version__,
        "threads": threads,
        "shapes": [list(s) for s in shapes],
        "simulate": os.environ.get(SIMULATE_ENV),
    }
    path = probe_cache.probe_path("precision", info, home)
    fresh = refresh or probe_cache.read(path, info) is None
    record = probe_cache.measured(path, info, lambda: measure(shapes, threads), refresh=refresh)
    source = "measured" if fresh or record.runs > 1 and not record.trusted else "cache"
    return PrecisionChoice(*choose(record.timings), record.timings, source, record.problem)
