"""A worker's grammar state for one constrained request.

Each worker keeps its own matcher per request and derives its state from the tokens it holds:
`advance` accepts whatever it has not seen (its own tokens, or a catch-up's written by a peer),
and `truncate` follows a rollback. So nothing of a matcher travels in a hand-off, and a worker
in another process would do the same. The masks themselves are built and applied by the logits
processor (`sampling/logits_processor.py`), only for the rows that are constrained: unconstrained
neighbours stay bit-identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# xgrammar keeps at least this many accepted tokens to roll back; a rollback deeper than that
# rebuilds the matcher from the request's tokens instead.
MAX_ROLLBACK = 64


class GrammarState:
    """One request's matcher on one worker. `position`: the tokens of the sequence (prompt
    included) up to which the matcher has accepted; it starts at the prompt's end."""

    def __init__(self, compiled, prompt_len: int, max_rollback: int = MAX_ROLLBACK):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=max_rollback)
        self.max_rollback = max_rollback
        self.start = self.position = prompt_len
        self.invalid = False  # a token was refused (or came after the end): the matcher lags `position`

    def advance(self, token_ids: Sequence[int], end: int | None = None) -> None:
        """Accept token_ids[position:end]: what this worker wrote, or a catch-up a peer wrote. A
        token the grammar refuses (a verifier's check runs over drafts it may reject) leaves the
        matcher where it was; the next rollback then rebuilds it from the tokens."""
        end = len(token_ids) if end is None else end
        for token in token_ids[self.position : end]:
            if self.invalid or self.matcher.is_terminated() or not self.matcher.accept_token(int(token)):
                self.invalid = True
        self.position = max(self.position, end)

    def truncate(self, n: int, token_ids: Sequence[int]) -> None:
        """Only the first n tokens of the sequence stand (a rollback); `token_ids` holds them."""
        if n >= self.position:
            return
        back = self.position - n
        if back <= self.max_rollback and not self.invalid:
            self.matcher.rollback(back)
            self.position = n
            return
        self.matcher.reset()
        self.position, self.invalid = self.start, False
        self.advance(token_ids, n)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """The tokens allowed next, as bits in `bitmask[row]` (xgrammar's int32 layout). A matcher
        past its stop token leaves the row as it is (such a request has ended)."""
        if not self.matcher.is_terminated():
            self.matcher.fill_next_token_bitmask(bitmask, index=row)

    def seek(self, n: int, token_ids: Sequence[int]) -> None:
        """Stand after the first n tokens: back (a rollback, or a verifier's check starting from
        its first draft) or forward over what this worker has not accepted yet."""
        if n < self.position:
            self.truncate(n, token_ids)
        else:
            self.advance(token_ids, n)
