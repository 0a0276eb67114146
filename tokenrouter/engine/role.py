"""A model's part in its policy, worked out once: routing, verification and the core each read it
instead of asking the policy again (or asking the core)."""

from __future__ import annotations

from dataclasses import dataclass

from ..policies import Policy


@dataclass(frozen=True)
class Role:
    name: str
    index: int  # the model's place in policy.models; -1 when the policy does not name it
    routes: bool  # the policy routes between this model and others
    # verifying policies (policies/base.py): the verifier checks what the other models wrote,
    # which stays tentative until then; a routing core either verifies or drafts
    verifier_index: int | None
    verifies: bool
    drafts: bool

    @classmethod
    def in_policy(cls, name: str, policy: Policy) -> Role:
        routes = name in policy.models and len(policy.models) > 1
        verifier = policy.verifier if routes else None
        return cls(
            name=name,
            index=policy.models.index(name) if name in policy.models else -1,
            routes=routes,
            verifier_index=policy.models.index(verifier) if verifier is not None else None,
            verifies=verifier == name,
            drafts=verifier is not None and verifier != name,
        )
