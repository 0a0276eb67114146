"""What a worker reports: one event per request a step touched, and the worker's statistics.

Plain data, so that the engine's output side (`output_processor`, `request_channel`) and the
caller depend on these and not on the worker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...policies.base import PeerMessage


@dataclass
class WorkerEvent:
    """What a step did to one request: tokens it appended, a hand-off, or the request's end."""

    request_id: str
    token_ids: list[int]
    model: str
    finish_reason: str | None = None
    error: str | None = None
    handoff_to: str | None = None
    resubmit: PeerMessage | None = None  # standard-serving baseline: the caller sends this on
    num_fed: int = 0  # tokens this worker processed for the request since its previous event
    num_cached_prompt: int = 0
    logprobs: list | None = None  # one outputs.TokenLogprob per token of token_ids, when the request asks
    prompt_logprobs: list | None = None  # the prompt's records (the first None), once, when asked


Sink = Callable[[list[WorkerEvent]], None]


@dataclass
class WorkerStats:
    model: str
    kv_blocks_total: int
    kv_blocks_free: int
    kv_block_size: int
    kv_cache_bytes: int
    running: int
    waiting: int
    pending: int
    steps: int
    tokens_processed: int
    preemptions: int
    evictions: int
    handoffs_received: int
    handoffs_sent: int
    prefix_cache_hit_tokens: int
    batch_size_histogram: dict[int, int]
    time_forward_s: float  # inside the model's forward
    time_step_s: float  # whole steps: schedule, forward, sample, route, bookkeeping
    time_idle_s: float  # nothing to do
    time_waiting_for_batch_s: float  # holding back to gather a batch of B (delayed batching)
    alive: bool
    error: str | None
    batch_min: int = 1  # B in force (delayed batching)
    time_waiting_for_cores_s: float = 0.0  # on CPU: waiting for another worker's step (engine/worker/cpu_turns.py)
    attention_backend: str = ""  # "torch" or "flashinfer" (ModelSpec.attention_backend)
    cuda_graph_batch_sizes: list[int] = field(default_factory=list)  # decode steps replayed from CUDA graphs
    torch_threads: int | None = None  # torch threads the forwards are meant to run on
    steps_by_threads: dict[int, int] = field(default_factory=dict)  # steps by the torch threads they ran on
    time_transport_s: float = 0.0  # sending hand-offs and events to other processes (Ray actors; 0 in one process)
