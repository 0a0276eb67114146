"""Which attention backend serves a model: flashinfer's kernels on CUDA when they can, our C kernel
on CPU when it builds (cpu_paged.py: a query's result the same bits in any step), torch's otherwise.

With `attention_backend="auto"` flashinfer must earn its place at load: it must import (any
error counts, not only a missing package), support the device, dtype and head size, and pass
its self-test (`FlashInferPagedAttention.self_test`: its kernels built, run and checked on the
scratch block). Where any of that fails on a CUDA device, the model runs torch's backend, the
log says why, and so does `stats().attention_fallback`; on CPU the same holds for the C kernel
(no compiler, a failed build, a dtype it does not compute). Asked for by name, either one's
failure fails the load, naming the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ...config import ModelSpec
from ...errors import ModelLoadError
from ..kv import KVCache
from . import cpu_paged
from .backend import AttentionBackend
from .cpu_paged import CpuPagedAttention
from .flashinfer_paged import unsupported_reason
from .torch_paged import TorchPagedAttention

log = logging.getLogger(__name__)


@dataclass
class AttentionChoice:
    name: str  # "torch", "cpu" or "flashinfer"
    # why attention_backend="auto" runs torch's backend (None where flashinfer or the C kernel
    # serves, or with "torch" asked for): on CUDA flashinfer's import, support or self-test
    # failed; on CPU the C kernel did not build or does not compute the dtype
    fallback: str | None = None


def choose_attention_backend(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype, head_dim: int, kv_dtype: torch.dtype | None = None
) -> str:
    """ "flashinfer", "cpu" or "torch". With attention_backend="auto" flashinfer wherever it runs
    (CUDA, float16/bfloat16, the `gpu` extra installed and importable) and the C kernel wherever
    it runs (CPU, float32/bfloat16, a C compiler; at any CPU level, its plain-C loops included, as
    only it computes a query alike in every step); asked for by name, it must run or loading fails."""
    return attention_choice(spec, device, dtype, head_dim, kv_dtype).name


def attention_choice(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype, head_dim: int, kv_dtype: torch.dtype | None = None
) -> AttentionChoice:
    """The backend before its self-test, and why "auto" runs torch's where it does. `kv_dtype`:
    what the KV cache holds where it is not `dtype` (a CPU model of float32 activations keeps it in
    float16, as llama.cpp does)."""
    if spec.attention_backend == "torch":
        return AttentionChoice("torch")
    if spec.attention_backend == "cpu" or spec.deterministic:  # only it computes a query alike in any step
        reason = cpu_paged.unsupported_reason(device, dtype, kv_dtype=kv_dtype)
        if reason is not None:
            asked = "attention_backend='cpu'" if spec.attention_backend == "cpu" else "deterministic=True"
            raise ModelLoadError(f"{asked} for {spec.path}: tokenrouter's C attention kernel: {reason}")
        return AttentionChoice("cpu")
    reason = unsupported_reason(device, dtype, head_dim)
    if reason is None:
        return AttentionChoice("flashinfer")
    if spec.attention_backend == "flashinfer":
        raise ModelLoadError(f"attention_backend='flashinfer' for {spec.path}: {reason}")
    if device.type == "cpu":
        reason = cpu_paged.unsupported_reason(device, dtype, kv_dtype=kv_dtype)
        if reason is None:
            return AttentionChoice("cpu")
    elif device.type != "cuda":
        return AttentionChoice("torch")
    log.warning("%s: attention_backend='auto' runs torch's attention on %s: %s", spec.path, device, reason)
    return AttentionChoice("torch", fallback=reason)


def make_attention_backend(
    spec: ModelSpec,
    choice: AttentionChoice,
    cache: KVCache,
    num_qo_heads: int,
    device: torch.device,
    scratch_block: int,
) -> tuple[AttentionBackend, AttentionChoice]:
    """The chosen backend, ready: flashinfer only once its self-test on `scratch_block` passed
    (else, with "auto", torch's backend and the reason)."""
    if choice.name == "cpu":
        kernel, _ = cpu_paged.load()
        assert kernel is not None  # attention_choice took "cpu" only where it loaded
        return CpuPagedAttention(cache, kernel), choice
    if choice.name != "flashinfer":
        return TorchPagedAttention(cache), choice
    from .flashinfer_paged import FlashInferPagedAttention

    try:
        backend = FlashInferPagedAttention(cache, num_qo_heads, device, spec.prefill_backend)
        backend.self_test(scratch_block)
    except Exception as e:
        reason = f"flashinfer's load-time self-test failed: {type(e).__name__}: {e}"
        if spec.attention_backend == "flashinfer":
            raise ModelLoadError(f"attention_backend='flashinfer' for {spec.path}: {reason}") from e
        log.warning(
            "%s: attention_backend='auto' falls back to torch's attention on %s: %s",
            spec.path,
            device,
            reason,
            exc_info=True,
        )
        return TorchPagedAttention(cache), AttentionChoice("torch", fallback=reason)
    return backend, choice
