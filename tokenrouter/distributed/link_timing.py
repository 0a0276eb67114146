"""The hand-off delay between the fleet's workers, measured once every model has loaded.

A worker's `handoff_delay_s` (what the throughput model charges a request for moving) is half
its median round trip to its peers through the envelope path: between actors, an `Echo` there
and back (`WorkerActor.ping_peers`); between this process and an actor, a Ray call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping

PING_ROUNDS = 20  # round trips per link measured at start


def measure_links(
    ray, handles: Mapping[str, object], local: Iterable[str], workers: Mapping[str, object], rounds: int = PING_ROUNDS
) -> dict[str, dict[str, float]]:
    """Round trips: between actors through the envelope path, and from here to each actor (worker
    -> peer -> seconds; "caller" for this process). Each worker in `workers` gets its
    `peer_rtt_s` and `handoff_delay_s`. Once every model has loaded (a loading thread holding
    the GIL would stretch them)."""
    local = list(local)
    rtt: dict[str, dict[str, float]] = {name: {} for name in workers}
    pings = {name: h.ping_peers.remote(rounds) for name, h in handles.items()}
    for name, ref in pings.items():
        rtt[name].update(ray.get(ref))
    for name, handle in handles.items():
        ray.get(handle.ping.remote())
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            ray.get(handle.ping.remote())
            samples.append(time.perf_counter() - t0)
        for here in local:  # a worker here and one in an actor
            rtt[here][name] = rtt[name][here] = statistics.median(samples)
        rtt.setdefault("caller", {})[name] = statistics.median(samples)
    for name, worker in workers.items():
        worker.peer_rtt_s = {peer: v for peer, v in rtt.get(name, {}).items() if peer != name}
        peers = [v for peer, v in worker.peer_rtt_s.items() if peer in workers]
        worker.handoff_delay_s = statistics.mean(peers) / 2 if peers else 0.0  # over WorkerThread's 0
    return rtt
