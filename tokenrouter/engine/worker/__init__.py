"""A model's worker: the thread that steps its core (`thread.py`), what it is sent (`inbox.py`),
the protocol it shares with a worker in a Ray actor, CPU turns, and the lockstep baseline."""

from .cpu_turns import CoreShare
from .inbox import Abort, HandOff, Release, Stop, Submit
from .lockstep import LockstepDriver
from .protocol import Sink, Worker, WorkerSettings
from .stats import WorkerStats
from .thread import WorkerThread

__all__ = ["Abort", "HandOff", "Release", "Stop", "Submit", "CoreShare", "LockstepDriver", "Sink", "Worker"]
__all__ += ["WorkerSettings", "WorkerStats", "WorkerThread"]
