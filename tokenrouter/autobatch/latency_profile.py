"""A worker's step-latency profile: how long a step takes for b decode rows and c catch-up tokens.

`measure(core)` times a model core's forward on synthetic batches (`ModelCore.profile_step`):
dummy requests whose KV blocks come from (and go back to) the core's pool, b decode rows of
`context` cached tokens each, plus one catch-up row of c new tokens after `context` cached ones
(a request back from a peer). It must run in the thread that steps the core, between steps
(`WorkerThread.call`; `Engine.profile()` sends it). Each point is the fastest of a few timed
runs of forward + reading the sampled tokens back (so a GPU step is waited for), taken round
robin over the points: other work on the machine only ever adds time, and on a CPU it adds a
lot (two OpenMP pools on the same cores make a step 10-40x slower). A profile in which a
smaller step costs more than a larger one (`disorder`) was measured while the machine was busy:
it is measured again, never cached, and a cached one is measured anew (a cached profile of the
demo 1.5B had a one-row step at 1.95 s and a two-row one at 0.046 s, and `Speculative(k="auto")`
planned with it drafted at every load).

The grid is a cross, L(b, 0) for every b and L(1, c) for every c, plus the corner (b_max, c_max).
The throughput model reads it as `TableLatency`, seconds against the tokens in the step (b + c),
which is what a step's cost follows (b decode rows and one row of c cost about what b + c decode
rows do); `LatencyModel` (a + s*b + k*c, least squares with s, k >= 0) is kept as a summary.
Beside it, checks: b rows of t tokens each with logits at every position, the step a verifier
runs over k = t - 1 drafts per request (`VerifyLatency`, which `Speculative(k="auto")` plans
with): they keep logits at every position and attend over their new tokens, which the step
table's b * t decode rows need not match (on the demo 1.5B they did, within 3%, once short
extend rows were batched; with one attention call per row they had cost 40% more). Profiles are
cached as JSON under the store home, `profiles/<key>.json`, keyed by the model path, dtype,
device, kernels (linear layers, attention backend, CUDA graph sizes), on CPU the CPU and its
level (`engine.cpu_identity()`), block size, torch threads and the grid, and reused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine import cpu_identity
from ..files import write_text_atomic
from .latency_models import LatencyModel, TableLatency, VerifyLatency

if TYPE_CHECKING:
    from ..engine import ModelCore

log = logging.getLogger(__name__)

# 2: samples taken round robin over the points; 3: checks (b rows of t tokens); 4: the fastest sample,
# and a disordered profile is neither kept nor cached
PROFILE_VERSION = 4
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
CATCH_UP_TOKENS = (0, 8, 32, 128)
CHECK_BATCH_SIZES = (1, 4, 16)
CHECK_TOKENS = (2, 3, 5, 9)  # k + 1 for k = 1, 2, 4, 8 drafts
REPEATS = 3
RETRIES = 2  # more rounds over every point where the profile came out disordered
DISORDER_SLACK = 1.5  # a step may cost up to this much more than a larger one (noise), not more
CONTEXT = 64  # cached tokens of every dummy sequence


@dataclass(frozen=True)
class ProfilePoint:
    b: int  # rows: decode rows, or with t > 1 a check's rows
    c: int  # catch-up tokens (one extra row), 0 for none
    latency_s: float  # the fastest sample
    samples: tuple[float, ...] = ()
    t: int = 1  # new tokens in each of the b rows; > 1: a check, logits at every position


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
    def disorder(self) -> list[str]:
        """Pairs of points where the smaller step (no more rows, catch-up or new tokens each) costs
        over DISORDER_SLACK times the larger one: the mark of a machine busy while it was measured."""
        return disorder(self.points)

    @property
    def step_points(self) -> list[ProfilePoint]:
        """The points of decode rows and a catch-up row (not the checks)."""
        return [p for p in self.points if p.t == 1]

    @property
    def table(self) -> TableLatency:
        """Seconds against tokens in the step, from the measured points."""
        return TableLatency.from_points((p.b + p.c, p.latency_s) for p in self.step_points)

    @property
    def checks(self) -> VerifyLatency:
        """Seconds for b rows of t tokens with logits at every position (a verifier's check)."""
        return VerifyLatency.from_points(self.table, ((p.b, p.t, p.latency_s) for p in self.points if p.t > 1))

    def to_json(self) -> dict:
        return {
            "version": PROFILE_VERSION,
            "model": self.model,
            "key": self.key,
            "info": self.info,
            "created": self.created,
            "context_used": self.context_used,
            "fit": {"a": self.fit.a, "s": self.fit.s, "k": self.fit.k},
            "points": [
                {"b": p.b, "c": p.c, "t": p.t, "latency_s": p.latency_s, "samples": list(p.samples)}
                for p in self.points
            ],
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
                ProfilePoint(int(p["b"]), int(p["c"]), float(p["latency_s"]), tuple(p["samples"]), int(p["t"]))
                for p in d["points"]
            ],
            fit=LatencyModel(**{k: float(v) for k, v in d["fit"].items()}),
            created=float(d.get("created", 0.0)),
            context_used=int(d.get("context_used", 0)),
            source="cache",
            path=path,
        )


