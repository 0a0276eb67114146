"""A step's logits, per request: processed (penalties, a grammar's mask), sampled, and scored
(logprobs of the written tokens; prompt_logprobs of the prompt's positions).

This is where the engine's sequences meet the `sampling` package, which knows nothing of them:
each row becomes a `LogitsRow`, and a constrained request gets this worker's grammar matcher
on first use (docs/sampling.md).
"""

from __future__ import annotations

import torch

from ..sampling import LogitsRow, Sampler, SamplingTensors, argmax, process_logits, token_logprobs
from ..structured import MAX_ROLLBACK, GrammarState
from .sched import ScheduledBatch
from .sequence import Sequence


class StepLogits:
    def __init__(self, model: str, max_rollback: int = MAX_ROLLBACK):
        self.model = model  # whom the logprob records name
        self.max_rollback = max_rollback  # of each grammar matcher made here
        self.sampler = Sampler()

    @staticmethod
    def processes(seq: Sequence) -> bool:
        """Whether `process` changes this request's logits (penalties, a grammar)."""
        return seq.req.params.penalized or seq.req.grammar is not None

    def process(self, seqs: list[Sequence], logits: torch.Tensor, lengths: list[int] | None = None) -> torch.Tensor:
        """Row r holds seqs[r]'s next-token logits after its first lengths[r] tokens (default: all
        it holds; a check's rows, one per position, each count only what precedes them)."""
        if not any(self.processes(s) for s in seqs):
            return logits
        if lengths is None:
            lengths = [len(s.token_ids) for s in seqs]
        rows = [
            LogitsRow(s.token_ids, s.req.num_prompt_tokens, n, s.req.params, self.grammar(s))
            for s, n in zip(seqs, lengths)
        ]
        return process_logits(logits, rows)

    def process_spans(self, seqs: list[Sequence], spans: list[torch.Tensor]) -> list[torch.Tensor]:
        """A verifier's checks through `process`: span row j of a check is the position after the
        check's first verify_start + j tokens (so `Speculative` stays lossless against the
        penalized or constrained target: a draft the grammar forbids is rejected)."""
        if not any(self.processes(s) for s in seqs):
            return spans
        sizes = [span.shape[0] for span in spans]
        rows = [s for s, n in zip(seqs, sizes) for _ in range(n)]
        lengths = [s.verify_start + j for s, n in zip(seqs, sizes) for j in range(n)]
        return list(self.process(rows, torch.cat(spans), lengths).split(sizes))

    def grammar(self, seq: Sequence) -> GrammarState | None:
        """This worker's matcher of the request's grammar, made on first use (None: unconstrained)."""
        if seq.req.grammar is None:
            return None
        if seq.grammar is None:
            seq.grammar = GrammarState(seq.req.grammar, seq.req.num_prompt_tokens, self.max_rollback)
        return seq.grammar

    def sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        if all(s.req.params.temperature == 0.0 for s in seqs):  # all greedy: no sampling tensors needed
            return argmax(logits)
        return self.sampler(logits, self.sampling_tensors(seqs, logits.device))

    @staticmethod
    def sampling_tensors(seqs: list[Sequence], device) -> SamplingTensors:
        return SamplingTensors.build(
            [s.req.params for s in seqs], [s.req.seed for s in seqs], [s.num_generated for s in seqs], device
        )

    def token_logprobs(self, seqs: list[Sequence], logits: torch.Tensor, tokens: torch.Tensor) -> list | None:
        """Per row, the written token's `TokenLogprob` under this model (None for rows that do not
        ask; None for all when none asks): from the processed logits it was drawn from."""
        rows = [r for r, s in enumerate(seqs) if s.req.params.logprobs is not None]
        if not rows:
            return None
        chosen = [seqs[r] for r in rows]
        index = torch.tensor(rows, device=logits.device)
        lp = self.sampler.logprobs(logits.index_select(0, index), self.sampling_tensors(chosen, logits.device))
        found = token_logprobs(lp, tokens[index.to(tokens.device)], [s.req.params.logprobs for s in chosen], self.model)
        records: list = [None] * len(seqs)
        for r, record in zip(rows, found):
            records[r] = record
        return records

    def score_prompts(self, batch: ScheduledBatch, prompt: dict[int, tuple[int, torch.Tensor]]) -> None:
        """prompt_logprobs: the scored prompt positions' records, from the model's own logits (no
        penalty, no temperature: a prompt token was not sampled), appended to each sequence's."""
        rows = list(prompt)
        seqs = [batch.seqs[r] for r in rows]
        logits = torch.cat([prompt[r][1] for r in rows])
        lp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        spans = [(prompt[r][0], prompt[r][1].shape[0]) for r in rows]
        targets = [t for s, (first, n) in zip(seqs, spans) for t in s.token_ids[first + 1 : first + 1 + n]]
        num_top = [s.req.params.prompt_logprobs for s, (_, n) in zip(seqs, spans) for _ in range(n)]
        records = token_logprobs(lp, torch.tensor(targets), num_top, self.model)
        done = 0
        for s, (first, n) in zip(seqs, spans):
            assert first == len(s.prompt_logprobs), "prompt positions are scored in order (no cache hits before)"
            s.prompt_logprobs.extend(records[done : done + n])
            done += n
