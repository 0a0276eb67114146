"""One measured run: a closed loop keeping C sessions in flight, each through `engine.stream`, so
times are the client's.

A short or long request is a one-turn session; an agentic session runs its turns in sequence,
each next turn carrying the previous answer. A run cut short by `max_run_s` cancels its requests
in flight, and the run records whether every KV block came back.
"""

from __future__ import annotations

import time
from contextlib import aclosing

import anyio

from ..api import Engine
from ..config import SamplingParams
from ..errors import TokenRouterError
from .engines import wait_free
from .metrics import Run, Turn
from .sessions import Session


def _clean(text: str) -> str:
    """An answer as the next turn's history: a random model may write a NUL byte, which prompts refuse."""
    return text.replace("\x00", "")


async def _run_turn(engine: Engine, messages: list[dict], rec: Turn, t0: float) -> str | None:
    """Stream one request; fill `rec` as it goes. Returns the answer's text once it completed."""
    params = SamplingParams(temperature=0, max_tokens=rec.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    rec.submitted_s = start - t0
    try:
        async with aclosing(engine.stream(messages, params)) as stream:
            async for delta in stream:
                if delta.token_ids:
                    if rec.ttft_s is None:
                        rec.ttft_s = time.perf_counter() - start
                    rec.tokens += len(delta.token_ids)
                    rec.tokens_by_model[delta.model] = rec.tokens_by_model.get(delta.model, 0) + len(delta.token_ids)
                if delta.finish_reason is not None:
                    out = delta.output
                    if delta.finish_reason not in ("stop", "length"):
                        rec.error = f"{delta.finish_reason}: {out.error if out else delta.error}"
                        return None
                    rec.latency_s = time.perf_counter() - start
                    rec.token_ids = list(out.token_ids)
                    rec.tokens_by_model = out.tokens_per_model()
                    rec.handoffs = out.num_handoffs
                    rec.tokens_processed = dict(out.tokens_processed)
                    return out.text
    except TokenRouterError as e:  # refused at submission (e.g. too big for a KV pool)
        rec.error = f"{type(e).__name__}: {e}"
    return None


async def measure(
    engine: Engine,
    sessions: list[Session],
    concurrency: int,
    *,
    max_run_s: float | None = None,
    workload: str = "",
    system: str = "",
    repeat: int = 0,
) -> Run:
    """One closed-loop run: C clients, each taking the next session and running its turns in
    sequence, until every session is done or `max_run_s` passes (then in-flight requests are
    cancelled, which aborts them in every worker)."""
    turns: list[Turn] = []
    queue = iter(range(len(sessions)))
    before = engine.stats()
    t0 = time.perf_counter()

    async def client():
        for i in queue:  # the shared iterator hands each session to one client
            s = sessions[i]
            messages = list(s.messages)
            for t, max_tokens in enumerate(s.max_tokens):
                rec = Turn(session=i, turn=t, max_tokens=max_tokens, submitted_s=0.0)
                turns.append(rec)
                answer = await _run_turn(engine, messages, rec, t0)
                if answer is None:
                    break
                if t + 1 < s.turns:
                    followup = {"role": "user", "content": s.followups[t]}
                    messages = [*messages, {"role": "assistant", "content": _clean(answer)}, followup]

    with anyio.move_on_after(max_run_s) as scope:
        async with anyio.create_task_group() as tg:
            for _ in range(min(concurrency, len(sessions))):
                tg.start_soon(client)
    wall = time.perf_counter() - t0
    kv_freed = await wait_free(engine)
    after = engine.stats()
    turns.sort(key=lambda t: (t.session, t.turn))
    return Run(
        workload=workload,
        concurrency=concurrency,
        system=system,
        repeat=repeat,
        wall_s=wall,
        cut_short=scope.cancelled_caught,
        kv_freed=kv_freed,
        turns=turns,
        steps={m: after[m].steps - before[m].steps for m in after},
        prefix_cache_hit_tokens={
            m: after[m].prefix_cache_hit_tokens - before[m].prefix_cache_hit_tokens for m in after
        },
        proposed_tokens={m: after[m].proposed_tokens - before[m].proposed_tokens for m in after},
        proposed_accepted={m: after[m].proposed_accepted - before[m].proposed_accepted for m in after},
    )
