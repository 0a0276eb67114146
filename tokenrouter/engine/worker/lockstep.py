"""The lockstep baseline: one thread steps every model's batch in turn, so each waits for the others.

This is how the routing algorithms' official implementations serve: step the small model's
batch, then the large model's, and so on. It runs the very same workers (scheduler, KV pool,
hand-offs that keep KV) as the routed engine; only who drives the steps differs. It exists to
measure the routed engine against, not to serve. Its workers share one wake event (give each
`WorkerThread` the driver's `wake`), so a post to any of them wakes the driver.
"""

from __future__ import annotations

import threading

import torch

from .thread import WorkerThread


class LockstepDriver:
    def __init__(self, workers: list[WorkerThread], wake: threading.Event):
        self.workers = workers
        self.wake = wake
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tokenrouter-lockstep", daemon=True)
        for w in self.workers:
            w.bind_thread(self._thread)
        self._thread.start()

    def _run(self) -> None:
        for w in self.workers:  # load every model in this, the one stepping thread, on its device
            with w.on_device():
                w.load()
        if any(w.load_failed for w in self.workers):
            return
        try:
            with torch.inference_mode():
                while True:
                    self.wake.clear()
                    stepped = False
                    for w in self.workers:
                        with w.on_device():  # each worker's device and stream, as its own thread has them
                            w.drain_inbox()  # including hand-offs from the previous worker's step
                            if w.stopping:
                                continue
                            if w.core.num_ready:
                                w.step()
                                stepped = True
                    if all(w.stopping for w in self.workers):
                        break
                    if not stepped:
                        self.wake.wait(timeout=1.0)
        except BaseException as e:
            for w in self.workers:
                w.fail(e)
        finally:
            for w in self.workers:
                with w.on_device():
                    w.shut_down()
