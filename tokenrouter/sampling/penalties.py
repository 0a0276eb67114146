"""Repetition, presence and frequency penalties, batched over the rows that ask for them.

Semantics, exactly as the references state them:
- repetition (transformers' `RepetitionPenaltyLogitsProcessor`, CTRL): over the prompt and the
  output, the logit of a token seen at least once is divided by the penalty if it is > 0 and
  multiplied by it otherwise;
- presence and frequency (vLLM, after OpenAI): over the output only,
  `logit -= frequency_penalty * count + presence_penalty * (count > 0)`.
Repetition comes first, as in vLLM. Each row counts the tokens before its own position (its
`length`), so the rows of a verifier's check, one per position, each see what precedes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def apply_penalties(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    num_prompt: torch.Tensor,
    lengths: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """Penalized copy of `logits` [R, V]. Row r's context is `tokens[r, :lengths[r]]` ([R, L],
    anything past the length is ignored), of which the first `num_prompt[r]` are its prompt.
    The penalties are [R] tensors; counts come from one scatter over the padded tokens (padding
    goes to an extra column that is dropped). Computed in float32 or wider, returned in the
    logits' dtype."""
    rows, vocab = logits.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)  # counts stay exact in half precision models
    pos = torch.arange(tokens.shape[1], device=logits.device)[None, :]
    seen = pos < lengths[:, None]
    output = seen & (pos >= num_prompt[:, None])
    in_context = torch.zeros((rows, vocab + 1), dtype=torch.bool, device=logits.device)
    in_context.scatter_(1, torch.where(seen, tokens, vocab), True)
    counts = torch.zeros((rows, vocab + 1), dtype=dtype, device=logits.device)
    counts.scatter_add_(1, torch.where(output, tokens, vocab), torch.ones_like(tokens, dtype=dtype))
    in_context, counts = in_context[:, :vocab], counts[:, :vocab]
    x = logits.to(dtype)
    penalty = torch.where(in_context, repetition.to(dtype)[:, None], 1.0)
    x = torch.where(x > 0, x / penalty, x * penalty)
    x = x - frequency.to(dtype)[:, None] * counts - presence.to(dtype)[:, None] * (counts > 0).to(dtype)
    return x.to(logits.dtype)


def penalize_rows(
    logits: torch.Tensor, contexts: Sequence[list[int]], num_prompt: list[int], lengths: list[int], params: list
) -> torch.Tensor:
    """`apply_penalties` from plain token lists: row r's context is `contexts[r][:lengths[r]]`
    (rows may share one list, as a check's positions do: it is copied once), penalties from
    `params[r]` (SamplingParams)."""
    device = logits.device
    slot: dict[int, int] = {}
    lists: list[list[int]] = []
    for ctx in contexts:
        if id(ctx) not in slot:
            slot[id(ctx)] = len(lists)
            lists.append(ctx)
    width = max(max(lengths), 1)
    table = torch.zeros((len(lists), width), dtype=torch.long)
    for i, ctx in enumerate(lists):
        known = ctx[:width]
        table[i, : len(known)] = torch.tensor(known, dtype=torch.long)
    tokens = table.to(device)[torch.tensor([slot[id(c)] for c in contexts], device=device)]
    return apply_penalties(
        logits,
        tokens,
        torch.tensor(num_prompt, device=device),
        torch.tensor(lengths, device=device),
        torch.tensor([p.repetition_penalty for p in params], dtype=torch.float64, device=device),
        torch.tensor([p.frequency_penalty for p in params], dtype=torch.float64, device=device),
        torch.tensor([p.presence_penalty for p in params], dtype=torch.float64, device=device),
    )
