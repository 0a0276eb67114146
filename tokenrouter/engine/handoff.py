"""Routing after a step: the policy's decision per row, and what follows for each request.

A kept token is appended; the request then finishes (EOS, a stop token, `max_tokens`), stays,
or moves. A request that moves is *parked* here as pending, its KV blocks kept, and its
hand-off carries only the suffix the peer has not seen (`Sequence.peer_known`). A drafter's
tokens are tentative: not reported, and where the request would end, or the drafts reach the
policy's limit, the verifier takes it (engine/verify.py). On the verifier, tokens the policy
proposes after a kept token that stays (`Route.proposals`) become tentative there at once, for
its next step to check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ..policies import ENTROPY, HISTORY, PeerMessage, Policy, StepResult, normalized_entropy
from .core_stats import CoreCounters
from .held_requests import HeldRequests
from .outbox import Outbox, PeerHandOff
from .role import Role
from .sequence import Sequence
from .stop_rule import StopRule

log = logging.getLogger(__name__)

MAX_STALLS = 8  # hand-offs in a row without a new token before a request is failed


class Routing:
    """One core's side of routing: it asks the policy, and applies the answer to the requests
    the core holds (`HeldRequests`: end, event, drop, park), counting in the core's counters.

    `embedding` is the model's input embedding where the policy asks for the sampled tokens'
    (`TOKEN_EMBEDDING`), else None. `keep_kv` False is the standard-serving baseline: a hand-off
    frees this worker's KV and goes back to the caller, who re-sends the whole sequence. On a
    verifier, `check(seq, source)` (its `Verification.check`) has its next step check the tokens
    its policy proposed, once appended."""

    def __init__(
        self,
        role: Role,
        policy: Policy,
        held: HeldRequests,
        counters: CoreCounters,
        stop_rule: StopRule,
        embedding: torch.nn.Module | None,
        keep_kv: bool,
        check: Callable[[Sequence, str], None],
    ):
        self.role = role
        self.policy = policy
        self.held = held
        self.counters = counters
        self.stop_rule = stop_rule
        self.embedding = embedding
        self.keep_kv = keep_kv
        self.check = check

    def decide(
        self, seqs: list[Sequence], logits: torch.Tensor, hidden, sampled: torch.Tensor, out: Outbox
    ) -> tuple[list | None, list | None, list | None] | None:
        """The policy's decision per row (keep the token? which model next? tokens proposed after
        it?); Nones when not routing; None when the policy raised, which fails the requests of
        this call only."""
        if self.role.routes:
            try:
                keep, next_model, proposals = self._ask_policy(seqs, logits, hidden, sampled)
            except Exception as e:
                log.exception("model %r: policy.route failed", self.role.name)
                msg = f"policy {type(self.policy).__name__}.route failed: {type(e).__name__}: {e}"
                for seq in seqs:
                    self.held.end(seq, out, "error", msg)
                return None
        else:
            keep, next_model, proposals = None, None, None
        self.counters.rows_sampled += len(seqs)
        self.counters.tokens_kept += len(seqs) if keep is None else sum(map(bool, keep))
        return keep, next_model, proposals

    def _ask_policy(
        self, seqs: list[Sequence], logits: torch.Tensor, hidden, sampled: torch.Tensor
    ) -> tuple[list, list, list | None]:
        role, embed = self.role, self.embedding
        tentative = [len(s.token_ids) + 1 - s.num_confirmed for s in seqs] if role.drafts else None
        result = StepResult(
            model=role.name,
            model_index=role.index,
            request_ids=[s.request_id for s in seqs],
            tokens=sampled,
            logits=logits,
            num_generated=torch.tensor([s.num_generated for s in seqs]),
            states=[s.policy_state for s in seqs],
            entropy=normalized_entropy(logits) if ENTROPY in self.policy.requires else None,
            hidden=hidden,
            token_embedding=embed(sampled) if embed is not None else None,
            params=[s.req.params for s in seqs],
            seeds=[s.req.seed for s in seqs],
            tentative=torch.tensor(tentative) if tentative is not None else None,
            history=[s.token_ids for s in seqs] if HISTORY in self.policy.requires else None,
        )
        decision = self.policy.route(result)
        n = len(seqs)
        if decision.keep.shape != (n,) or decision.next_model.shape != (n,):
            raise ValueError(
                f"route returned shapes {tuple(decision.keep.shape)}, {tuple(decision.next_model.shape)}; "
                f"expected ({n},)"
            )
        next_model = decision.next_model.tolist()
        if any(not 0 <= m < len(self.policy.models) for m in next_model):
            raise ValueError(f"route returned a model index outside [0, {len(self.policy.models)})")
        keep = decision.keep.tolist()
        proposals = decision.proposals
        if proposals is not None:
            proposals = self._checked(proposals, keep, next_model, logits.shape[-1])
        return keep, next_model, proposals

    def _checked(self, proposals: list, keep: list, next_model: list, vocab: int) -> list[list[int]]:
        """Proposals as lists of ints, or why route's are not valid: only the verifier proposes,
        after a token it keeps and stays for, at most max_draft tokens of its vocabulary."""
        if len(proposals) != len(keep):
            raise ValueError(f"route returned {len(proposals)} proposals for {len(keep)} rows")
        out = [[int(t) for t in p] for p in proposals]
        for i, p in enumerate(out):
            if not p:
                continue
            if not self.role.verifies:
                raise ValueError(f"route proposed tokens on {self.role.name!r}, which does not verify")
            if not keep[i] or next_model[i] != self.role.index:
                raise ValueError("route proposed tokens after a token it discards or hands off")
            if len(p) > self.policy.max_draft or not all(0 <= t < vocab for t in p):
                raise ValueError(
                    f"route proposed {len(p)} tokens; at most max_draft={self.policy.max_draft} ids < {vocab}"
                )
        return out

    def apply(
        self,
        seqs: list[Sequence],
        tokens: list[int],
        records: list | None,
        keep: list | None,
        next_model: list | None,
        proposals: list | None,
        out: Outbox,
    ) -> None:
        here = self.role.index
        for i, seq in enumerate(seqs):
            kept = keep is None or keep[i]
            target = here if next_model is None else next_model[i]
            record = None if records is None else records[i]
            self._apply_one(seq, tokens[i], kept, target, out, record, proposals[i] if proposals else None)

    def _apply_one(
        self, seq: Sequence, token: int, kept: bool, target: int, out: Outbox, record=None, proposal=None
    ) -> None:
        """One request's outcome of a step: append the token (if kept), finish, stay, or hand off.
        `record` is the token's TokenLogprob when the request asks; a tentative token's waits with it.
        `proposal`: tokens the verifier checks next, after its kept token."""
        role, held = self.role, self.held
        new = [token] if kept else []
        logprobs = [record] if kept and record is not None else None
        if kept:
            seq.token_ids.append(token)
            seq.stalls = 0
            finish = self.stop_rule.finish_reason(seq.req, token, seq.num_generated)
            if role.drafts:  # the verifier confirms it, and ends the request there if it ends it
                if record is not None:
                    seq.draft_logprobs[len(seq.token_ids) - 1] = record
                if finish or len(seq.token_ids) - seq.num_confirmed >= self.policy.max_draft:
                    target = role.verifier_index
            else:
                seq.num_confirmed = len(seq.token_ids)
                if finish:
                    return held.end(seq, out, finish, tokens=new, logprobs=logprobs)
        reported = [] if role.drafts else new
        if not reported:
            logprobs = None
        if target == role.index:
            if not kept:
                return held.end(seq, out, "error", "policy discarded a token without handing the request off")
            if reported:
                out.events.append(held.event(seq, reported, logprobs))
            if proposal:
                self._propose(seq, proposal)
            return
        if not kept:
            seq.stalls += 1
            if seq.stalls > MAX_STALLS:
                return held.end(seq, out, "error", f"policy handed the request off {seq.stalls} times without a token")
        self._hand_off(seq, self.policy.models[target], reported, logprobs, out)

    def _propose(self, seq: Sequence, tokens: list[int]) -> None:
        """The verifier's own drafts: tentative at once, checked by its next step (no further than
        the request may write)."""
        tokens = tokens[: max(0, seq.req.max_tokens - seq.num_generated)]
        if tokens:
            seq.token_ids.extend(tokens)
            self.check(seq, self.role.name)
            self.counters.proposed_tokens += len(tokens)

    def _hand_off(self, seq: Sequence, name: str, reported: list[int], logprobs: list | None, out: Outbox) -> None:
        """Park here with blocks kept, and send the peer the suffix it has not seen."""
        ev = self.held.event(seq, reported, logprobs, handoff_to=name)
        out.events.append(ev)
        known = seq.peer_known.get(name, 0) if self.keep_kv else 0
        msg = PeerMessage(
            seq.request_id,
            self.role.name,
            name,
            seq.token_ids[known:],
            start=known,
            stalls=seq.stalls,
            confirmed=seq.num_confirmed,
            logprobs={p: r for p, r in seq.draft_logprobs.items() if p >= known},
        )
        try:
            msg = self.policy.send(msg, seq.policy_state)
        except Exception as e:
            return self.held.end(seq, out, "error", f"policy {type(self.policy).__name__}.send failed: {e}")
        self.counters.handoffs_sent += 1
        if not self.keep_kv:  # standard-serving baseline: free KV, the caller re-sends
            self.held.drop(seq)
            ev.resubmit = msg
            return
        seq.peer_known[name] = len(seq.token_ids)
        self.held.park(seq)
        out.handoffs.append(PeerHandOff(name, msg, seq.req))
