"""Paged attention in plain torch: runs on CPU and any device, the reference for faster backends.

Decode rows are batched into one SDPA call over their gathered (padded) contexts; each
prefill/extend row is one causal SDPA call over its cached prefix plus its new tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import AttentionBackend, AttentionMetadata
from .kv_cache import KVCache


class TorchPagedAttention(AttentionBackend):
    def __init__(self, cache: KVCache):
        self.cache = cache

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata, scaling, sliding_window):
        k_cache, v_cache = self.cache.k[layer_idx], self.cache.v[layer_idx]
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        gqa = q.shape[1] != k.shape[1]
        nd = meta.num_decode
        if nd:
            # Gather whole blocks (one index per block, not per token), then mask the tail.
            bsz, max_ctx = meta.decode_mask.shape
            blocks = meta.decode_block_tables.reshape(-1)
            paged = (self.cache.num_blocks, self.cache.block_size, *k.shape[1:])
            kd = k_cache.view(paged).index_select(0, blocks).view(bsz, max_ctx, *k.shape[1:]).transpose(1, 2)
            vd = v_cache.view(paged).index_select(0, blocks).view(bsz, max_ctx, *v.shape[1:]).transpose(1, 2)
            mask = meta.decode_mask
            if sliding_window is not None:
                pos = torch.arange(max_ctx, device=q.device)
                mask = mask & (meta.decode_positions[:, None] - pos[None, :] < sliding_window)
            qd = q[:nd].unsqueeze(2)  # [bsz, H, 1, D]
            od = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=mask[:, None, None, :], scale=scaling, enable_gqa=gqa
            )
            out[:nd] = od.squeeze(2)
        for (start, q_len, ctx_len), slots in zip(meta.prefill_rows, meta.prefill_slots):
            qs = q[start : start + q_len].transpose(0, 1).unsqueeze(0)
            if slots is None:  # no cached prefix: the fresh K/V are the whole context
                ks = k[start : start + q_len]
                vs = v[start : start + q_len]
            else:
                ks = k_cache.index_select(0, slots)
                vs = v_cache.index_select(0, slots)
            ks = ks.transpose(0, 1).unsqueeze(0)
            vs = vs.transpose(0, 1).unsqueeze(0)
            q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
            k_pos = torch.arange(ctx_len, device=q.device)
            diff = q_pos[:, None] - k_pos[None, :]
            mask = diff >= 0
            if sliding_window is not None:
                mask = mask & (diff < sliding_window)
            os_ = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scaling, enable_gqa=gqa)
            out[start : start + q_len] = os_[0].transpose(0, 1)
        return out
