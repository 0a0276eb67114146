"""Models whose workers run in Ray actors, placed where their hardware is (docs/distributed.md).

The engine stays in the caller's process; a model with `ModelSpec(placement=RayPlacement(...))`
gets its worker (the same `ModelCore` and stepping thread) in a Ray actor. `fleet.py` launches
them and keeps what the engine sees in order; `actor.py` is the actor; `remote_worker.py` the
caller's handle on it; `linked_worker.py` and `links.py` the workers' lines to peers in other
processes; `wire.py` what crosses. Ray is imported only here, and only when a model is placed.
"""

from .fleet import Fleet

__all__ = ["Fleet"]
