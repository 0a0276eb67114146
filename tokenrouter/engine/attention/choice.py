"""Which attention backend serves a model: flashinfer's kernels on CUDA when they can, torch's otherwise."""

from __future__ import annotations

import torch

from ...config import ModelSpec
from ...errors import ModelLoadError
from .flashinfer_paged import unsupported_reason


def choose_attention_backend(spec: ModelSpec, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """ "flashinfer" or "torch". With attention_backend="auto" flashinfer wherever it runs (CUDA,
    float16/bfloat16, the `gpu` extra installed); asked for by name, it must run or loading fails."""
    if spec.attention_backend == "torch":
        return "torch"
    reason = unsupported_reason(device, dtype, head_dim)
    if spec.attention_backend == "flashinfer" and reason is not None:
        raise ModelLoadError(f"attention_backend='flashinfer' for {spec.path}: {reason}")
    return "torch" if reason is not None else "flashinfer"
