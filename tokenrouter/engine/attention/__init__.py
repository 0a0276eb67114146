"""Attention over the paged KV cache: the backend interface (registered with transformers), the
backends (the C kernel on CPU, torch's anywhere, flashinfer's on CUDA) and the choice between them."""

from .backend import ATTN_IMPLEMENTATION, AttentionBackend, AttentionMetadata, register, step_context
from .choice import AttentionChoice, attention_choice, make_attention_backend
from .cpu_paged import KV_KINDS, CpuPagedAttention
from .device_copy import to_device
from .flashinfer_paged import FlashInferPagedAttention

__all__ = ["ATTN_IMPLEMENTATION", "AttentionBackend", "AttentionMetadata", "register", "step_context"]
__all__ += ["KV_KINDS", "CpuPagedAttention"]
__all__ += ["AttentionChoice", "FlashInferPagedAttention", "attention_choice", "make_attention_backend", "to_device"]
