"""A worker's step-latency profile: how long a step takes for b decode rows and c catch-up tokens.

`measure(core)` runs a model core's own `ModelRunner.forward` on synthetic batches: dummy
sequences whose KV blocks come from (and go back to) the core's BlockManager, b decode rows of
`context` cached tokens each, plus one catch-up row of c new tokens after `context` cached ones
(a request back from a peer). It must run in the thread that steps the core, between steps
(`WorkerThread.call`; `Engine.profile()` sends it). Each point is the median of a few
timed runs of forward + reading the sampled tokens back (so a GPU step is waited for), taken
round robin over the points.

The grid is a cross, L(b, 0) for every b and L(1, c) for every c, plus the corner (b_max, c_max).
The throughput model reads it as `TableLatency`, seconds against the tokens in the step (b + c),
which is what a step's cost follows (b decode rows and one row of c cost about what b + c decode
rows do); `LatencyModel` (a + s*b + k*c, least squares with s, k >= 0) is kept as a summary. Profiles are
cached as JSON under the store home, `profiles/<key>.json`, keyed by the model path, dtype,
device, kernels (linear layers, attention backend, CUDA graph sizes), block size, torch threads
and the grid, and reused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import re
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import SamplingParams
from ..files import write_text_atomic
from ..engine.batch import ScheduledBatch
from ..engine.sequence import Request, SeqStatus, Sequence
from .throughput_model import LatencyModel, TableLatency

if TYPE_CHECKING:
    from ..engine.model_core import ModelCore

log = logging.getLogger(__name__)

PROFILE_VERSION = 2  # 2: samples taken round robin over the points
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
CATCH_UP_TOKENS = (0, 8, 32, 128)
REPEATS = 3
CONTEXT = 64  # cached tokens of every dummy sequence


@dataclass(frozen=True)
class ProfilePoint:
    b: int  # decode rows
    c: int  # catch-up tokens (one extra row), 0 for none
    latency_s: float  # median of samples
    samples: tuple[float, ...] = ()


@dataclass
class LatencyProfile:
    model: str
    key: str
    info: dict  # what the key is made of
    points: list[ProfilePoint]
    fit: LatencyModel
    created: float = 0.0  # time.time() of the measurement
    context_used: int = 0  # cached tokens per dummy sequence (CONTEXT, less where memory is short)
    source: str = "measured"  # "measured" now, or "cache" (read from disk)
    measured_in_thread: str | None = None  # not stored: the thread that ran the forwards
    path: Path | None = None  # where it is cached

    @property
    def table(self) -> TableLatency:
        """Seconds against tokens in the step, from the measured points."""
        return TableLatency.from_points((p.b + p.c, p.latency_s) for p in self.points)

    def to_json(self) -> dict:
        return {
            "version": PROFILE_VERSION,
            "model": self.model,
            "key": self.key,
            "info": self.info,
            "created": self.created,
            "context_used": self.context_used,
            "fit": {"a": self.fit.a, "s": self.fit.s, "k": self.fit.k},
            "points": [{"b": p.b, "c": p.c, "latency_s": p.latency_s, "samples": list(p.samples)} for p in self.points],
        }

    @classmethod
    def from_json(cls, d: dict, path: Path | None = None) -> LatencyProfile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {d.get('version')!r}, expected {PROFILE_VERSION}")
        return cls(
            model=d["model"],
            key=d["key"],
            info=d["info"],
            points=[
                ProfilePoint(int(p["b"]), int(p["c"]), float(p["latency_s"]), tuple(p["samples"])) for p in d["points"]
            ],
            fit=LatencyModel(**{k: float(v) for k, v in d["fit"].items()}),
            created=float(d.get("created", 0.0)),
            context_used=int(d.get("context_used", 0)),
            source="cache",
            path=path,
        )


# ---- cache -------------------------------------------------------------------------------
def profile_info(core: ModelCore, batch_sizes=BATCH_SIZES, catch_up_tokens=CATCH_UP_TOKENS, context=CONTEXT) -> dict:
    """What a profile depends on (the cache key is a hash of it); the core must be loaded."""
    loaded = core.loaded
    assert loaded is not None, "the model is not loaded"
    return {
        "model_path": str(Path(core.spec.path).resolve()),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": str(loaded.device),
        "linear_kernel": loaded.linear_kernel,
        "attention_backend": core.attention_backend,
        "cuda_graph_batch_sizes": core.cuda_graph_sizes,
        "block_size": core.spec.block_size,
        "torch_threads": core.torch_threads,
        "max_num_seqs": core.spec.max_num_seqs,
        "max_num_batched_tokens": core.spec.max_num_batched_tokens,
        "batch_sizes": list(batch_sizes),
        "catch_up_tokens": list(catch_up_tokens),
        "context": context,
    }


def profile_key(info: dict) -> str:
    digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(info["model_path"]).name)[:40] or "model"
    return f"{stem}-{digest}"


def profile_path(key: str, home: str | Path | None = None) -> Path:
    from .. import store

    return store.home_dir(home) / "profiles" / f"{key}.json"


def load_cached(info: dict, home: str | Path | None = None) -> LatencyProfile | None:
    """The cached profile for `info`, or None (missing, unreadable or from another version)."""
    path = profile_path(profile_key(info), home)
    try:
        with open(path) as f:
            prof = LatencyProfile.from_json(json.load(f), path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable latency profile %s: %s", path, e)
        return None
    return prof if prof.info == info else None


def save(profile: LatencyProfile, home: str | Path | None = None) -> Path:
    """Write the profile atomically (a temporary file renamed into place)."""
    path = write_text_atomic(profile_path(profile.key, home), json.dumps(profile.to_json(), indent=1))
    profile.path = path
    return path


# ---- fit ---------------------------------------------------------------------------------
def fit_latency(points: list[ProfilePoint]) -> LatencyModel:
    """Least squares a + s*b + k*c over the points, with s, k >= 0 (and a >= 0)."""
    import numpy as np

    b = np.array([p.b for p in points], dtype=float)
    c = np.array([p.c for p in points], dtype=float)
    y = np.array([p.latency_s for p in points], dtype=float)
    best = None
    for use_s, use_k in itertools.product((True, False), repeat=2):
        cols = [np.ones_like(b)] + ([b] if use_s else []) + ([c] if use_k else [])
        coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1), y, rcond=None)
        coef = list(coef)
        a = coef.pop(0)
        s = coef.pop(0) if use_s else 0.0
        k = coef.pop(0) if use_k else 0.0
        if s < 0 or k < 0:
            continue
        resid = float(np.sum((a + s * b + k * c - y) ** 2))
        if best is None or resid < best[0]:
            best = (resid, a, s, k)
    assert best is not None  # a alone is always feasible
    _, a, s, k = best
    a = max(float(a), 0.0)
    if a + s <= 0:
        a = max(float(y.min()), 1e-9)
    return LatencyModel(a=a, s=float(s), k=float(k))


# ---- measuring (in the worker's thread) --------------------------------------------------
def _grid(batch_sizes, catch_up_tokens, max_b: int, budget: int) -> list[tuple[int, int]]:
    bs = sorted({b for b in batch_sizes if 1 <= b <= max_b} | ({max_b} if max_b < max(batch_sizes) else set()))
    cs = sorted({min(c, budget - 1) for c in catch_up_tokens if c > 0 and budget > 1})
    points = [(b, 0) for b in bs] + [(1, c) for c in cs]
    if cs and bs[-1] > 1:
        points.append((bs[-1], min(cs[-1], budget - bs[-1])) if budget - bs[-1] > 0 else (bs[-1], 0))
    return sorted({(b, c) for b, c in points if b + c <= budget})


def measure(
    core: ModelCore,
    batch_sizes=BATCH_SIZES,
    catch_up_tokens=CATCH_UP_TOKENS,
    repeats: int = REPEATS,
    context: int = CONTEXT,
) -> LatencyProfile:
    """Time the core's forward on synthetic batches. Runs in the thread that steps the core,
    between steps (`WorkerThread.call`)."""
    info = profile_info(core, batch_sizes, catch_up_tokens, context)
    spec, blocks, loaded = core.spec, core.blocks, core.loaded
    assert loaded is not None
    budget = spec.max_num_batched_tokens
    points = _grid(batch_sizes, catch_up_tokens, spec.max_num_seqs, budget)
    if not points:
        raise RuntimeError(f"model {core.name!r}: no profile point fits max_num_batched_tokens={budget}")
    c_max = max(c for _, c in points)
    ctx = max(1, min(context, loaded.max_model_len - c_max - 2))

    def blocks_needed(ctx: int, b_max: int) -> int:
        return b_max * blocks.blocks_for(ctx + 1) + (blocks.blocks_for(ctx + c_max) if c_max else 0)

    while ctx > 1 and blocks_needed(ctx, max(b for b, _ in points)) > blocks.num_free:
        ctx //= 2
    while points and blocks_needed(ctx, max(b for b, _ in points)) > blocks.num_free:
        b_top = max(b for b, _ in points)
        points = [(b, c) for b, c in points if b < b_top]
    if not points:
        raise RuntimeError(f"model {core.name!r}: not enough free KV blocks to profile ({blocks.num_free} free)")
    b_max = max(b for b, _ in points)

    vocab = loaded.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1)

    def dummy(i: int, length: int) -> Sequence:
        ids = [(7 * i + 13 * j + 3) % vocab for j in range(length)]
        req = Request(f"__profile_{i}", ids, params, seed=0, stop_token_ids=frozenset(), max_tokens=1)
        seq = Sequence(req, token_ids=list(ids), status=SeqStatus.RUNNING)
        if not blocks.grow(seq, length):
            raise RuntimeError(f"model {core.name!r}: KV blocks ran out while profiling")
        seq.num_computed = ctx
        return seq

    seqs: list[Sequence] = []
    try:
        decodes = []
        for i in range(b_max):
            decodes.append(dummy(i, ctx + 1))
            seqs.append(decodes[-1])
        catch = None
        if c_max:
            catch = dummy(b_max, ctx + c_max)
            seqs.append(catch)
        full = list(catch.token_ids) if catch is not None else []

        def run(b: int, c: int) -> float:
            rows, num_new = decodes[:b], [1] * b
            if c:
                catch.token_ids = full[: ctx + c]
                rows = rows + [catch]
                num_new = num_new + [c]
            batch = ScheduledBatch(seqs=rows, num_new=num_new, num_decode=b)
            t0 = time.perf_counter()
            out = core.runner.forward(batch)
            out.logits.argmax(dim=-1).tolist()  # waits for the device, like a real step's sampling
            return time.perf_counter() - t0

        run(1, 0)  # warm-up: allocator, first-call paths
        run(*max(points))
        # Round robin over the points, not each point's samples in a row: a burst of other work
        # on the machine (another process, a peer worker's prefill) then slows one sample of many
        # points, which the medians drop, instead of every sample of one point, which skews the
        # table's shape (a one-row step measured slower than a two-row one on the demo pair).
        samples: dict[tuple[int, int], list[float]] = {p: [] for p in points}
        for _ in range(max(1, repeats)):
            for b, c in points:
                samples[(b, c)].append(run(b, c))
        measured = [ProfilePoint(b, c, statistics.median(samples[(b, c)]), tuple(samples[(b, c)])) for b, c in points]
    finally:
        for seq in seqs:
            blocks.free(seq)
    return LatencyProfile(
        model=core.name,
        key=profile_key(info),
        info=info,
        points=measured,
        fit=fit_latency(measured),
        created=time.time(),
        context_used=ctx,
        source="measured",
        measured_in_thread=threading.current_thread().name,
    )
