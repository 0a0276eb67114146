"""Prompt lookup (n-gram) drafts: where a request's latest tokens occurred before, in its prompt or
its own output, the tokens that followed that occurrence are a draft that costs no model step.

Text that an answer quotes back (a file to edit, a tool's output, the answer's own earlier lines)
is copied token for token, so the tokens after an earlier occurrence of the last few are often
exactly the next ones. As in vLLM's n-gram proposer and llama.cpp's lookup decoding, the last
`max_n` tokens are looked for first, then shorter suffixes down to `min_n`; here every length is
matched in one pass over the occurrences of the last token, and among the longest matches the
latest occurrence wins (the most recent context: the latest quote, or the answer's own copy).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

NGRAM_LIMIT = 16  # the longest suffix looked for
TOKENS_LIMIT = 64  # the most tokens one proposal holds (Speculative's k has the same bound)


class PromptLookup:
    """How `Speculative(lookup=...)` drafts from the request's own tokens: suffixes of `max_n`
    down to `min_n` tokens are looked for, and up to `tokens` that followed the match proposed
    (None: as many as the policy's draft length)."""

    def __init__(self, min_n: int = 2, max_n: int = 4, tokens: int | None = None):
        for name, value, limit in (("min_n", min_n, NGRAM_LIMIT), ("max_n", max_n, NGRAM_LIMIT)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ConfigError(f"PromptLookup: {name} must be an int in [1, {limit}], got {value!r}")
        if min_n > max_n:
            raise ConfigError(f"PromptLookup: min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= TOKENS_LIMIT
        ):
            raise ConfigError(f"PromptLookup: tokens must be an int in [1, {TOKENS_LIMIT}] or None, got {tokens!r}")
        self.min_n, self.max_n, self.tokens = min_n, max_n, tokens

    def propose(self, history: TokenHistory, tokens: list[int], last: int, length: int) -> list[int]:
        """Up to `length` tokens to follow `tokens + [last]` (the request's, and the one just
        written), or [] where no suffix of min_n tokens occurred before."""
        ids = history.sync(tokens, last)
        return find_continuation(ids, self.min_n, self.max_n, length).tolist()

    def __repr__(self) -> str:
        return f"PromptLookup(min_n={self.min_n}, max_n={self.max_n}, tokens={self.tokens})"


def find_continuation(ids: np.ndarray, min_n: int, max_n: int, length: int) -> np.ndarray:
    """The up to `length` tokens that followed the latest of the longest earlier occurrences of a
    suffix of `ids` (max_n tokens down to min_n); empty where none occurred. Vectorised over the
    occurrences of the last token: one comparison per suffix length, no loop over the history."""
    last = len(ids) - 1
    if last < min_n:
        return ids[:0]
    ends = np.flatnonzero(ids[:last] == ids[last])  # earlier occurrences of the last token
    matched = np.ones(len(ends), dtype=np.int64)  # how many of the latest tokens agree there
    for d in range(1, min(max_n, last + 1)):
        at = ends - d
        agree = (at >= 0) & (ids[np.maximum(at, 0)] == ids[last - d]) & (matched == d)
        if not agree.any():
            break
        matched += agree
    if not len(ends) or matched.max() < min_n:
        return ids[:0]
    end = ends[np.flatnonzero(matched == matched.max())[-1]]
    return ids[end + 1 : end + 1 + length]


class TokenHistory:
    """A request's tokens as an integer array that grows in place, kept on the verifier between
    its steps: each lookup converts only the tokens that are new since the last one, not the whole
    history (a list of 8k tokens takes ~130 us to convert, the lookup itself ~6 us). The tokens
    before the one a verifier writes are confirmed and never change; should a shorter or other
    list come, it starts again."""

    def __init__(self):
        self.ids = np.empty(256, dtype=np.int64)
        self.count = 0  # leading tokens of `ids` known to be the request's

    def sync(self, tokens: list[int], last: int) -> np.ndarray:
        """`tokens + [last]` as an array (a view, valid until the next call)."""
        n = self.count
        if n > len(tokens) or (n and self.ids[n - 1] != tokens[n - 1]):
            n = 0
        if len(tokens) + 1 > len(self.ids):
            grown = np.empty(max(2 * len(self.ids), len(tokens) + 1), dtype=np.int64)
            grown[:n] = self.ids[:n]
            self.ids = grown
        self.ids[n : len(tokens)] = tokens[n:]
        self.ids[len(tokens)] = last
        self.count = len(tokens)
        return self.ids[: len(tokens) + 1]
