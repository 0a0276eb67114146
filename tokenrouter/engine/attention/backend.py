"""The attention backend interface and how it plugs into transformers' model definitions.

The engine runs transformers' own model classes with `attn_implementation="tokenrouter_paged"`.
Each attention layer then calls `paged_attention_forward`, which finds the step's metadata and
KV cache in a thread-local context (each worker steps in its own thread) and hands off to the
worker's backend. The model sees one packed row of all the step's tokens, no padding.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

ATTN_IMPLEMENTATION = "tokenrouter_paged"


@dataclass
class AttentionMetadata:
    """Where the step's packed tokens go and what they attend to.

    Rows are sequences in batch order; decode rows (one new token) come first, then
    prefill/extend rows (several new tokens, possibly after a cached prefix).
    """

    slot_mapping: torch.Tensor  # [num_tokens] cache slot of each new token
    num_decode: int  # the first num_decode rows have exactly one new token
    decode_block_tables: torch.Tensor | None  # [num_decode, max_blocks] block ids, padded with block 0
    decode_mask: torch.Tensor | None  # [num_decode, max_blocks * block_size] True where a position is real
    decode_positions: torch.Tensor | None  # [num_decode] position of the new token
    # prefill/extend rows: (token start, query length, context length) and context slots
    prefill_rows: list[tuple[int, int, int]]
    prefill_slots: list[torch.Tensor | None]  # None: no cached prefix, attend to fresh K/V only
    # the same rows as pages, for backends that plan over the block tables (engine/attention/paged_layout.py)
    query_lens: list[int]  # new tokens of each row
    context_lens: list[int]  # tokens each row attends to once its new ones are written
    block_tables: list[list[int]]  # each row's block ids (at least ceil(context_len / block_size))
    block_size: int


class AttentionBackend(ABC):
    """Writes a layer's new K/V into the paged cache and computes attention for a packed batch."""

    def plan(self, meta: AttentionMetadata) -> None:
        """Called once per step before the forward: a backend whose kernels need per-step
        scheduling data (flashinfer's wrappers) prepares it here, not once per layer."""

    @abstractmethod
    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, heads, head_dim]
        k: torch.Tensor,  # [num_tokens, kv_heads, head_dim]
        v: torch.Tensor,
        meta: AttentionMetadata,
        scaling: float,
        sliding_window: int | None,
    ) -> torch.Tensor:  # [num_tokens, heads, head_dim]
        ...


@dataclass
class _StepContext:
    backend: AttentionBackend
    meta: AttentionMetadata


_local = threading.local()


@contextmanager
def step_context(backend: AttentionBackend, meta: AttentionMetadata) -> Iterator[None]:
    _local.ctx = _StepContext(backend, meta)
    try:
        yield
    finally:
        _local.ctx = None


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-function signature: query [1, H, T, D], key/value [1, Hkv, T, D]."""
    ctx: _StepContext | None = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention called outside an engine step")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("attention logit soft-capping is not supported by the paged backends")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = ctx.backend.forward(
        module.layer_idx,
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        ctx.meta,
        scaling,
        kwargs.get("sliding_window"),
    )
    return out.unsqueeze(0), None


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
