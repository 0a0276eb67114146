"""The CPU cores an engine's workers step on: they take turns, each step alone on every core.

On a GPU each worker's forward is queued on the device; on CPU every worker's forward runs on
the same cores and, above all, the same memory bus: a decode step reads all of a model's weights
whatever its batch. Measured on the demo pair (docs/benchmarks.md), two workers stepping at once
on a core each ran 0.7x as fast as one loop stepping each model in turn on both cores: the small
model, stepping three times as often on a few rows, re-read its weights at a rate that took the
large model's memory bandwidth. A fixed split also idles half the machine whenever one model has
nothing to do, which at one request in flight is always.

So on CPU the workers take turns, first come first served: a worker waits for the turn before
each step, runs it on every core, and gives the turn up once the step's hand-offs are posted.
A worker stepping alone never waits; two busy workers alternate, and while one steps, requests
gather at the other, so its next step is fuller. Each worker still schedules on its own: it
steps whenever it has ready requests, not in a fixed order.

Every forward runs in one compute thread that the workers hand it to (`run`), not in the
workers' own threads: GNU OpenMP keeps a thread team per thread that runs parallel regions, and
once its threads outnumber the cores it stops spinning between regions, which made each step a
fifth slower with two workers' teams on two cores. One team, in one thread, never outnumbers them.
Loading runs there too: the precision probe and the repacking compute on every core, and a team
they left in each worker's thread (idle, but counted) had the compute thread's team sleep and wake
at every parallel region: about 350 switches a step of the demo pair (benchmarks/kernels/openmp_threads.py).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from ..model import use_threads


class CoreShare:
    POLL_S = 0.25  # how often a waiting worker checks whether it should give up (it is stopping)

    def __init__(self, cores: int):
        self.cores = max(1, cores)
        self._cond = threading.Condition()
        self._holder: str | None = None
        self._queue: deque[str] = deque()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    # ---- the compute thread ----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._compute, name="tokenrouter-cpu-compute", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """End the compute thread after the job it is running (waits at most `timeout`)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    def run(self, fn: Callable[[], Any], inference_mode: bool = True) -> Any:
        """Run `fn` in the compute thread, on every core, and return its result (or raise);
        under torch's inference mode unless told otherwise (loading a model)."""
        if self._thread is None:
            raise RuntimeError("the CPU compute thread is not running")
        if threading.current_thread() is self._thread:  # already there (a forward while loading)
            with torch.inference_mode(inference_mode):
                return fn()
        done: Future = Future()
        self._jobs.put((fn, inference_mode, done))
        return done.result()

    def _compute(self) -> None:
        use_threads(self.cores)  # each forward re-checks it too (ModelRunner.threads)
        while (job := self._jobs.get()) is not None:
            fn, inference, done = job
            try:
                with torch.inference_mode(inference):
                    done.set_result(fn())
            except BaseException as e:  # the caller re-raises it, in its own thread
                done.set_exception(e)

    # ---- turns -----------------------------------------------------------------------------

    def take(self, worker: str, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait for the turn (first come, first served); False if `give_up()` became true first."""
        with self._cond:
            if self._holder == worker:
                return True
            self._queue.append(worker)
            while self._holder is not None or self._queue[0] != worker:
                if give_up():
                    self._queue.remove(worker)
                    self._cond.notify_all()  # if it was first in line, the next may go
                    return False
                self._cond.wait(self.POLL_S)
            self._queue.popleft()
            self._holder = worker
            return True

    def give(self, worker: str) -> None:
        """End `worker`'s turn (a no-op if it does not hold it)."""
        with self._cond:
            if self._holder == worker:
                self._holder = None
                self._cond.notify_all()

    @property
    def holder(self) -> str | None:
        return self._holder

    def waiting(self) -> list[str]:
        with self._cond:
            return list(self._queue)
