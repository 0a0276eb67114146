"""A worker: one model's `ModelCore`, stepped by its own background thread.

The thread never blocks on anyone: the caller and peer workers post to its inbox, and it posts
each step's results (new tokens, hand-offs, ends) to a sink callback, once per step for the
whole batch, and the step's hand-offs to the peers' inboxes. Between steps it may hold back to
gather a batch of B (delayed batching) and, on a shared CPU, wait for its turn on the cores.

Everything torch does for the model (loading it, allocating its KV pool, every step) happens in
this thread: with GNU OpenMP, another thread that has run a multi-threaded torch op stays in
libgomp's count, and once threads outnumber cores libgomp stops spinning between parallel
regions and each op gets ~25% slower.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch

from ..model import LoadedModel, usable_cores, use_threads
from ..model_core import ModelCore
from ..outbox import Outbox
from ..sequence import Request
from .cpu_turns import CoreShare
from .inbox import Abort, Call, HandOff, Inbox, Message, Release, Stop, Submit
from .protocol import Sink, WorkerSettings
from .stats import WorkerStats

log = logging.getLogger(__name__)


class WorkerThread:
    # Where the worker computes, for the throughput model: the machine (workers on several share
    # nothing) and the seconds a hand-off takes to reach a peer (none within one process).
    host = socket.gethostname()
    handoff_delay_s = 0.0

    def __init__(
        self,
        core: ModelCore,
        sink: Sink,
        settings: WorkerSettings = WorkerSettings(),
        core_share: CoreShare | None = None,
        wake: threading.Event | None = None,
    ):
        self.core = core
        self.name = core.name
        self.sink = sink
        self.settings = settings
        self.batch_min = max(1, min(settings.batch_min, core.spec.max_num_seqs))  # B, moved at run time
        self.core_share = core_share  # else: on CPU, steps taken in turns with the other workers
        self.inbox = Inbox(wake)  # a shared `wake` lets one lockstep driver hear every worker
        self.peers: dict[str, WorkerThread] = {}
        self.error: str | None = None
        self.stopping = False
        self._ready = threading.Event()
        self._setup_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stream: torch.cuda.Stream | None = None  # on CUDA: the stream every step runs on (on_device)
        # time spent in the loop, outside steps
        self.time_idle = 0.0
        self.time_waiting_for_batch = 0.0
        self.time_waiting_for_cores = 0.0

    # ---- set-up ----------------------------------------------------------------------------
    def load(self) -> None:
        """Set this thread's torch threads, then load the core: in this thread, or where workers
        take turns on the CPU in the compute thread, whose OpenMP team then serves the load's
        parallel work (the probe, repacking) as it serves every forward (engine/worker/cpu_turns.py)."""
        try:
            if self.settings.num_threads is not None:
                own = forward_threads = self.settings.num_threads
            elif self.core_share is not None:  # forwards run in the shared compute thread, on every core;
                own, forward_threads = 1, self.core_share.cores  # this thread's sampling stays off OpenMP teams
            else:  # alone on the cores, whatever count the caller's threads set
                own = forward_threads = usable_cores()
            use_threads(own)
            share = self.core_share
            if share is None:
                self.core.load(None, forward_threads)
            else:
                share.run(lambda: self.core.load(share.run, forward_threads), inference_mode=False)
        except BaseException as e:
            self._setup_error = e
            self.inbox.close()
        finally:
            self._ready.set()

    def wait_ready(self) -> LoadedModel:
        """Block until load() is done; re-raise its error (missing weights, bad budget, ...)."""
        self._ready.wait()
        if self._setup_error is not None:
            raise self._setup_error
        assert self.core.loaded is not None
        return self.core.loaded

    @property
    def load_failed(self) -> bool:
        return self._setup_error is not None

    def connect(self, peers: dict[str, WorkerThread]) -> None:
        self.peers = {name: w for name, w in peers.items() if w is not self}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"tokenrouter-worker-{self.name}", daemon=True)
        self._thread.start()

    def bind_thread(self, thread: threading.Thread) -> None:
        """Another thread steps this worker (the lockstep driver); it is the one `alive` watches."""
        self._thread = thread

    # ---- called from other threads -------------------------------------------------------
    def submit(self, req: Request) -> bool:
        return self.inbox.post(Submit(req))

    def abort(self, request_id: str) -> None:
        self.inbox.post(Abort(request_id))

    def release(self, request_id: str) -> None:
        """Drop a pending copy of a request that ended elsewhere."""
        self.inbox.post(Release(request_id))

    def hand_off(self, msg, req: Request) -> bool:
        return self.inbox.post(HandOff(msg, req))

    def stop(self) -> None:
        self.inbox.post(Stop())

    def set_batch_min(self, b: int) -> None:
        """Change B (delayed batching) at run time, from any thread; the loop re-checks at once."""
        self.batch_min = max(1, min(int(b), self.core.spec.max_num_seqs))
        self.inbox.wake.set()

    def call(self, fn: Callable[[ModelCore], Any]) -> Future:
        """Run `fn(core)` in this worker's thread between steps, alone on the cores; the future
        gets its result or its error (profiling, forgetting the prefix cache)."""
        future: Future = Future()
        if not self.inbox.post(Call(fn, future)):
            future.set_exception(RuntimeError(f"worker {self.name!r} is not running: {self.error or 'stopped'}"))
        return future

    def reset_prefix_cache(self) -> Future:
        """Forget the prefix cache's free blocks between steps; the future gets the number forgotten."""
        return self.call(lambda core: core.blocks.forget_free_prefixes())

    def routing_counters(self) -> dict[str, float | dict[int, int]]:
        return self.core.routing_counters()

    @property
    def takes_turns(self) -> bool:
        """Whether its steps take turns on this process's CPU cores with the other workers'."""
        return self.core_share is not None

    @property
    def capacity_tokens(self) -> int:
        """Tokens the KV pool holds (a request must fit whole); the core must be loaded."""
        return self.core.blocks.capacity_tokens

    @property
    def torch_threads(self) -> int | None:
        return self.core.torch_threads

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.inbox.closed

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def stats(self) -> WorkerStats:
        """The core's statistics (its scheduler's and KV pool's among them) and this thread's."""
        return WorkerStats(
            **vars(self.core.stats()),
            time_idle_s=self.time_idle,
            time_waiting_for_batch_s=self.time_waiting_for_batch,
            alive=self.alive,
            error=self.error,
            batch_min=self.batch_min,
            time_waiting_for_cores_s=self.time_waiting_for_cores,
        )

    # ---- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        with self.on_device():
            self._serve()

    @contextmanager
    def on_device(self) -> Iterator[None]:
        """On CUDA: the worker's device and its own stream made current, in whatever thread steps
        it (its own, or the lockstep driver), so that two workers on one GPU overlap and its CUDA
        graphs are captured on the stream their warm-up ran on. Elsewhere: nothing."""
        device = torch.device(self.core.spec.device)
        if device.type != "cuda" or not torch.cuda.is_available():
            yield
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        with torch.cuda.device(device), torch.cuda.stream(self._stream):
            yield

    def _serve(self) -> None:
        self.load()
        if self._setup_error is not None:
            return
        wake = self.inbox.wake
        hold_since: float | None = None
        try:
            with torch.inference_mode():
                while True:
                    wake.clear()
                    self.drain_inbox()
                    if self.stopping:
                        break
                    ready = self.core.num_ready
                    if ready == 0:
                        hold_since = None
                        t0 = time.perf_counter()
                        wake.wait(timeout=1.0)
                        self.time_idle += time.perf_counter() - t0
                        continue
                    if ready < self.batch_min and self.settings.batch_wait_s > 0:  # delayed batching
                        now = time.perf_counter()
                        hold_since = hold_since or now
                        left = self.settings.batch_wait_s - (now - hold_since)
                        if left > 0:
                            wake.wait(timeout=left)
                            self.time_waiting_for_batch += time.perf_counter() - now
                            continue
                    hold_since = None
                    if self._take_turn():
                        if self.core_share is not None:
                            self.drain_inbox()  # what arrived while we waited joins this step
                            if self.stopping:
                                continue
                        self.step()
        except BaseException as e:  # the loop itself broke: fail everything, report, and die
            self.fail(e)
        finally:
            self._end_turn()
            self.shut_down()

    def step(self) -> None:
        """One step of the core; then its events to the caller and its hand-offs to the peers."""
        self.deliver(self.core.step())
        self._end_turn()  # after the hand-offs are posted, so a peer waiting for the turn steps them

    def deliver(self, out: Outbox) -> None:
        """Releases to every peer, then events to the caller, then hand-offs: a peer's tokens must
        never reach the caller before ours. A hand-off a peer refuses (it stopped or died) ends
        its request here."""
        for request_id in out.releases:
            for peer in self.peers.values():
                peer.release(request_id)
        if out.events:
            self.sink(out.events)
        late = Outbox()
        for h in out.handoffs:
            peer = self.peers[h.target]
            if not peer.hand_off(h.msg, h.req):
                reason, err = ("abort", None) if self.stopping or peer.error is None else ("error", peer.error)
                self.core.end_request(h.req.request_id, reason, err, late)
        if late.events:
            self.deliver(late)

    def drain_inbox(self) -> None:
        """Apply everything posted so far (the stepping thread only)."""
        out = Outbox()
        while (message := self.inbox.take()) is not None:
            self._handle(message, out)
        self.deliver(out)

    def _handle(self, message: Message, out: Outbox) -> None:
        core = self.core
        if isinstance(message, Submit):
            core.add(message.req)
        elif isinstance(message, HandOff):
            core.receive(message.msg, message.req, out, refuse=self.stopping or self.inbox.closed, error=self.error)
        elif isinstance(message, Abort):
            core.abort(message.request_id, out)
        elif isinstance(message, Release):
            core.release(message.request_id)
        elif isinstance(message, Stop):
            self.stopping = True
        elif isinstance(message, Call):
            self._call(message.fn, message.future)

    def _call(self, fn: Callable[[ModelCore], Any], future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        if self.stopping or self.inbox.closed:
            future.set_exception(RuntimeError(f"worker {self.name!r} is stopping"))
            return
        try:
            held = self.core_share is not None and self.core_share.holder == self.name
            if not held and not self._take_turn():  # alone on the cores, as steps run when serving
                raise RuntimeError(f"worker {self.name!r} is stopping")
            try:
                future.set_result(fn(self.core))
            finally:
                if not held:
                    self._end_turn()
        except Exception as e:
            log.exception("worker %r: a call between steps failed", self.name)
            future.set_exception(e)

    def _take_turn(self) -> bool:
        """On a shared CPU, wait for the other workers' steps (engine/worker/cpu_turns.py); False if stopping."""
        if self.core_share is None:
            return True
        t0 = time.perf_counter()
        took = self.core_share.take(self.name, give_up=lambda: self.stopping)
        self.time_waiting_for_cores += time.perf_counter() - t0
        return took

    def _end_turn(self) -> None:
        if self.core_share is not None:
            self.core_share.give(self.name)

    def fail(self, e: BaseException) -> None:
        self.error = f"worker {self.name!r} died: {type(e).__name__}: {e}"
        log.error("%s\n%s", self.error, traceback.format_exc())

    def shut_down(self) -> None:
        """Refuse further posts, then end whatever is still here (called once, by the stepping thread)."""
        self.inbox.close()
        self.drain_inbox()  # whatever arrived before the door closed
        out = Outbox()
        self.core.end_all("abort" if self.error is None else "error", self.error, out)
        self.deliver(out)
