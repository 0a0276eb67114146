"""The logits processor: the one place where a request's next-token logits are changed, before
anything reads them (the sampler, a policy's `route` and `verify`, the logprobs).

Per row, first the penalties (`penalties.py`), then a grammar's mask: -inf where the grammar
forbids the token (structured output). Rows that ask for neither are left bit for bit. A row
knows nothing of the engine: its context tokens, its sampling parameters and, if constrained,
an object that moves the grammar to the row's position and fills its bits (the worker's
`structured.matcher.GrammarState` is one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .penalties import penalize_rows


class RowGrammar(Protocol):
    def seek(self, n: int, token_ids: Sequence[int]) -> None: ...

    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...


@dataclass
class LogitsRow:
    """What processing one row of logits needs: the row predicts the token after
    `token_ids[:length]`, of which the first `num_prompt` are the prompt."""

    token_ids: list[int]
    num_prompt: int
    length: int
    params: object  # config.SamplingParams
    grammar: RowGrammar | None = None

    @property
    def processed(self) -> bool:
        return self.params.penalized or self.grammar is not None


def process_logits(logits: torch.Tensor, rows: Sequence[LogitsRow]) -> torch.Tensor:
    """`logits` [R, V] after each row's penalties and grammar mask. When no row asks for either,
    the tensor itself comes back; otherwise a copy."""
    changed = [r for r, row in enumerate(rows) if row.processed]
    if not changed:
        return logits
    penalized = [r for r in changed if rows[r].params.penalized]
    if penalized:
        chosen = [rows[r] for r in penalized]
        index = torch.tensor(penalized, device=logits.device)
        out = penalize_rows(
            logits.index_select(0, index),
            [row.token_ids for row in chosen],
            [row.num_prompt for row in chosen],
            [row.length for row in chosen],
            [row.params for row in chosen],
        )
        logits = logits.index_copy(0, index, out)
    else:
        logits = logits.clone()
    constrained = [r for r in changed if rows[r].grammar is not None]
    if constrained:
        bitmask = allocate(len(constrained), logits.shape[-1])
        for j, r in enumerate(constrained):
            rows[r].grammar.seek(rows[r].length, rows[r].token_ids)
            rows[r].grammar.fill(bitmask, j)
        apply_bitmask(logits, constrained, bitmask)
    return logits


def allocate(rows: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed bitmask of `rows` rows (int32 words, 32 tokens each: xgrammar's layout)."""
    return torch.full((rows, -(-vocab_size // 32)), -1, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, rows: Sequence[int] | torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, the logits of `rows` whose tokens the bitmask forbids (any dtype,
    any device; the logits' vocabulary may be wider than the tokenizer's, and those ids are
    forbidden too)."""
    if len(rows) == 0:
        return
    vocab = logits.shape[-1]
    ids = torch.arange(vocab, device=logits.device)
    words = bitmask.to(logits.device)
    width = words.shape[1] * 32
    word_index = (ids // 32).clamp(max=words.shape[1] - 1)
    bits = (words[:, word_index] >> (ids % 32).to(torch.int32)) & 1
    allowed = (bits == 1) & (ids < width)[None, :]
    index = torch.as_tensor(rows, device=logits.device, dtype=torch.long)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
