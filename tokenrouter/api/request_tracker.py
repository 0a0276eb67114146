"""The requests in flight, on the caller's side: each one's channel (where the workers' events
for it arrive), its samples, and following it to its end.

Worker threads deliver each step's events to `dispatch`, which pushes each to its request's
channel; `follow` submits a request and turns its events into stream deltas until it has ended
on every worker. Leaving `follow` early (the caller's task was cancelled, or a stream was left)
aborts the request everywhere, so its KV blocks are freed in every worker.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable

import anyio

from ..engine import Request, Worker, WorkerEvent
from ..errors import ConfigError, EngineNotRunningError
from ..outputs import RequestOutput, StreamDelta
from ..policies import Policy
from .output_processor import OutputProcessor
from .request_channel import RequestChannel
from .tool_calls import ToolCallParser, ToolCallStream

log = logging.getLogger(__name__)


class RequestTracker:
    def __init__(
        self,
        policy: Policy,
        before_submit: Callable[[Request, str], None],
        on_end: Callable[[RequestOutput], None],
        in_flight_changed: Callable[[], None] = lambda: None,
    ):
        self.policy = policy
        self.before_submit = before_submit  # the fleet follows (or refuses) what may visit an actor
        self.on_end = on_end  # each sample's output once it has ended (metrics)
        self.in_flight_changed = in_flight_changed  # the throughput model counts requests in flight
        self.workers: dict[str, Worker] = {}  # set once they run
        self.tokenizer = None  # the entry model's, set once it is loaded
        self.channels: dict[str, RequestChannel] = {}
        self.requests: dict[str, Request] = {}
        self.families: dict[str, list[str]] = {}  # n > 1: a request id -> its samples' ids

    def __len__(self) -> int:
        """Requests submitted and not yet ended."""
        return len(self.requests)

    def in_use(self, request_id: str) -> bool:
        return request_id in self.channels

    def dispatch(self, events: list[WorkerEvent]) -> None:
        """Worker threads deliver each step's events here."""
        for ev in events:
            channel = self.channels.get(ev.request_id)
            if channel is not None:
                channel.push(ev)

    def end_all(self, model: str, error: str) -> None:
        """End every request still waiting for events (its workers were abandoned when closing)."""
        for rid, channel in list(self.channels.items()):
            channel.push(WorkerEvent(rid, [], model, finish_reason="abort", error=error))

    async def follow(
        self, reqs: list[Request], parser: ToolCallParser | None = None, deadline_s: float | None = None
    ) -> AsyncIterator[tuple[int, StreamDelta, OutputProcessor]]:
        """Submit a request, or the samples of an n > 1 request, and yield (sample, delta, its
        processor) until each has ended on every worker. Samples after the first are submitted
        once a worker has reported on the first, that is after its entry model took the prompt in,
        so they find the prompt's full blocks in the prefix cache instead of computing them again.
        All of them share one channel. With a tool-call `parser`, each delta's calls are taken out
        of its text as they close (`ToolCallStream`). Past `deadline_s` seconds every sample not
        yet ended ends with 'abort' (its error says why), and is aborted in every worker."""
        channel = RequestChannel(reqs[0].request_id)
        procs: dict[str, tuple[int, OutputProcessor]] = {}
        calls = [ToolCallStream(parser) for _ in reqs] if parser is not None else None  # per sample
        for i, req in enumerate(reqs):
            self.channels[req.request_id] = channel
            self.requests[req.request_id] = req
            procs[req.request_id] = (i, OutputProcessor(self.tokenizer, req))
        if len(reqs) > 1:
            self.families[reqs[0].request_id] = [r.request_id for r in reqs]
        self.in_flight_changed()
        aborted: set[str] = set()
        submitted: list[OutputProcessor] = []
        later = reqs[1:]
        deadline = math.inf if deadline_s is None else anyio.current_time() + deadline_s

        def ready(i: int, delta: StreamDelta) -> StreamDelta:
            delta.index = i
            if calls is not None:
                delta.text, delta.tool_calls = calls[i].feed(delta.text, final=delta.output is not None)
                if delta.output is not None:
                    calls[i].finish(delta.output)
            return delta

        try:
            # One checkpoint first: requests submitted together (a gather, C clients started at
            # once) are all counted in flight before the first asks where to start, so a planner
            # by load (Speculative(k="auto")) does not start the first of a burst on the draft
            # model as if it were alone.
            await anyio.sleep(0)
            self.submit(reqs[0])
            submitted.append(procs[reqs[0].request_id][1])
            while not all(p.worker_done for _, p in procs.values()):
                events = None
                with anyio.move_on_after(deadline - anyio.current_time()):
                    events = await channel.get()
                if events is None:  # the deadline passed: end what has not ended, here and everywhere
                    deadline, later = math.inf, []
                    for i, proc in procs.values():
                        self.abort_everywhere(proc.req)
                        aborted.add(proc.req.request_id)
                        if proc not in submitted:
                            proc.worker_done = True  # never sent: no KV anywhere
                        if not proc.done:
                            yield i, ready(i, proc.expire(f"deadline_s={deadline_s} passed")), proc
                    continue
                if later:  # the first sample's first report: its prompt is in the entry model's cache
                    for req in later:
                        self.submit(req)
                        submitted.append(procs[req.request_id][1])
                    later = []
                for ev in events:
                    i, proc = procs[ev.request_id]
                    delta = self.process(proc, ev)
                    if delta is not None:
                        yield i, ready(i, delta), proc
                for rid, (_, proc) in procs.items():
                    if proc.done and not proc.worker_done and rid not in aborted:
                        self.abort_everywhere(proc.req)  # a stop string or a failure here ended it
                        aborted.add(rid)
        finally:
            for rid, (_, proc) in procs.items():
                if not proc.worker_done:  # cancelled, or the consumer left: free its KV everywhere
                    self.abort_everywhere(proc.req)
                self.channels.pop(rid, None)
                self.requests.pop(rid, None)
            self.families.pop(reqs[0].request_id, None)
            self.in_flight_changed()
            for proc in submitted:  # each sample's life ends here, exactly once; not yet ended means abort
                self.on_end(proc.output())

    def process(self, proc: OutputProcessor, ev: WorkerEvent) -> StreamDelta | None:
        try:
            delta = proc.process(ev)
        except Exception as e:  # e.g. the tokenizer failed to decode: fail this request only
            log.exception("request %s: building its output failed", ev.request_id)
            delta = proc.fail(f"building the output failed: {type(e).__name__}: {e}", ev)
        if ev.resubmit is not None:  # standard-serving baseline: the client re-sends
            self.resubmit(ev.resubmit, proc.req, proc)
        return delta

    def submit(self, req: Request) -> None:
        model = self.policy.start_model()
        if model not in self.workers:
            raise ConfigError(
                f"{self.policy!r}.start_model() gave {model!r}, not one of its models {self.policy.models}"
            )
        self.before_submit(req, model)
        if not self.workers[model].submit(req):
            raise EngineNotRunningError(f"worker {model!r} is not running")

    def resubmit(self, msg, req: Request, proc: OutputProcessor) -> None:
        """Send a handed-off request to its next model as a new request with the whole sequence."""
        if req.aborted or proc.done or not self.workers[msg.target].hand_off(msg, req):
            proc.process(WorkerEvent(req.request_id, [], msg.source, finish_reason="abort"))

    def abort_everywhere(self, req: Request) -> None:
        req.aborted = True  # a hand-off still in transit ends when it arrives
        for worker in self.workers.values():
            worker.abort(req.request_id)

    def abort(self, request_id: str) -> None:
        """End a request early: every sample of an n > 1 request."""
        for rid in self.families.get(request_id, [request_id]):
            req = self.requests.get(rid)
            if req is not None:
                self.abort_everywhere(req)
