"""Linear layers with 4-bit weights in groups of 32, each group with a scale and an offset (CPU,
bfloat16 activations): how `ModelSpec(quantization="gguf")` computes a checkpoint's Q4_K tensors.

A Q4_K sub-block is 32 weights w = scale * q - minus, q in 0..15; torch's int4 kernel computes
w = (q - 8) * scale + zero per group, so zero = 8 * scale - minus maps one onto the other with
nothing lost but the rounding of scale and zero to bfloat16 (the kernel takes them in the
activations' dtype). A decode step then reads a quarter of the bytes bf16 weights take.

`_weight_int4pack_mm_for_cpu` wants bfloat16 activations (with float32 ones the int kernels were
10-30x slower), so inputs are cast to bf16 and the output back to the input's dtype.
"""

from __future__ import annotations

import torch

GROUP = 32
PACK_ROWS = 16


def available() -> bool:
    aten = torch.ops.aten
    return hasattr(aten, "_weight_int4pack_mm_for_cpu") and hasattr(aten, "_convert_weight_to_int4pack_for_cpu")


class Int4Linear(torch.nn.Module):
    """`nn.Linear` whose weight is kept as 4-bit codes with a bf16 scale and zero per group of 32
    along the input. `weight` stays readable for its shape (on the meta device)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minus: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        if self.in_features % GROUP:
            raise ValueError(f"in_features={self.in_features} is not a multiple of {GROUP}")
        pad = -self.out_features % PACK_ROWS  # the kernel packs rows 16 at a time: zero rows fill the last
        with torch.no_grad():
            codes = codes.to(torch.int32)
            scale, minus = scale.float(), minus.float()
            if pad:  # a copy of the whole matrix: only where the rows need it
                codes = torch.nn.functional.pad(codes, (0, 0, 0, pad), value=8)
                scale, minus = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (scale, minus))
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
            zero = 8 * scale - minus
            self.scales_and_zeros = torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.weight = torch.empty(self.out_features, self.in_features, device="meta")

    @classmethod
    def from_packed(
        cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None
    ) -> Int4Linear:
        """A layer from what an earlier one built (`packed`, `scales_and_zeros`: kernel_cache.py)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.out_features, self.in_features = shape
        self.packed, self.scales_and_zeros = packed, scales_and_zeros
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.weight = torch.empty(*shape, device="meta")
        return self

    @classmethod
    def from_dense(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Linear:
        """Groups of 32 quantized asymmetrically, each from its own minimum to its maximum (for
        weights that come without a GGUF's codes, and for tests)."""
        n, k = weight.shape
        w = weight.detach().float().reshape(n, k // GROUP, GROUP)
        lo, hi = w.amin(-1), w.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        codes = ((w - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
        return cls(codes, scale, -lo, bias)

    def effective_weight(self) -> torch.Tensor:
        """The float32 weight the kernel computes with (its bf16 scales and zeros included)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros)
        return out.float().t()[: self.out_features].contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)
        y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 (groups of {GROUP})"
