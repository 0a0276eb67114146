"""Linear layers with int8 weights (one scale per output channel) and bfloat16 activations, by
torch's weight-only kernel (`_weight_int8pack_mm`, CPU).

Where a GGUF checkpoint's tensor is not Q4_K (Q6_K, Q5_0, Q8_0: llama.cpp's choice for the
tensors it finds sensitive, and for shapes Q4_K's 256-weight blocks do not fit), its dequantized
weight is requantized to int8 per channel: half of bf16's bytes. The kernel wants bf16
activations, as the int4 one does.
"""

from __future__ import annotations

import torch

ROWS = 1024  # output channels quantized at a time


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


class Int8WeightLinear(torch.nn.Module):
    """`nn.Linear` whose weight is int8 per output channel. `weight` stays readable for its shape."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.__class__.from_rows(weight.shape[0], weight.shape[1], lambda a, b: weight[a:b], bias, into=self)

    @classmethod
    def from_rows(cls, out_features: int, in_features: int, rows, bias=None, into=None) -> Int8WeightLinear:
        """Quantized `ROWS` output channels at a time from `rows(start, stop)` (a float tensor of
        those rows): a vocabulary-sized head never exists in float32 all at once."""
        self = into if into is not None else cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.out_features, self.in_features = out_features, in_features
        self.qweight = torch.empty(out_features, in_features, dtype=torch.int8)
        scales = torch.empty(out_features)
        with torch.no_grad():
            for start in range(0, out_features, ROWS):
                stop = min(start + ROWS, out_features)
                w = rows(start, stop).detach().float()
                scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
                self.qweight[start:stop] = (w / scale[:, None]).round().clamp(-127, 127)
                scales[start:stop] = scale
        self.scales = scales.to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.weight = torch.empty(out_features, in_features, device="meta")
        return self

    @classmethod
    def from_quantized(cls, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> Int8WeightLinear:
        """A layer from what an earlier one built (`qweight`, `scales`: kernel_cache.py)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.out_features, self.in_features = qweight.shape
        self.qweight, self.scales = qweight, scales
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.weight = torch.empty(*qweight.shape, device="meta")
        return self

    def effective_weight(self) -> torch.Tensor:
        """The float32 weight the kernel computes with."""
        return self.qweight.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"
