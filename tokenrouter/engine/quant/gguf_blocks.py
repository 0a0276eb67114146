"""A linear layer computed straight from its GGUF tensor's blocks (`gguf_native.py`): Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, as llama.cpp computes them.

The weight keeps the file's bits (4.5 a Q4_K weight, 6.6 a Q6_K one, where torch's int8 kernel
holds a Q6_K tensor in 8), repacked at load, 16 rows interleaved, for the group kernels of this
CPU's level (AVX512 VNNI, AVX2 or plain C: `engine/native/cpu.py`). Each call quantizes its rows
of x to int8 per block (a scale per 256 values for the K-quants, per 32 for the others) and runs
integer dot products: llama.cpp's arithmetic, so its results differ from a float32 matmul of the
dequantized weights by that rounding of x (about 0.7% of the output's norm on the demo models'
layers).
"""

from __future__ import annotations

import numpy as np
import torch

from . import gguf_native

KINDS = frozenset(gguf_native.TYPES)


def fits(kind: str, cols: int) -> bool:
    """Whether the kernels take a tensor of this type with rows of `cols` weights."""
    return kind in KINDS and cols % gguf_native.BLOCKS[kind][0] == 0


class GGUFBlockLinear(torch.nn.Module):
    """`nn.Linear` whose weight is `blocks`, the GGUF tensor's bytes [out, bytes per row].
    `weight` stays readable for its shape (on the meta device)."""

    def __init__(
        self,
        lib: gguf_native.Library,
        kind: str,
        blocks: np.ndarray | torch.Tensor,
        shape: tuple[int, int],
        bias: torch.Tensor | None = None,
    ):
        super().__init__()
        if not fits(kind, shape[1]):
            kinds = "/".join(gguf_native.TYPES)
            raise ValueError(f"GGUF kernels take {kinds} rows of whole blocks, not {kind} x {shape[1]}")
        values, size = gguf_native.BLOCKS[kind]
        blocks = torch.as_tensor(np.ascontiguousarray(blocks)) if isinstance(blocks, np.ndarray) else blocks
        if tuple(blocks.shape) != (shape[0], shape[1] // values * size) or blocks.dtype != torch.uint8:
            got = f"{tuple(blocks.shape)} {blocks.dtype}"
            raise ValueError(f"{kind} blocks of a {shape[0]}x{shape[1]} weight: got {got}")
        self.lib, self.kind = lib, kind
        self.out_features, self.in_features = shape
        self.blocks = gguf_native.repack(lib, kind, blocks, shape)  # the group kernels' layout, 16 rows interleaved
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.weight = torch.empty(*shape, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.dtype not in (torch.float32, torch.bfloat16):
            flat = flat.float()
        y = gguf_native.matmul(
            self.lib,
            self.kind,
            self.blocks,
            (self.out_features, self.in_features),
            flat.contiguous(),
            self.bias,
            packed=True,
        )
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, GGUF {self.kind} blocks ({self.lib.level})"
