"""Per-token log-probability records (`TokenLogprob`) from a batch of log-probability rows.

One gather and one top-k over all the rows that ask, and one transfer to Python: the records
are what the caller gets, so they are plain floats and ints.
"""

from __future__ import annotations

import torch

from ..outputs import TokenLogprob


def token_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor, num_top: list[int], model: str) -> list[TokenLogprob]:
    """Row r's record: `tokens[r]`'s logprob in `logprobs[r]` ([R, V]) and the `num_top[r]` most
    likely tokens there (those at -inf left out), attributed to `model`."""
    chosen = logprobs.gather(1, tokens.to(logprobs.device)[:, None]).squeeze(1).tolist()
    width = min(max(num_top, default=0), logprobs.shape[-1])
    if width:
        values, ids = logprobs.topk(width, dim=-1)
        values, ids = values.tolist(), ids.tolist()
    records = []
    for r, (token, value, n) in enumerate(zip(tokens.tolist(), chosen, num_top)):
        top = [(i, v) for i, v in zip(ids[r][:n], values[r][:n]) if v != float("-inf")] if n and width else []
        records.append(TokenLogprob(token, value, model, top))
    return records