def disorder(points: list[ProfilePoint]) -> list[str]:
    """See `LatencyProfile.disorder`."""
    out = []
    for p, q in itertools.permutations(points, 2):
        smaller = p.b <= q.b and p.c <= q.c and p.t <= q.t
        if smaller and p.latency_s > DISORDER_SLACK * q.latency_s:
            out.append(
                f"b={p.b} c={p.c} t={p.t} took {p.latency_s * 1e3:.1f} ms, b={q.b} c={q.c} t={q.t} "
                f"{q.latency_s * 1e3:.1f} ms"
            )
    return out


# ---- cache -------------------------------------------------------------------------------
def profile_info(
    core: ModelCore,
    batch_sizes=BATCH_SIZES,
    catch_up_tokens=CATCH_UP_TOKENS,
    context=CONTEXT,
    check_batch_sizes=CHECK_BATCH_SIZES,
    check_tokens=CHECK_TOKENS,
) -> dict:
    """What a profile depends on (the cache key is a hash of it); the core must be loaded."""
    loaded = core.loaded
    assert loaded is not None, "the model is not loaded"
    return {
        "model_path": str(Path(core.spec.path).resolve()),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": str(loaded.device),
        "linear_kernel": loaded.linear_kernel,
        "model_forward": core.model_forward,  # a profile of transformers' forward is not the fused one's
        "attention_backend": core.attention_backend,
        "cuda_graph_batch_sizes": core.cuda_graph_sizes,
        "block_size": core.spec.block_size,
        "torch_threads": core.torch_threads,
        # a CPU's level picks the kernels a step runs (native/cpu.py): an AVX2 pin must not plan with AVX512's times
        "cpu": cpu_identity() if loaded.device.type == "cpu" else None,
        "max_num_seqs": core.spec.max_num_seqs,
        "max_num_batched_tokens": core.spec.max_num_batched_tokens,
        "batch_sizes": list(batch_sizes),
        "catch_up_tokens": list(catch_up_tokens),
        "context": context,
        "check_batch_sizes": list(check_batch_sizes),
        "check_tokens": list(check_tokens),
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
    if prof.info != info:
        return None
    if prof.disorder:
        log.warning("measuring again: the cached latency profile %s is disordered (%s)", path, prof.disorder[0])
        return None
    return prof


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


def _check_grid(check_batch_sizes, check_tokens, max_b: int, budget: int) -> list[tuple[int, int]]:
    """(b, t) checks: b rows of t tokens, those that fit the row and token limits."""
    grid = itertools.product(check_batch_sizes, check_tokens)
    return sorted({(b, t) for b, t in grid if 1 <= b <= max_b and t >= 2 and b * t <= budget})


def measure(
    core: ModelCore,
    batch_sizes=BATCH_SIZES,
    catch_up_tokens=CATCH_UP_TOKENS,
    repeats: int = REPEATS,
    context: int = CONTEXT,
    check_batch_sizes=CHECK_BATCH_SIZES,
    check_tokens=CHECK_TOKENS,
) -> LatencyProfile:
    """Time the core's forward on synthetic batches (`ModelCore.profile_step`). Runs in the
    thread that steps the core, between steps (`WorkerThread.call`)."""
    info = profile_info(core, batch_sizes, catch_up_tokens, context, check_batch_sizes, check_tokens)
    spec, blocks, loaded = core.spec, core.blocks, core.loaded
    assert loaded is not None
    budget = spec.max_num_batched_tokens
    steps = _grid(batch_sizes, catch_up_tokens, spec.max_num_seqs, budget)
    if not steps:
        raise RuntimeError(f"model {core.name!r}: no profile point fits max_num_batched_tokens={budget}")
    checks = _check_grid(check_batch_sizes, check_tokens, spec.max_num_seqs, budget)
    points = [(b, c, 1) for b, c in steps] + [(b, 0, t) for b, t in checks]
    c_max = max(c for _, c, _ in points)
    t_max = max(t for _, _, t in points)  # the rows' length past their context
    ctx = max(1, min(context, loaded.max_model_len - max(c_max, t_max) - 2))

    def blocks_needed(ctx: int, b_max: int) -> int:
        return b_max * blocks.blocks_for(ctx + t_max) + (blocks.blocks_for(ctx + c_max) if c_max else 0)

    while ctx > 1 and blocks_needed(ctx, max(b for b, _, _ in points)) > blocks.num_free:
        ctx //= 2
    while points and blocks_needed(ctx, max(b for b, _, _ in points)) > blocks.num_free:
        b_top = max(b for b, _, _ in points)
        points = [p for p in points if p[0] < b_top]
    if not any(t == 1 for _, _, t in points):
        raise RuntimeError(f"model {core.name!r}: not enough free KV blocks to profile ({blocks.num_free} free)")

    def run(b: int, c: int, t: int) -> float:
        return core.profile_step(rows=b, tokens_each=t, catch_up=c, context=ctx)

    run(1, 0, 1)  # warm-up: allocator, first-call paths
    run(*max(points))
    # Round robin over the points, not each point's samples in a row: a burst of other work
    # on the machine (another process, a peer worker's prefill) then slows one sample of many
    # points, which the medians drop, instead of every sample of one point, which skews the
    # table's shape (a one-row step measured slower than a two-row one on the demo pair).
    samples: dict[tuple[int, int, int], list[float]] = {p: [] for p in points}

    def rounds(n: int) -> list[ProfilePoint]:
        for _ in range(n):
            for point in points:
                samples[point].append(run(*point))
        return [ProfilePoint(b, c, min(v), tuple(v), t) for (b, c, t), v in samples.items()]

    measured = rounds(max(1, repeats))
    for _ in range(RETRIES):  # a busy machine: more samples, of which the fastest count
        if not disorder(measured):
            break
        measured = rounds(max(1, repeats))
    if disorder(measured):
        log.warning(
            "model %r: the latency profile stayed disordered after %d more rounds (%s): the machine is busy; "
            "it is used now but not cached",
            core.name,
            RETRIES,
            disorder(measured)[0],
        )
    step_points = [p for p in measured if p.t == 1]
    return LatencyProfile(
        model=core.name,
        key=profile_key(info),
        info=info,
        points=measured,
        fit=fit_latency(step_points),
        created=time.time(),
        context_used=ctx,
        source="measured",
        measured_in_thread=threading.current_thread().name,
    )
