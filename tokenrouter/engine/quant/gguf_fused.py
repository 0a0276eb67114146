"""Several GGUF block linears computed against one x in one C call, with the layer's glue fused in.

A decoder layer calls its q, k and v projections on the same normalised x, and its gate and up
projections on another; around them sit RMSNorm, SiLU times up and two residual adds, a dozen
small torch ops that cost a quarter of the demo 1.5B's decode step in dispatch alone.
`tr_gguf_linears` (`engine/native/gguf/linears.c`) takes a group of weights, normalises x once,
rounds it to int8 once per block format, computes every weight's rows in one parallel region,
and ends as the layer needs: the outputs side by side ("store"), added into the residual
("add"), or SiLU(gate) * up ("silu_mul"). Each output row is computed by the same group kernels
as `GGUFBlockLinear`, so a row's result does not depend on the other rows of the step.
"""

from __future__ import annotations

import ctypes

import torch

from .gguf_blocks import GGUFBlockLinear
from .gguf_native import TYPES, Library, LinearsArgs

EPILOGUES = {"store": 0, "add": 1, "silu_mul": 2}  # tr_gguf_linears' numbers
_ARITY = {"store": range(1, 5), "add": range(1, 2), "silu_mul": range(2, 3)}


class FusedLinears:
    """`layers` (GGUF block linears of one input width) against one x, with an
    optional RMSNorm of x first (`norm` weight, `eps`) and the `epilogue`."""

    def __init__(
        self, layers: list[GGUFBlockLinear], epilogue: str = "store", norm: torch.Tensor | None = None, eps: float = 0.0
    ):
        if epilogue not in _ARITY or len(layers) not in _ARITY[epilogue]:
            raise ValueError(f"epilogue {epilogue!r} takes {list(_ARITY.get(epilogue, []))} layers, got {len(layers)}")
        widths = {layer.in_features for layer in layers}
        if len(widths) != 1:
            raise ValueError(f"fused GGUF linears share one input width, got {sorted(widths)}")
        if epilogue == "silu_mul" and layers[0].out_features != layers[1].out_features:
            raise ValueError("SiLU(gate) * up needs gate and up of the same width")
        n = len(layers)
        self.layers = layers  # keeps the blocks and biases the pointers below point into
        self.lib = layers[0].lib
        self.epilogue = epilogue
        self.in_features = widths.pop()
        self.norm = None if norm is None else norm.detach().float().contiguous()
        if self.norm is not None and self.norm.numel() != self.in_features:
            raise ValueError(f"norm weight of {self.norm.numel()} for inputs of {self.in_features}")
        self.eps = float(eps)
        widths_out = [layer.out_features for layer in layers]
        self.out_features = sum(widths_out) if epilogue == "store" else widths_out[0]
        self._types = (ctypes.c_int * n)(*(TYPES[layer.kind] for layer in layers))
        self._blocks = (ctypes.c_void_p * n)(*(layer.blocks.data_ptr() for layer in layers))
        self._rows = (ctypes.c_int64 * n)(*widths_out)
        self._biases = (ctypes.c_void_p * n)(
            *(None if layer.bias is None else layer.bias.data_ptr() for layer in layers)
        )
        self._norm = None if self.norm is None else self.norm.data_ptr()

    def args(self) -> LinearsArgs:
        """This call's weights and epilogue as tr_decoder_layers takes them (valid while this
        object lives: it keeps the blocks, biases and norm they point into)."""
        a = LinearsArgs(count=len(self.layers), epilogue=EPILOGUES[self.epilogue], norm_w=self._norm, eps=self.eps)
        a.K, a.out_features = self.in_features, self.out_features
        for i in range(len(self.layers)):
            a.types[i], a.packed[i] = self._types[i], self._blocks[i]
            a.Ns[i], a.biases[i] = self._rows[i], self._biases[i]
        return a

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] float32 contiguous. "store" and "silu_mul" write a new [M, out] tensor (or
        `out`); "add" adds into `out` [M, out], which it needs, and returns it."""
        m = x.shape[0]
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features or not x.is_contiguous():
            raise ValueError(f"x must be float32 [rows, {self.in_features}] contiguous, got {x.dtype} {tuple(x.shape)}")
        if out is None:
            if self.epilogue == "add":
                raise ValueError("'add' adds into `out`: give it")
            out = torch.empty(m, self.out_features, dtype=torch.float32)
        if out.dtype != torch.float32 or tuple(out.shape) != (m, self.out_features) or not out.is_contiguous():
            raise ValueError(f"out must be float32 [{m}, {self.out_features}] contiguous")
        if m == 0:
            return out
        rc = self.lib.linears(
            len(self.layers),
            self._types,
            self._blocks,
            self._rows,
            self._biases,
            self.in_features,
            x.data_ptr(),
            m,
            self._norm,
            self.eps,
            out.data_ptr(),
            self.out_features,
            EPILOGUES[self.epilogue],
            torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"tr_gguf_linears failed with {rc} ({m} rows, epilogue {self.epilogue!r})")
        return out


def rope(lib: Library, x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In place: the rotary embedding (transformers' rotate-half form) of the first `heads` heads
    of each row of x ([M, >= heads * head_dim] float32, rows contiguous), cos and sin [M, head_dim]
    float32 contiguous."""
    m = x.shape[0]
    if x.dtype != torch.float32 or x.stride(1) != 1 or x.shape[1] < heads * head_dim:
        raise ValueError(f"rope takes float32 rows of at least {heads * head_dim}, got {x.dtype} {tuple(x.shape)}")
    if tuple(cos.shape) != (m, head_dim) or tuple(sin.shape) != (m, head_dim):
        raise ValueError(f"cos and sin must be [{m}, {head_dim}]")
    lib.rope(x.data_ptr(), m, x.stride(0), heads, head_dim, cos.data_ptr(), sin.data_ptr())
