"""Verification under a verifying policy (`VERIFY` in its `requires`; docs/policies.md).

A drafter's tokens are tentative until the verifier's catch-up row over them has run: the runner
keeps its logits at every caught-up position (`ForwardOutput.verify`), the policy says how many
drafts to accept, and those are reported as the drafter's. The rest roll back here, KV included
(`BlockManager.truncate` copies a shared block on write), and on the drafter when the request
next reaches it: a `PeerMessage` is authoritative from its `start`. The verifier then writes the
next position itself. Tokens the verifier proposed itself (`Route.proposals`) are checked the
same way, and reported as its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policies import PeerMessage, Policy, Verdict, VerifyResult
from .core_stats import CoreCounters
from .held_requests import HeldRequests
from .kv import BlockManager, KVCache
from .model import ForwardOutput
from .outbox import Outbox, WorkerEvent
from .role import Role
from .sequence import Sequence
from .step_logits import StepLogits
from .stop_rule import StopRule


@dataclass
class Verified:
    """The rows of a step that go on to `route` after its checks: those whose request did not end
    on an accepted token, with the token each writes next, the logits it was drawn from, and
    their hidden states when captured."""

    seqs: list[Sequence]
    tokens: torch.Tensor
    logits: torch.Tensor
    hidden: torch.Tensor | None


class Verification:
    """One core's side of verification: the verifier's checks, and the rollbacks both sides make.
    It processes and samples a check's rows with the core's `StepLogits`, ends or reports the
    requests the core holds (`HeldRequests`), and cuts a rolled-back request's KV in the core's
    pool: its blocks (`BlockManager.truncate`) and their contents (`KVCache.copy_blocks`). It counts
    the verifier's own proposals accepted in the core's counters."""

    def __init__(
        self,
        role: Role,
        policy: Policy,
        held: HeldRequests,
        logits: StepLogits,
        blocks: BlockManager,
        cache: KVCache,
        stop_rule: StopRule,
        counters: CoreCounters,
    ):
        self.role = role
        self.policy = policy
        self.held = held
        self.logits = logits
        self.blocks = blocks
        self.cache = cache
        self.stop_rule = stop_rule
        self.counters = counters

    def check(self, seq: Sequence, source: str) -> None:
        """The tokens from seq.num_confirmed on are tentative: the next forward that reaches the
        end computes the verifier's logits over them (from the position before the first)."""
        seq.verify_start, seq.verify_source = seq.num_confirmed, source
        if seq.num_computed > seq.verify_start - 1:  # that position's logits are not computed again otherwise
            self.cache.copy_blocks(self.blocks.truncate(seq, seq.verify_start - 1))

    def supersede(self, seq: Sequence, msg: PeerMessage) -> int:
        """A message replaces what we hold from its start on: keep the tokens it agrees with, roll
        the rest back (a rejected draft). Returns the tokens kept."""
        ours = seq.token_ids[msg.start :]
        same = next((i for i, (a, b) in enumerate(zip(ours, msg.tokens)) if a != b), min(len(ours), len(msg.tokens)))
        keep = msg.start + same
        if keep < len(seq.token_ids):
            self._rollback(seq, keep)
        return keep

    def _rollback(self, seq: Sequence, n: int) -> None:
        """Keep the first n tokens: the rest, and their KV, go (the KV's blocks copied on write
        where the prefix cache or another request holds them); peers are told again from there."""
        del seq.token_ids[n:]
        if seq.grammar is not None:
            seq.grammar.truncate(n, seq.token_ids)
        if seq.draft_logprobs:
            seq.draft_logprobs = {p: r for p, r in seq.draft_logprobs.items() if p < n}
        self.cache.copy_blocks(self.blocks.truncate(seq, min(seq.num_computed, n)))
        for peer in seq.peer_known:
            seq.peer_known[peer] = min(seq.peer_known[peer], n)
        seq.num_confirmed = min(seq.num_confirmed, n)

    def run(
        self, fwd: ForwardOutput, seqs: list[Sequence], sampled: torch.Tensor, logits: torch.Tensor, out: Outbox
    ) -> Verified:
        """The verifier's checks in this step: the policy accepts a prefix of each request's
        tentative tokens; they are reported (written by their drafter), the rest roll back, and
        the verifier writes the next position: the token the policy gives, else one sampled from
        its own distribution there."""
        step_logits = self.logits
        checks = [i for i, r in enumerate(fwd.sample_rows) if r in fwd.verify]
        spans = step_logits.process_spans([seqs[i] for i in checks], [fwd.verify[fwd.sample_rows[i]] for i in checks])
        verdict = self._ask_policy([seqs[i] for i in checks], spans)
        logits, tokens = logits.clone(), sampled.clone()
        ended: set[int] = set()
        resample: list[tuple[int, torch.Tensor]] = []
        for j, i in enumerate(checks):
            seq, span = seqs[i], spans[j]
            start, drafts = seq.verify_start, seq.token_ids[seq.verify_start :]
            accept = int(verdict.accept[j])
            source, seq.verify_start, seq.verify_source = seq.verify_source, None, None
            if source == self.role.name:  # its own proposals: its own tokens once accepted
                self._own_records(seq, start, drafts[:accept], span)
            if self._confirm(seq, start, drafts[:accept], source, out):
                ended.add(i)
                continue
            if accept < len(drafts):
                self._rollback(seq, start + accept)
            seq.num_confirmed = len(seq.token_ids)
            logits[i] = span[accept]
            given = -1 if verdict.tokens is None else int(verdict.tokens[j])
            if given >= 0:
                tokens[i] = given
            elif accept < len(drafts):  # the last position's sample stands only when every draft does
                resample.append((i, span[accept]))
        if resample:
            redo = step_logits.sample([seqs[i] for i, _ in resample], torch.stack([row for _, row in resample]))
            for (i, _), t in zip(resample, redo.tolist()):
                tokens[i] = t
        keep = [i for i in range(len(seqs)) if i not in ended]
        hidden = fwd.hidden[keep] if fwd.hidden is not None else None
        return Verified([seqs[i] for i in keep], tokens[keep], logits[keep], hidden)

    def _own_records(self, seq: Sequence, start: int, accepted: list[int], span: torch.Tensor) -> None:
        """Count the verifier's own accepted proposals, and where the request asks logprobs, give
        each the record a token the verifier wrote has: from its distribution at that position."""
        self.counters.proposed_accepted += len(accepted)
        if accepted and seq.req.params.logprobs is not None:
            n = len(accepted)
            records = self.logits.token_logprobs([seq] * n, span[:n], torch.tensor(accepted))
            for j, record in enumerate(records):
                seq.draft_logprobs[start + j] = record

    def _ask_policy(self, seqs: list[Sequence], spans: list[torch.Tensor]) -> Verdict:
        counts = [span.shape[0] - 1 for span in spans]
        width = max(counts)
        drafts = torch.full((len(seqs), width), -1, dtype=torch.long)
        for j, seq in enumerate(seqs):
            drafts[j, : counts[j]] = torch.tensor(seq.token_ids[seq.verify_start :])
        if len(spans) == 1:  # one check (every step at one request in flight): a view, no copy
            logits = spans[0][None]
        elif min(counts) == width:
            logits = torch.stack(spans)
        else:  # padded to the longest check
            logits = spans[0].new_zeros((len(seqs), width + 1, spans[0].shape[-1]))
            for j, span in enumerate(spans):
                logits[j, : counts[j] + 1] = span
        result = VerifyResult(
            model=self.role.name,
            model_index=self.role.index,
            request_ids=[s.request_id for s in seqs],
            sources=[s.verify_source for s in seqs],
            start=torch.tensor([s.verify_start for s in seqs]),
            num_drafts=torch.tensor(counts),
            drafts=drafts,
            logits=logits,
            num_generated=torch.tensor([s.verify_start - s.req.num_prompt_tokens for s in seqs]),
            states=[s.policy_state for s in seqs],
            params=[s.req.params for s in seqs],
            seeds=[s.req.seed for s in seqs],
        )
        verdict = self.policy.verify(result)
        n = len(seqs)
        if verdict.accept.shape != (n,) or (verdict.tokens is not None and verdict.tokens.shape != (n,)):
            raise ValueError(f"verify returned shapes {tuple(verdict.accept.shape)}; expected ({n},)")
        accept = verdict.accept.tolist()
        if any(not 0 <= a <= c for a, c in zip(accept, counts)):
            raise ValueError("verify accepted a number of drafts outside [0, num_drafts]")
        return verdict

    def _confirm(self, seq: Sequence, start: int, accepted: list[int], source: str, out: Outbox) -> bool:
        """Report accepted tentative tokens as their drafter's (with the drafter's logprobs, when
        asked); True if the request ends on one of them (its EOS, a stop token, or max_tokens),
        which ends it here."""
        req = seq.req
        records = None
        if req.params.logprobs is not None:
            records = [seq.draft_logprobs.pop(start + j) for j in range(len(accepted))]
        for j, token in enumerate(accepted):
            finish = self.stop_rule.finish_reason(req, token, start + j + 1 - req.num_prompt_tokens)
            if finish:
                self.held.drop(seq)
                out.releases.append(seq.request_id)
                out.events.append(
                    WorkerEvent(
                        seq.request_id,
                        accepted[: j + 1],
                        source,
                        num_cached_prompt=seq.num_cached_prompt,
                        logprobs=None if records is None else records[: j + 1],
                    )
                )
                out.events.append(self.held.event(seq, finish_reason=finish))
                return True
        if accepted:
            out.events.append(
                WorkerEvent(
                    seq.request_id, list(accepted), source, num_cached_prompt=seq.num_cached_prompt, logprobs=records
                )
            )
        return False
