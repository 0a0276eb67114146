"""Models whose workers run in Ray actors, placed where their hardware is (docs/distributed.md).

The engine stays in the caller's process; a model with `ModelSpec(placement=RayPlacement(...))`
gets its worker (the same `ModelCore` and stepping thread) in a Ray actor. `fleet.py` launches
them (`placement.py` checks where they go, `link_timing.py` measures the lines between them) and
is what their events and losses pass through: `order.py` keeps what the engine sees in order,
`losses.py` ends what a lost actor held. `actor.py` is the actor, `caller_queue.py` what it sends
the caller; `remote_worker.py` the caller's handle on it; `linked_worker.py` and `links.py` the
workers' lines to peers in other processes; `wire.py` what crosses. Ray is imported only here,
and only when a model is placed.
"""

from .fleet import Fleet
from .ray_runtime import ray_installed

__all__ = ["Fleet", "ray_installed"]
