"""From what a caller passes `generate` to the requests a worker can run, checked on the caller's
side so that nothing invalid reaches a worker: the prompt as token ids (`prompts.py`), the
sampling parameters, the tools and the tool choice, a grammar compiled (off the event loop) for
structured output, and one `Request` per sample. Every error is an `InvalidRequestError` naming
the field, or `EngineNotRunningError`."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable, Sequence

import anyio

from ..config import SamplingParams
from ..engine import LoadedModel, Request, Worker
from ..errors import EngineNotRunningError, InvalidRequestError
from ..structured import GrammarCompiler, format_of
from .prompts import Prompt, encode_prompt
from .tool_calls import ToolCallParser, ToolChoice, check_tool_choice, constrains, normalize_tools, parser_for


class InputProcessor:
    def __init__(
        self,
        entry: LoadedModel,
        workers: dict[str, Worker],
        models: list[str],
        grammars: GrammarCompiler,
        in_use: Callable[[str], bool],
    ):
        self.entry = entry  # the entry model: its tokenizer, vocabulary and context limit
        self.workers = workers
        self.models = models  # every model a request may visit
        self.grammars = grammars
        self.in_use = in_use  # whether a request id is taken

    async def prepare(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        request_id: str | None,
        tools,
        tool_choice: ToolChoice,
        parallel_tool_calls: bool = True,
    ) -> tuple[list[Request], ToolCallParser | None]:
        """A checked request (its grammar compiled) and its n samples: the first keeps the id and
        the seed, the others get `<id>/<i>` and seeds of their own; and the tool-call parser.

        The grammar: a response format alone; with tools, calls as `tool_choice` says (forced
        for "required" or a named function), at most one where `parallel_tool_calls` is False,
        and under "auto" with a response format, either calls or that format (agent frameworks
        send their output type with the tools on every turn)."""
        if tools is not None:
            tools = normalize_tools(tools)
        tool_choice = check_tool_choice(tool_choice, tools)
        if not isinstance(parallel_tool_calls, bool):
            raise InvalidRequestError("parallel_tool_calls", f"must be True or False, got {parallel_tool_calls!r}")
        req = self.new_request(prompt, params, request_id, tools)
        self.check_admissible(req)
        parser = parser_for(self.entry.tokenizer, tools) if tools is not None and tool_choice != "none" else None
        fmt = req.params.response_format
        if parser is not None and (constrains(tool_choice) or fmt is not None or not parallel_tool_calls):
            alternative = format_of(fmt) if fmt is not None and tool_choice == "auto" else None
            tag = parser.structural_tag(tools, tool_choice, parallel_tool_calls, alternative)
            req.grammar = await anyio.to_thread.run_sync(self.grammars.compile_structural_tag, tag)
        elif fmt is not None:
            req.grammar = await anyio.to_thread.run_sync(self.grammars.compile, fmt)
        samples = [req] + [
            dataclasses.replace(req, request_id=f"{req.request_id}/{i}", seed=sample_seed(req.seed, i))
            for i in range(1, req.params.n)
        ]
        if any(self.in_use(s.request_id) for s in samples[1:]):
            raise InvalidRequestError("request_id", f"{req.request_id!r}'s samples' ids are already in use")
        return samples, parser

    def new_request(
        self, prompt: Prompt, params: SamplingParams | None, request_id: str | None, tools: list[dict] | None = None
    ) -> Request:
        entry = self.entry
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", f"must be SamplingParams, got {type(params).__name__}")
        worker = self.workers[entry.name]
        if not worker.alive:
            raise EngineNotRunningError(f"worker {entry.name!r} is not running: {worker.error or 'stopped'}")
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id", "must be a non-empty string")
        if self.in_use(request_id):
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        bad = [t for t in params.stop_token_ids if t >= entry.vocab_size]
        if bad:
            raise InvalidRequestError("stop_token_ids", f"{bad[0]} is outside the vocabulary [0, {entry.vocab_size})")
        ids = encode_prompt(entry.tokenizer, prompt, entry.vocab_size, entry.max_model_len, tools)
        room = entry.max_model_len - len(ids)
        if params.max_tokens is None:  # the room left in the context and in every pool it may visit
            room = min(room, *(self.workers[m].capacity_tokens - len(ids) for m in self.models))
        return Request(
            request_id=request_id,
            prompt_ids=ids,
            params=params,
            seed=params.seed if params.seed is not None else random.getrandbits(63),
            stop_token_ids=frozenset(params.stop_token_ids),
            max_tokens=max(1, room) if params.max_tokens is None else min(params.max_tokens, room),
        )

    def check_admissible(self, req: Request) -> None:
        """Every model the request may visit is serving, and its pool can hold the whole request."""
        for name in self.models:
            worker = self.workers[name]
            if not worker.alive:
                raise EngineNotRunningError(
                    f"worker {name!r} is not running ({worker.error or 'stopped'}); close the engine and start it again"
                )
        need = len(req.prompt_ids) + req.max_tokens
        for name in self.models:
            holds = self.workers[name].capacity_tokens
            if need > holds:
                field = "prompt" if len(req.prompt_ids) >= holds else "max_tokens"
                raise InvalidRequestError(
                    field,
                    f"the request needs KV for {need} tokens (prompt {len(req.prompt_ids)} + max_tokens "
                    f"{req.max_tokens}), but model {name!r}'s pool holds {holds} tokens",
                )


def check_deadline(deadline_s) -> None:
    """`deadline_s` of `generate` and the others: None, or a finite number of seconds > 0."""
    if deadline_s is None:
        return
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not 0 < deadline_s < float("inf"):
        raise InvalidRequestError("deadline_s", f"must be a number of seconds > 0, got {deadline_s!r}")


def params_per_prompt(prompts: Sequence[Prompt], params) -> list[SamplingParams | None]:
    """`generate_batch`'s params: one SamplingParams for all, or one per prompt."""
    if isinstance(prompts, (str, bytes, bytearray, memoryview)) or not isinstance(prompts, Sequence):
        raise InvalidRequestError("prompts", f"must be a list of prompts, got {type(prompts).__name__}")
    n = len(prompts)
    if params is None or isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, Sequence) and not isinstance(params, str):
        if len(params) != n:
            raise InvalidRequestError(
                "params", f"{len(params)} SamplingParams for {n} prompts; give one for all, or one per prompt"
            )
        return list(params)
    raise InvalidRequestError("params", f"must be SamplingParams or a list of them, got {type(params).__name__}")


def sample_seed(seed: int, i: int) -> int:
    """Sample i's seed: a stream of its own, reproducible from the request's (the golden-ratio step)."""
    return (seed + i * 0x9E3779B97F4A7C15) % (1 << 63)
