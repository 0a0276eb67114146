"""The fused decoder's layers in one C call a step (`tr_decoder_layers`).

FusedDecoder's layer is six calls through ctypes with torch ops between them: about 1 ms of Python
a decode step on the demo 1.5B (30 ms) and on the 0.5B (12 ms), which a speculative cycle pays
three times. This runs the same kernels in the same order from C, so a step's outputs are the
same bits (tests/engine/model/test_fused_decoder.py): every layer's weight groups and caches are
written once into a table of C structs, and a step passes the table, the step's tokens and
scratch rows. It serves with the C attention kernel (`CpuPagedAttention`), whose function it
calls; any other backend keeps the Python loop.
"""

from __future__ import annotations

import ctypes

import torch

from ..attention import KV_KINDS, AttentionBackend, AttentionMetadata, CpuPagedAttention
from ..quant import LayerArgs


class LayerStack:
    """`layers` (FusedLayers) over `backend`'s KV cache, one C call a step; build with `over`."""

    def __init__(self, lib, layers, backend: CpuPagedAttention, heads: int, kv_heads: int, head_dim: int, scale: float):
        cache = backend.cache
        self.lib, self.backend, self.count = lib, backend, len(layers)
        self.heads, self.kv_heads, self.head_dim, self.scale = heads, kv_heads, head_dim, scale
        self.kv_kind = KV_KINDS[cache.k[0].dtype]
        self.attention = backend.kernel.address
        self.table = (LayerArgs * len(layers))()
        for i, layer in enumerate(layers):
            t = self.table[i]
            t.qkv, t.o, t.gate_up, t.down = layer.qkv.args(), layer.o.args(), layer.gate_up.args(), layer.down.args()
            t.k_cache, t.v_cache, t.window = cache.k[i].data_ptr(), cache.v[i].data_ptr(), layer.sliding_window or 0
        self.widths = (layers[0].qkv.out_features, heads * head_dim, layers[0].gate_up.out_features)

    @classmethod
    def over(cls, lib, layers, backend: AttentionBackend, heads: int, kv_heads: int, head_dim: int, scale: float):
        """The stack over `backend`, or None where it cannot serve (another attention backend, a
        KV cache of a dtype the kernel does not read)."""
        if not isinstance(backend, CpuPagedAttention) or backend.cache.k[0].dtype not in KV_KINDS:
            return None
        return cls(lib, layers, backend, heads, kv_heads, head_dim, scale)

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> None:
        """h [tokens, hidden] float32 contiguous, in place, through every layer; cos and sin
        [tokens, head_dim] float32 contiguous."""
        t = h.shape[0]
        step = self.backend.queries(meta)
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        qkv, attn, act = (torch.empty(t, width, dtype=torch.float32) for width in self.widths)
        rc = self.lib.layers(
            ctypes.byref(self.table),
            self.count,
            h.data_ptr(),
            t,
            cos.data_ptr(),
            sin.data_ptr(),
            slots.data_ptr(),
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.scale,
            self.attention,
            self.kv_kind,
            self.backend.cache.num_blocks,
            *step.args(meta.block_size),
            qkv.data_ptr(),
            attn.data_ptr(),
            act.data_ptr(),
            torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"tr_decoder_layers failed with {rc} ({t} tokens)")
