"""Linear layers with int8 weights and per-step int8 activations (CPU, `ModelSpec(quantization="int8")`).

A decode step on CPU reads every weight once, so it costs what the memory bus takes to move
them: a float32 draft model is a third of the 1.5B target's time per step however few rows it
computes, and speculative decoding gains only what the draft saves. Int8 weights (one scale per
output channel) move a quarter of the bytes; the activations are quantized at each call (one
scale per call, what the kernels take). torch's fbgemm kernels compute it (`linear_dynamic`,
AVX2; 7-bit activations, as fbgemm wants on CPUs without VNNI).

The MLP output projections (`down_proj` and its kin, KEEP_FLOAT) stay float32: their inputs,
the gated MLP's products, hold outliers that one int8 scale per call cannot carry. On the demo's
0.5B coder, quantizing them too drops the greedy agreement with the 1.5B model from 0.81 to 0.73
(float32: 0.83). Meant for a draft model: a verifying policy's output stays the target's.
"""

from __future__ import annotations

import warnings

import torch

from .replace import replace_linears

# leaf names of MLP output projections: Llama, Qwen, Mistral, Gemma, Phi-3 (down_proj); OPT, Phi
# (fc2); Mixtral's experts (w2); GPT-NeoX (dense_4h_to_h)
KEEP_FLOAT = frozenset({"down_proj", "fc2", "w2", "dense_4h_to_h"})


def available() -> bool:
    """Whether this torch build has fbgemm's dynamic int8 linear (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and available()


class Int8Linear(torch.nn.Module):
    """`nn.Linear` with its weight stored as int8 per output channel, computed by fbgemm.

    The dense weight is dropped unless another module shares it (a tied output head keeps the
    embedding's); `weight` stays readable for its shape (the engine reads the vocabulary size
    from the output head)."""

    def __init__(self, linear: torch.nn.Linear, tied: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad(), warnings.catch_warnings():
            # torch marks its quantized tensor types deprecated; the pinned torch has them, and
            # `available()` says whether a build still does
            warnings.simplefilter("ignore")
            w = linear.weight.detach().float()
            scale = (w.abs().amax(dim=1) / 127).clamp_(min=1e-12).double()
            qweight = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
            bias = None if linear.bias is None else linear.bias.detach().float()
            self.packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.weight = tied if tied is not None else torch.empty(self.out_features, self.in_features, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(model: torch.nn.Module) -> int:
    """Replace every float32 `nn.Linear` of `model` (on CPU) but the KEEP_FLOAT ones with an
    `Int8Linear`; returns how many."""
    return replace_linears(model, Int8Linear, skip=KEEP_FLOAT)
