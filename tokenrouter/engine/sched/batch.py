"""What the scheduler hands the runner for one step (vLLM keeps its `SchedulerOutput` beside
its scheduler the same way): the scheduler and the runner both depend on it, not on each other."""

from __future__ import annotations

from dataclasses import dataclass

from ..sequence import Sequence


@dataclass
class ScheduledBatch:
    """Sequences to run this step and how many new tokens each contributes; decode rows first."""

    seqs: list[Sequence]
    num_new: list[int]
    num_decode: int

    def __len__(self) -> int:
        return len(self.seqs)
