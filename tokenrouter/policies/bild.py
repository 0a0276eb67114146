"""BiLD (Kim et al., NeurIPS 2023, "Speculative Decoding with Big Little Decoder") as a
verifying policy: a quality/speed knob between the small model alone and the large one.

Fallback: the small model writes while its top probability stays at or above `fallback`; below,
its token is discarded and the large model writes that position. Rollback: the large model's
catch-up over the small model's tokens since its last turn (computed anyway) finds the first
whose distance, the cross-entropy of the large model's distribution against that token
(-log p_large(token)), exceeds `rollback`; that token and the ones after it are rolled back, and
the large model writes the position. After its token, control returns to the small model.

The small model's tokens are tentative until the large model has seen them, so the caller only
ever sees what survived the rollback. `max_draft` bounds how many the small model writes before
the large model checks them (a longer stretch costs the check more logits); the paper lets the
small model run until it falls back.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .base import Policy, Route, StepResult, Verdict, VerifyResult
from .fields import VERIFY


class BiLD(Policy):
    requires = frozenset({VERIFY})

    def __init__(
        self,
        fallback: float = 0.6,
        rollback: float = 5.0,
        small: str = "small",
        large: str = "large",
        max_draft: int = 32,
    ):
        if isinstance(fallback, bool) or not isinstance(fallback, (int, float)) or not 0.0 <= fallback <= 1.0:
            raise ConfigError(f"BiLD: fallback must be a probability in [0, 1], got {fallback!r}")
        if isinstance(rollback, bool) or not isinstance(rollback, (int, float)) or not rollback > 0:
            raise ConfigError(f"BiLD: rollback must be a distance (nats) > 0, got {rollback!r}")
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or not 1 <= max_draft <= 256:
            raise ConfigError(f"BiLD: max_draft must be an int in [1, 256], got {max_draft!r}")
        if small == large:
            raise ConfigError("BiLD: small and large must be different models")
        self.fallback, self.rollback = float(fallback), float(rollback)
        self.small, self.large = small, large
        self.max_draft = max_draft

    @property
    def models(self) -> list[str]:
        return [self.small, self.large]

    def route(self, result: StepResult) -> Route:
        n = len(result)
        if result.model == self.small:
            # one read: the engine takes the answer to the host
            confident = (torch.softmax(result.logits.float(), dim=-1).amax(dim=-1) >= self.fallback).cpu()
            return Route(keep=confident, next_model=(~confident).long())
        return Route(keep=torch.ones(n, dtype=torch.bool), next_model=torch.zeros(n, dtype=torch.long))

    def verify(self, result: VerifyResult) -> Verdict:
        """Computed where the logits are, without a host sync (drafts given on the host are
        copied there; on the CPU that is no copy at all)."""
        k = result.drafts.shape[1]
        device = result.logits.device
        logp = torch.log_softmax(result.logits[:, :k].float(), dim=-1)
        drafts = result.drafts.to(device, non_blocking=True).clamp(min=0)
        num_drafts = result.num_drafts.to(device, non_blocking=True)
        distance = -logp.gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
        valid = torch.arange(k, device=device)[None, :] < num_drafts[:, None]
        far = (distance > self.rollback) & valid
        first_far = torch.where(far.any(dim=1), far.long().argmax(dim=1), num_drafts)
        return Verdict(accept=first_far)

    def __repr__(self) -> str:
        return f"BiLD(fallback={self.fallback}, rollback={self.rollback}, small={self.small!r}, large={self.large!r})"
