"""The lockstep baseline: one thread steps every model's batch in turn, so each waits for the others.

This is how the routing algorithms' official implementations serve: step the small model's
batch, then the large model's, and so on. It runs the very same workers (scheduler, KV pool,
hand-offs that keep KV) as the routed engine; only who drives the steps differs. It exists to
measure the routed engine against, not to serve.
"""

from __future__ import annotations

import threading

import torch

from .worker import Worker


class LockstepDriver:
    def __init__(self, workers: list[Worker]):
        self.workers = workers
        self._wake = threading.Event()
        for w in workers:
            w._wake = self._wake  # any post to any worker wakes the one driver
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tokenrouter-lockstep", daemon=True)
        for w in self.workers:
            w._thread = self._thread
        self._thread.start()

    def _run(self) -> None:
        current: Worker | None = None
        for w in self.workers:  # load every model in this, the one stepping thread
            w.setup()
        if any(w._setup_error is not None for w in self.workers):
            for w in self.workers:
                w._ready.set()
            return
        try:
            with torch.inference_mode():
                while True:
                    self._wake.clear()
                    stepped = False
                    for current in self.workers:
                        current._drain_inbox()  # including hand-offs from the previous worker's step
                        if current._stopping:
                            continue
                        if current.scheduler.num_ready:
                            current._step()
                            stepped = True
                    if all(w._stopping for w in self.workers):
                        break
                    if not stepped:
                        self._wake.wait(timeout=1.0)
        except BaseException as e:
            for w in self.workers:
                w.fail(e)
        finally:
            for w in self.workers:
                w.shut_down()
