"""Linear layers whose weights are reordered once into oneDNN's blocked layout (float32 or
bfloat16, CPU).

torch's default CPU linear hands every call to a BLAS GEMM that repacks the whole weight matrix
for each call once a batch has more than one row: a decode step of 2 to 16 rows then costs two to
three times the one-row step, and a second thread barely helps. Reordering each weight once at
load and calling oneDNN's linear with it (what torch's own compiler does for frozen CPU graphs)
makes the step cost nearly flat in the batch size and lets threads scale; the measured step
latencies are in benchmarks/results/linear-kernels/README.md. Results equal `F.linear` to the dtype's rounding, not bit
for bit. bfloat16 goes the same way, where the precision probe found it the faster
(`probe.py`): oneDNN computes it natively on CPUs with avx512_bf16 or AMX.
"""

from __future__ import annotations

import torch

from .. import native
from .replace import replace_linears

# oneDNN's kernels for one or two rows are slower here than for four (AVX2, measured per layer and
# per step), so smaller inputs are padded with zero rows up to this many.
MIN_ROWS = 4


def available() -> bool:
    """Whether this torch build has oneDNN and the two ops used here."""
    mkldnn = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing is for float32 and bfloat16 on CPU (float64 keeps torch's path); bfloat16
    only where torch's oneDNN bf16 ops run at this CPU level (elsewhere they raise)."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and available() and not_refused(dtype)


def not_refused(dtype: torch.dtype) -> bool:
    """Whether torch runs oneDNN's linear in `dtype` on this CPU (bf16 needs avx512bw/vl/dq or avx_ne_convert)."""
    return dtype != torch.bfloat16 or native.cpu.current().torch_bf16 is None


class PackedLinear(torch.nn.Module):
    """`nn.Linear` computed by oneDNN from a weight reordered at construction.

    The dense weight is dropped unless another module shares it (a tied output head keeps the
    embedding's), so packing costs no memory except for tied heads. `weight` stays readable for
    its shape (the engine reads the vocabulary size from the output head)."""

    def __init__(self, linear: torch.nn.Linear, tied: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous())
        self.bias = linear.bias
        self.weight = tied if tied is not None else self.packed  # a shared Parameter, or a plain attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows >= MIN_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        flat = x.reshape(rows, self.in_features)
        padded = torch.cat([flat, flat.new_zeros(MIN_ROWS - rows, self.in_features)])
        y = torch.ops.mkldnn._linear_pointwise(padded, self.packed, self.bias, "none", [], "")
        return y[:rows].reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, onednn"


def pack_linears(model: torch.nn.Module, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> int:
    """Replace every `nn.Linear` of `model` on CPU with its weight in `dtypes` by a
    `PackedLinear`; returns how many."""
    return replace_linears(model, PackedLinear, dtypes=dtypes)
