"""`LLM`: the engine for scripts and notebooks, with blocking calls instead of awaits.

The engine runs in an event loop of its own, in a thread of its own (anyio's blocking portal);
each call hands its work to that loop and waits for it. The caller's thread never runs that
loop, so the same calls work from a plain script and from inside a running asyncio or trio loop
(a Jupyter cell), where they block that loop as any blocking call does.

A process that forgets `close()` still exits: when the main thread ends, a watcher thread closes
every LLM left open. Otherwise the engine's threads are frozen mid-call at interpreter shutdown,
and the process hangs in the portal's cleanup or aborts in torch's. An LLM that is
garbage-collected while open is closed in the background.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from anyio.from_thread import start_blocking_portal

from .api import Engine, Prompt, ToolChoice
from .config import ModelSpec, SamplingParams
from .errors import EngineNotRunningError, InvalidRequestError
from .metrics import EngineMetrics
from .outputs import RequestOutput, StreamDelta
from .policies import Policy

_TEXT = (str, bytes, bytearray, memoryview)
_END = object()  # a stream's end, as a value in its queue


@dataclass
class _Failed:
    """A stream's error, carried through its queue to the reading thread."""

    error: Exception


class LLM:
    """The engine behind blocking calls: `LLM(models, policy, ...)` takes `Engine`'s arguments,
    loads the models and starts the workers at once; `close()` (or a `with` block) stops them.

    >>> with LLM(models={"m": "path/to/model"}) as llm:
    ...     outs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_tokens=16))

    Bad arguments raise `ConfigError` here, bad requests `InvalidRequestError` naming the field,
    in the caller's thread, as `Engine` does. Any thread may call an open LLM."""

    def __init__(
        self,
        models: Mapping[str, str | Path | ModelSpec] | None = None,
        policy: Policy | None = None,
        **options,
    ):
        self.engine = Engine(models, policy, **options)
        self._loop = _EngineLoop(self.engine)
        finalizer = weakref.finalize(self, self._loop.close_soon)
        finalizer.atexit = False  # at exit the watcher has closed it already

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (requests in flight end with 'abort'); closing again does nothing."""
        self._loop.close()

    @property
    def closed(self) -> bool:
        return self._loop.closed

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Outputs in prompt order. `prompts` is one prompt (a string, token ids or chat messages)
        or a list of them, submitted at once so the workers batch them; `params` one
        SamplingParams for all, or a list of one per prompt. An empty list returns []."""
        if _is_batch(prompts):
            return self._loop.call(self.engine.generate_batch, list(prompts), params)
        return [self._loop.call(self.engine.generate, prompts, params)]

    def chat(
        self,
        messages: Sequence[Mapping] | Sequence[Sequence[Mapping]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        deadline_s: float | None = None,
    ) -> list[RequestOutput]:
        """`generate` for one conversation (a list of chat messages, rendered with the model's
        chat template) or a list of conversations; the other arguments as for `Engine.generate`
        (the calls come back parsed in each output's `tool_calls`)."""
        kw = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls}
        kw["deadline_s"] = deadline_s
        if _is_conversation(messages):
            return [self._loop.call(partial(self.engine.generate, messages, params, **kw))]
        if isinstance(messages, _TEXT) or not isinstance(messages, Sequence):
            raise InvalidRequestError(
                "messages", f"must be chat messages or a list of conversations, got {type(messages).__name__}"
            )
        for i, conversation in enumerate(messages):
            if not _is_conversation(conversation):
                raise InvalidRequestError(
                    f"messages[{i}]", f"must be a conversation (a list of chat messages), got {conversation!r:.60}"
                )
        return self._loop.call(partial(self.engine.generate_batch, list(messages), params, **kw))

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        deadline_s: float | None = None,
    ) -> Iterator[StreamDelta]:
        """Deltas as they are written, blocking until each; the last one carries finish_reason and
        the whole output (`Engine.stream`'s arguments). Leaving the loop early aborts the request
        and frees its KV."""
        kw = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls}
        yield from self.iterate(
            partial(self.engine.stream, prompt, params, request_id=request_id, deadline_s=deadline_s, **kw)
        )

    def run(self, fn, *args):
        """`await fn(*args)` in the engine's event loop, blocking until it returns: a seam for code
        built on the async engine (`tokenrouter.openai`'s sync client) to run on this one."""
        return self._loop.call(fn, *args)

    def iterate(self, factory) -> Iterator:
        """The items of the async iterator `factory()` makes, run in the engine's loop, blocking
        until each. Leaving early cancels it (a stream's request is then aborted).

        A task in the engine's loop reads the iterator into a queue that this thread reads, so a
        close() racing with the reader still hands it the last item: closing lets the loop's tasks
        finish before the loop ends."""
        items: queue.SimpleQueue = queue.SimpleQueue()

        async def pump() -> None:
            try:
                async for item in factory():
                    items.put(item)
            except Exception as e:  # bad input (checked at the first read, as Engine.stream does), a dead worker
                items.put(_Failed(e))
            finally:
                items.put(_END)

        task = self._loop.start(pump)
        try:
            while (item := items.get()) is not _END:
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            task.cancel()  # leaving early: the task's iterator is closed, which aborts a stream's request

    def abort(self, request_id: str) -> None:
        """End a request early (a stream read in another thread): it ends with 'abort'."""
        self._loop.call(self.engine.abort, request_id)

    def metrics(self) -> EngineMetrics:
        """`Engine.metrics()`: requests ended, latencies, tokens per model, KV and queues."""
        return self.engine.metrics()


