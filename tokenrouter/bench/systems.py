"""The serving systems a benchmark compares: routed serving and the baselines of every speed claim.

All of them run the very same workers, kernels and policy code (`Engine(mode=...)`); only the
serving architecture differs, so a difference in speed is the architecture's. `small` and
`large` serve one of the policy's models alone (`Single`), on the same engine and KV budget:
the answer to "does routing pay?".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..config import ModelSpec
from ..policies import Policy, Single


@dataclass(frozen=True)
class System:
    name: str
    mode: str  # Engine(mode=...)
    prefix_caching: bool
    description: str
    alone: int | None = None  # serve only the policy's model at this index (0: smallest, -1: largest)

    def serves(self, policy: Policy, specs: Mapping[str, ModelSpec]) -> tuple[dict[str, ModelSpec], Policy]:
        """The models and the policy this system runs: every model under the policy, or one alone."""
        if self.alone is None:
            return dict(specs), policy
        name = policy.models[self.alone]
        return {name: specs[name]}, Single(name)


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            "routed",
            "routed",
            True,
            "this engine: one worker per model, each stepping on its own; a hand-off parks the request "
            "with its KV kept and the peer catches up on the unseen suffix only",
        ),
        System(
            "standard",
            "standard",
            False,
            "standard serving: a continuous-batching engine per model; every hand-off goes back to the "
            "client and is re-sent as a new request with the whole sequence (KV freed, re-prefill)",
        ),
        System("standard+pc", "standard", True, "standard serving with prefix caching"),
        System(
            "lockstep",
            "lockstep",
            True,
            "the official implementations' style: one loop steps the small model's batch, then the "
            "large model's, so each waits for the other (KV kept)",
        ),
        System("small", "routed", True, "the small (first) model alone, on the same engine: no routing", alone=0),
        System("large", "routed", True, "the large (last) model alone, on the same engine: no routing", alone=-1),
    )
}
