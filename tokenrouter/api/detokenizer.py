"""Incremental detokenization and stop strings, per request, on the caller's side.

Text is emitted only once it is stable: a token that ends in the middle of a multi-byte
character (decoding to U+FFFD) waits for the next one, and text that could still be the start
of a stop string is held back, so the concatenated stream always equals the final text.
"""

from __future__ import annotations

_PROMPT_CONTEXT = 5  # prompt tokens decoded with the output so leading spaces come out right


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the newly stable text."""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """At the end: whatever text the pending tokens make, even if incomplete."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if full.startswith(prefix) else ""


class StopStringMatcher:
    """Finds stop strings in the text so far and decides how much text is safe to emit."""

    def __init__(self, stop: list[str], include_stop: bool):
        self.stop = stop
        self.include_stop = include_stop
        self.hold = max((len(s) for s in stop), default=1) - 1

    def find(self, text: str, new_len: int) -> int | None:
        """End index of the text to keep if a stop string appears in the last new_len chars (+ overlap)."""
        if not self.stop:
            return None
        start = max(0, len(text) - new_len - self.hold)
        best = None
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, len(s))
        if best is None:
            return None
        return best[0] + best[1] if self.include_stop else best[0]

    def safe_length(self, text: str, final: bool) -> int:
        """How much of the text can be emitted without risking a later stop-string cut."""
        if final or not self.stop:
            return len(text)
        return max(0, len(text) - self.hold)
