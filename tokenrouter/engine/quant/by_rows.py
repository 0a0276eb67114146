"""A linear layer with two kernels, picked by how many rows a call has: the GGUF's own quantized
weights for steps of up to some rows, a bf16 copy packed for oneDNN for more.

A decode step of a few requests reads every weight once and computes little, so fewer bytes per
weight win. With torch's int4 kernel, whose work grows with every row, bf16 wins from some 4-8
rows on. The GGUF block kernels (16 rows of W interleaved, native/gguf/) beat bf16 on this EPYC
at every size the probe measures, up to 128 rows (the 1.5B's 8960x1536 layer: 0.11 against 0.40
ms at one row, 3.3 against 3.8 at 128; benchmarks/results/gguf-blocks/layers.json), so there the
bf16 copy computes only prefill chunks of more. Holding both costs the bf16 copy's memory on top
(3.1 GB for the 1.5B): `ModelSpec(quantization="gguf+bf16")` pays it, `"gguf"` does not. Where
the two cross is measured per machine (`probe.quantized_rows`).
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