def _is_conversation(x) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, _TEXT) and len(x) > 0 and isinstance(x[0], Mapping)


def _is_batch(prompts) -> bool:
    """A list of prompts rather than one prompt: a list whose first item is itself a prompt (a
    string, or a list of token ids or of messages), or an empty list."""
    if isinstance(prompts, _TEXT) or not isinstance(prompts, Sequence):
        return False
    return len(prompts) == 0 or isinstance(prompts[0], (str, Sequence))


class _EngineLoop:
    """An engine started in an event loop of its own, in a daemon thread, until `close()`."""

    def __init__(self, engine: Engine):
        self._lock = threading.Lock()
        self._stack = ExitStack()
        try:
            self.portal = self._stack.enter_context(start_blocking_portal(name="tokenrouter-llm"))
            self._stack.enter_context(self.portal.wrap_async_context_manager(engine))  # engine.start()
        except BaseException:
            self._stack.close()
            raise
        self.closed = False
        _watch_exit(self)

    def call(self, fn, *args):
        """`await fn(*args)` in the engine's loop (plain `fn(*args)` if it is not async)."""
        if self.closed:
            raise EngineNotRunningError("the LLM is closed")
        try:
            return self.portal.call(fn, *args)
        except RuntimeError as e:
            if self.closed:  # closed while the call was on its way
                raise EngineNotRunningError("the LLM is closed") from e
            raise

    def start(self, fn):
        """Run `fn()` as a task in the engine's loop; its concurrent Future (cancel() cancels it)."""
        if self.closed:
            raise EngineNotRunningError("the LLM is closed")
        try:
            return self.portal.start_task_soon(fn)
        except RuntimeError as e:
            if self.closed:
                raise EngineNotRunningError("the LLM is closed") from e
            raise

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            _OPEN.discard(self)
            self._stack.close()  # engine.close() in its loop, then the loop and its thread end

    def close_soon(self) -> None:
        """Close from a thread of its own: a garbage collection may run in the engine's loop thread."""
        if not self.closed:
            threading.Thread(target=self.close, name="tokenrouter-close", daemon=False).start()


_OPEN: set[_EngineLoop] = set()
_WATCHER: list[threading.Thread] = []  # at most one, started with the first LLM
_WATCHER_LOCK = threading.Lock()


def _watch_exit(loop: _EngineLoop) -> None:
    with _WATCHER_LOCK:
        _OPEN.add(loop)
        if not _WATCHER:
            # Not a daemon: the interpreter waits for it, and it closes what is open first.
            _WATCHER.append(threading.Thread(target=_close_at_exit, name="tokenrouter-exit-watcher", daemon=False))
            _WATCHER[0].start()


def _close_at_exit() -> None:
    threading.main_thread().join()  # returns when the main thread has finished, before shutdown joins threads
    for loop in list(_OPEN):
        loop.close()
