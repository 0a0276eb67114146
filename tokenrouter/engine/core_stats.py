"""What a core has done and holds: its counters (written by the stepping thread, read from any
thread without a lock) and the statistics it reports, its scheduler's and KV pool's included."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class CoreCounters:
    """What a core has done; plain ints and floats, read from any thread without a lock."""

    steps: int = 0
    tokens_processed: int = 0
    handoffs_received: int = 0
    handoffs_sent: int = 0
    time_forward: float = 0.0
    time_step: float = 0.0
    batch_sizes: Counter = field(default_factory=Counter)
    steps_by_threads: Counter = field(default_factory=Counter)
    # what the throughput model observes (delayed_batching="auto")
    rows_stepped: int = 0  # sum of batch sizes over steps
    rows_sampled: int = 0  # tokens sampled (rows whose last token was computed)
    tokens_kept: int = 0  # sampled tokens the policy kept
    catchups: int = 0  # requests arrived from a peer
    catchup_tokens: int = 0  # tokens they needed computed on arrival
    step_tokens: dict[int, int] = field(default_factory=dict)  # steps by the tokens they computed (copy() is atomic)
    # a verifier's own proposals (`Route.proposals`, e.g. prompt lookup): tokens proposed, and accepted
    proposed_tokens: int = 0
    proposed_accepted: int = 0

    def routing(self) -> dict[str, float | dict[int, int]]:
        """What the throughput model reads (a snapshot that is not atomic, and need not be)."""
        return {
            "steps": self.steps,
            "rows_stepped": self.rows_stepped,
            "tokens_processed": self.tokens_processed,
            "rows_sampled": self.rows_sampled,
            "tokens_kept": self.tokens_kept,
            "handoffs_sent": self.handoffs_sent,
            "catchups": self.catchups,
            "catchup_tokens": self.catchup_tokens,
            "time_step": self.time_step,
            "step_tokens": self.step_tokens.copy(),
        }


@dataclass(frozen=True)
class CoreStats:
    """A core's statistics: its scheduler's and KV pool's, then its own (the names a worker's
    `WorkerStats` reports them under)."""

    model: str
    kv_blocks_total: int
    kv_blocks_free: int
    kv_block_size: int
    prefix_cache_hit_tokens: int
    kv_cache_bytes: int
    running: int
    waiting: int
    pending: int
    preemptions: int
    evictions: int
    steps: int
    tokens_processed: int
    handoffs_received: int
    handoffs_sent: int
    batch_size_histogram: dict[int, int]
    time_forward_s: float
    time_step_s: float
    attention_backend: str
    cuda_graph_batch_sizes: list[int]
    torch_threads: int | None
    steps_by_threads: dict[int, int]
    attention_fallback: str | None = None  # why attention_backend="auto" runs torch's (engine/worker/stats.py)
    cuda_graph_error: str | None = None  # why capturing CUDA graphs failed
    model_forward: str = ""  # "fused" (engine/model/fused_decoder.py) or "transformers: <why not fused>"
    proposed_tokens: int = 0  # tokens a verifier proposed itself (`Route.proposals`) and checked
    proposed_accepted: int = 0  # of those, the ones it accepted
