"""What a worker reports about itself: its core's statistics (scheduler, KV pool, steps) and its
thread's (idle, holding for B, waiting for the cores). Plain data, read by `Engine.stats()`,
`Engine.metrics()` and the throughput model."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    attention_backend: str = ""  # "torch", "cpu" or "flashinfer" (ModelSpec.attention_backend)
    # why attention_backend="auto" runs "torch": on CUDA flashinfer failed to import, does not support
    # the model there, or failed its load-time self-test; on CPU the C kernel did not build or does not
    # compute the dtype (engine/attention/choice.py); else None
    attention_fallback: str | None = None
    cuda_graph_batch_sizes: list[int] = field(default_factory=list)  # decode steps replayed from CUDA graphs
    cuda_graph_error: str | None = None  # why capturing them failed ("RuntimeError: ..."; the log has the traceback)
    # "fused": a few C calls a layer on the GGUF block kernels (engine/model/fused_decoder.py);
    # else "transformers: " and why not
    model_forward: str = ""
    torch_threads: int | None = None  # torch threads the forwards are meant to run on
    steps_by_threads: dict[int, int] = field(default_factory=dict)  # steps by the torch threads they ran on
    # a verifier's own proposals (`Route.proposals`: Speculative(lookup=True)'s prompt-lookup drafts):
    # tokens it proposed and checked, and the ones it accepted
    proposed_tokens: int = 0
    proposed_accepted: int = 0
    time_transport_s: float = 0.0  # sending hand-offs and events to other processes (Ray actors; 0 in one process)
