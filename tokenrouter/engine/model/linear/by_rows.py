"""A linear layer with two kernels, picked by how many rows a call has: the GGUF's own quantized
weights for steps of few rows, a bf16 copy packed for oneDNN for steps of many.

A decode step of a few requests reads every weight once and computes little, so fewer bytes per
weight win: the quantized kernels beat bf16 at 1-2 rows (0.16-0.21 against 0.42 ms for the demo
1.5B's 8960x1536 MLP layer at one row, benchmarks/bench_gguf_blocks.py). Their work grows with
every row, so from some 4-8 rows on bf16 wins (0.73 against 1.3-1.4 ms at 16 rows), and a prefill
of hundreds of rows is several times faster in bf16. Holding both costs the bf16 copy's memory
on top (3.1 GB for the 1.5B): `ModelSpec(quantization="gguf+bf16")` pays it, `"gguf"` does not.
Where the two cross is measured per machine (`probe.quantized_rows`).
"""

from __future__ import annotations

import torch


class ByRowsLinear(torch.nn.Module):
    """`few` computes calls of at most `max_few_rows` rows, `many` the others; both compute the
    same weight. `weight` stays readable for its shape (the engine reads the head's)."""

    def __init__(self, few: torch.nn.Module, many: torch.nn.Module, max_few_rows: int):
        super().__init__()
        self.few, self.many, self.max_few_rows = few, many, max_few_rows
        self.in_features, self.out_features = few.in_features, few.out_features
        self.weight = many.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        few = x.numel() // self.in_features <= self.max_few_rows
        return self.few(x) if few else self.many(x)

    def extra_repr(self) -> str:
        return f"up to {self.max_few_rows} rows: {type(self.few).__name__}, more: {type(self.many).__name__}"
