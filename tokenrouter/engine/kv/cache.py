"""The KV pool: one key and one value tensor per layer, addressed by slot = block * block_size + offset."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return (
            2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()
        )

    @classmethod
    def from_config(cls, config, dtype: torch.dtype) -> KVLayout:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return cls(text.num_hidden_layers, kv_heads, head_dim, dtype)


class KVCache:
    """Pre-allocated per-layer K and V tensors of shape [num_blocks * block_size, kv_heads, head_dim]."""

    def __init__(self, layout: KVLayout, num_blocks: int, block_size: int, device: torch.device):
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks * block_size, layout.num_kv_heads, layout.head_dim)
        self.k = [torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)]
        self.v = [torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)]

    def write(self, layer_idx: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """A step's new K/V of one layer into their slots; returns that layer's K and V tensors."""
        k_cache, v_cache = self.k[layer_idx], self.v[layer_idx]
        k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, slots, v.to(v_cache.dtype))
        return k_cache, v_cache

    @staticmethod
    def num_blocks_for(layout: KVLayout, block_size: int, tokens: int | None, nbytes: int | None) -> int:
        if nbytes is not None:
            tokens = nbytes // layout.bytes_per_token
        assert tokens is not None
        return max(tokens // block_size, 0)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks (source, destination) in every layer: copy-on-write after a rollback."""
        if not pairs:
            return
        bs = self.block_size
        src = torch.cat([torch.arange(s * bs, (s + 1) * bs) for s, _ in pairs]).to(self.k[0].device)
        dst = torch.cat([torch.arange(d * bs, (d + 1) * bs) for _, d in pairs]).to(self.k[0].device)
        for cache in (*self.k, *self.v):
            cache[dst] = cache[src]

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_size * self.layout.bytes_per_token
