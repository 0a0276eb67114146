"""delayed_batching="auto": how long a worker should hold back to gather a batch of B.

`latency_profile` measures each model's step latency in its worker's thread; `throughput_model`
is the Markov chain that predicts tokens/s for a choice of B; `controller` watches the routing
the workers see and re-picks B with it while the engine serves.
"""

from .controller import AutoBatching, profile_workers
from .latency_profile import LatencyProfile
from .throughput_model import ThroughputPrediction

__all__ = ["AutoBatching", "LatencyProfile", "ThroughputPrediction", "profile_workers"]
