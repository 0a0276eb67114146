"""The serving systems a benchmark compares (design.md, "Baselines for every speed claim").

All of them run the very same workers, kernels and policy code (`Engine(mode=...)`); only the
serving architecture differs, so a difference in speed is the architecture's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class System:
    name: str
    mode: str  # Engine(mode=...)
    prefix_caching: bool
    description: str


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            "routed", "routed", True,
            "this engine: one worker per model, each stepping on its own; a hand-off parks the request "
            "with its KV kept and the peer catches up on the unseen suffix only",
        ),
        System(
            "standard", "standard", False,
            "standard serving: a continuous-batching engine per model; every hand-off goes back to the "
            "client and is re-sent as a new request with the whole sequence (KV freed, re-prefill)",
        ),
        System("standard+pc", "standard", True, "standard serving with prefix caching"),
        System(
            "lockstep", "lockstep", True,
            "the official implementations' style: one loop steps the small model's batch, then the "
            "large model's, so each waits for the other (KV kept)",
        ),
    )
}
