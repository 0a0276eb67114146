"""Builds a request's output from worker events: text, stream deltas, stop strings, timings."""

from __future__ import annotations

import time

from ..engine import Request, WorkerEvent
from ..outputs import RequestOutput, StreamDelta
from .detokenizer import IncrementalDetokenizer, StopStringMatcher


class OutputProcessor:
    def __init__(self, tokenizer, req: Request):
        params = req.params
        self.req = req
        self.detok = IncrementalDetokenizer(tokenizer, req.prompt_ids, params.skip_special_tokens)
        self.stops = StopStringMatcher(params.stop, params.include_stop_str_in_output)
        self.text = ""  # all stable text so far (stop string already cut)
        self.emitted = 0  # chars of self.text already given to the stream
        self.token_ids: list[int] = []
        self.token_models: list[str] = []
        self.logprobs: list | None = [] if params.logprobs is not None else None  # one TokenLogprob per token
        self.prompt_logprobs: list | None = None  # from the entry model's first event after scoring
        self.finish_reason: str | None = None  # set when the output is complete
        self.error: str | None = None
        self.worker_done = False  # the worker sent its terminal event: no KV left anywhere
        self.num_cached_prompt = 0  # the entry model's prompt tokens from its prefix cache
        self.heard = False  # any event yet: the first always comes from the entry model
        self.num_handoffs = 0
        self.tokens_processed: dict[str, int] = {}
        self.t_start = time.monotonic()
        self.t_first: float | None = None
        self.t_end: float | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def process(self, ev: WorkerEvent) -> StreamDelta | None:
        """Fold in one worker event; return the delta to stream, if any."""
        if ev.finish_reason is not None:
            self.worker_done = True
        if not self.heard:  # the entry model's first report (a token, a hand-off or the end), not the first token's
            self.heard, self.num_cached_prompt = True, ev.num_cached_prompt
        if ev.num_fed:
            self.tokens_processed[ev.model] = self.tokens_processed.get(ev.model, 0) + ev.num_fed
        if ev.handoff_to is not None and not self.done:
            self.num_handoffs += 1
        if ev.prompt_logprobs is not None:
            self.prompt_logprobs = ev.prompt_logprobs
        if self.done:  # e.g. tokens that raced with the abort sent after a stop string
            return None
        new_ids: list[int] = []
        new_logprobs = None
        if ev.token_ids:
            if self.t_first is None:
                self.t_first = time.monotonic()
            new_ids = self._add_tokens(ev.token_ids)
            self.token_models.extend([ev.model] * len(new_ids))
            if self.logprobs is not None:
                new_logprobs = list(ev.logprobs[: len(new_ids)])  # a stop string may have cut the tokens
                self.logprobs.extend(new_logprobs)
        if ev.finish_reason is not None and not self.done:
            reason = ev.finish_reason
            if reason in ("stop", "length") and self._append_text(self.detok.flush()):
                reason = "stop"
            self.finish_reason = reason
            self.error = ev.error
        if self.done:
            self.t_end = time.monotonic()
        safe = self.stops.safe_length(self.text, final=self.done)
        delta_text = self.text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        if not new_ids and not delta_text and not self.done:
            return None
        return StreamDelta(
            request_id=self.req.request_id,
            text=delta_text,
            token_ids=list(new_ids),
            model=ev.model if new_ids else None,
            finish_reason=self.finish_reason,  # type: ignore[arg-type]
            error=self.error,
            output=self.output() if self.done else None,
            logprobs=(new_logprobs or []) if self.logprobs is not None else None,
        )

    def fail(self, error: str, ev: WorkerEvent) -> StreamDelta:
        """End the output with an error raised while building it; the last delta carries it."""
        if ev.finish_reason is not None:
            self.worker_done = True
        self.finish_reason, self.error = "error", error
        self.t_end = time.monotonic()
        return StreamDelta(
            self.req.request_id, "", [], None, "error", error, self.output(), [] if self.logprobs is not None else None
        )

    def expire(self, why: str) -> StreamDelta:
        """End the output here with 'abort' (its deadline passed), before the workers have
        confirmed: `worker_done` waits for their word. The last delta carries the rest of the text."""
        self.finish_reason, self.error = "abort", why
        self.t_end = time.monotonic()
        self._append_text(self.detok.flush())
        delta_text = self.text[self.emitted :]
        self.emitted = len(self.text)
        logprobs = [] if self.logprobs is not None else None
        return StreamDelta(self.req.request_id, delta_text, [], None, "abort", why, self.output(), logprobs=logprobs)

    def _add_tokens(self, ids: list[int]) -> list[int]:
        """Take the event's tokens (several when a verifier accepts drafts); return those kept.
        With stop strings, one token at a time: the output ends at the token whose text completes
        a stop string, as when tokens come one per step, and later ones are dropped."""
        if not self.stops.stop:
            self.token_ids.extend(ids)
            if self._append_text(self.detok.add(ids)):
                self.finish_reason = "stop"
            return ids
        for n, token in enumerate(ids, 1):
            self.token_ids.append(token)
            if self._append_text(self.detok.add([token])):
                self.finish_reason = "stop"
                return ids[:n]
        return ids

    def _append_text(self, new_text: str) -> bool:
        """Add stable text; cut it at a stop string and return True if one appeared."""
        if not new_text:
            return False
        self.text += new_text
        cut = self.stops.find(self.text, len(new_text))
        if cut is None:
            return False
        self.text = self.text[:cut]
        return True

    def output(self) -> RequestOutput:
        end = self.t_end if self.t_end is not None else time.monotonic()
        return RequestOutput(
            request_id=self.req.request_id,
            text=self.text,
            token_ids=list(self.token_ids),
            token_models=list(self.token_models),
            finish_reason=self.finish_reason or "abort",  # type: ignore[arg-type]
            prompt_token_ids=list(self.req.prompt_ids),
            error=self.error,
            num_cached_prompt_tokens=self.num_cached_prompt,
            num_handoffs=self.num_handoffs,
            tokens_processed=dict(self.tokens_processed),
            time_to_first_token=None if self.t_first is None else self.t_first - self.t_start,
            latency=end - self.t_start,
            logprobs=None if self.logprobs is None else list(self.logprobs),
            prompt_logprobs=self.prompt_logprobs,
        )
