"""An engine's life in the benchmark: opened and warmed up per system, drained between runs, and its
memory given back before the next one loads.

Shared with `tokenrouter eval`, which opens and closes engines the same way.
"""

from __future__ import annotations

import time

import anyio

from ..api import Engine
from ..config import ModelSpec, SamplingParams
from ..engine import trim_heap, usable_cores
from .settings import BenchConfig, BenchError
from .systems import SYSTEMS

# Plain text, not through the chat template: short to prefill, and it leaves no block of the
# template in the prefix cache for the measured run to find.
WARMUP_PROMPT = "Hello! Who are you?"


async def wait_free(engine: Engine, timeout: float = 30.0) -> bool:
    """Whether every worker's KV pool is whole again and nothing is queued, within `timeout`
    (workers free KV asynchronously, after a request ends or is cancelled)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine.stats()
        if all(
            s.kv_blocks_free == s.kv_blocks_total and s.running == 0 and s.waiting == 0 and s.pending == 0
            for s in stats.values()
        ):
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.01)


def release_memory() -> None:
    """Give a closed engine's memory back before the next one loads (two copies of a real pair
    do not fit on a small machine): collect cycles, and return freed heap to the OS (glibc)."""
    trim_heap()


async def open_engine(cfg: BenchConfig, system: str, kv_cache_tokens: int) -> Engine:
    """A started engine for one system, after a warm-up request."""
    s, policy = SYSTEMS.get(system, SYSTEMS["routed"]), cfg.other_policies.get(system, cfg.policy)
    specs = {
        m: ModelSpec(
            path=cfg.models[m],
            kv_cache_tokens=kv_cache_tokens,
            enable_prefix_caching=s.prefix_caching,
            device=cfg.device,
            dtype=cfg.dtype,
            **({} if cfg.cuda_graph_max_batch is None else {"cuda_graph_max_batch": cfg.cuda_graph_max_batch}),
            **cfg.model_options.get(m, {}),
        )
        for m in policy.models
    }
    threads = (cfg.threads_lockstep or usable_cores()) if s.mode == "lockstep" else cfg.threads
    specs, policy = s.serves(policy, specs)
    engine = Engine(models=specs, policy=policy, mode=s.mode, num_threads=threads)
    await engine.start()
    try:
        warm = await engine.generate(
            WARMUP_PROMPT, SamplingParams(temperature=0, max_tokens=cfg.warmup_tokens, ignore_eos=True)
        )
        if warm.finish_reason not in ("stop", "length"):
            raise BenchError(f"{system}: the warm-up request failed: {warm.error}")
        if not await wait_free(engine):
            raise BenchError(f"{system}: the warm-up request's KV was not freed")
    except BaseException:
        await engine.close()
        raise
    return engine
