"""When a written token ends a request: the one rule a decoding step (engine/handoff.py) and a
verifier's accepted drafts (engine/verify.py) both apply, so a token ends a request the same way
whichever model wrote it and however it was confirmed."""

from __future__ import annotations

from dataclasses import dataclass

from .sequence import Request


@dataclass(frozen=True)
class StopRule:
    eos_token_ids: frozenset[int]  # the model's end-of-sequence tokens

    def finish_reason(self, req: Request, token: int, num_generated: int) -> str | None:
        """ "stop" where `token` is an EOS (unless the request ignores EOS) or one of its stop
        tokens, "length" where it is the request's `max_tokens`-th token (`num_generated` counts
        it), else None."""
        if (token in self.eos_token_ids and not req.params.ignore_eos) or token in req.stop_token_ids:
            return "stop"
        return "length" if num_generated >= req.max_tokens else None
