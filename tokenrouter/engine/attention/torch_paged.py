"""Paged attention in plain torch: runs on CPU and any device, the reference for faster backends.

Decode rows are batched into one SDPA call over their gathered (padded) contexts. Short extend
rows after a cached prefix (a verifier's catch-up over k drafts, a hand-off's few tokens) are
batched the same way, their queries padded to the longest: one call per layer instead of one
per row, which at 16 rows of 3 tokens made a 1.5B verify step cost 2.3 decode steps on CPU.
Every other prefill/extend row is one causal SDPA call over its cached prefix plus its new tokens.

With grouped-query attention, decode and short extend rows fold each KV head's query heads into
its query rows (`grouped_sdpa`) rather than asking SDPA for `enable_gqa`: on CPU in bf16 that
made a decode step's attention 7-13x cheaper (1.5B shapes: 20 against 151 us for one row of 160
tokens, 0.31 against 4.1 ms for 16 rows of 256; benchmarks/kernels/bench_gqa_attention.py), the
difference between a C = 16 step spending most of its time in attention and not. Prefill rows
fold them too, in chunks of PREFILL_QUERIES queries: SDPA's `enable_gqa` is as fast there, but it
gives some queries other bits than the folded call (a few of 600 in a check on random bf16 data).

Every row's keys are padded (masked) to a multiple of KEY_MULTIPLE. torch's CPU SDPA gives a
query the same result whatever else is in the call (its other queries, the rows beside it, masked
keys after its own) only while no 16-key chunk holding its keys is cut short: the demo 1.5B's
attention for one token over 43 keys differed between a width of 43 or 44-47 and one of 48 or
more, which made a prefill's tokens and the same tokens decoded one by one part. Padded so, and
every row folded, a query's result is mostly the same in a decode step, a verifier's check or a
prefill; not always: on real data it also moved with the call's width beyond the padding, and a
decode step's width is its batch's widest row. On CPU the C kernel (cpu_paged.py) therefore
serves by default: it computes each query alone, the same bits in any step. This backend is what
serves where that kernel does not build, and on devices flashinfer does not serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kv import KVCache
from .backend import AttentionBackend, AttentionMetadata

SHORT_EXTEND = 16  # extend rows of at most this many new tokens (after a cached prefix) are batched
KEY_MULTIPLE = 16  # keys per row, padded to a multiple of this (masked): see above
PREFILL_QUERIES = 256  # a prefill row's queries per call: bounds the folded mask (heads x queries x keys)


def padded(width: int) -> int:
    return -(-width // KEY_MULTIPLE) * KEY_MULTIPLE


@dataclass
class ShortExtends:
    """The batched extend rows of one step, gathered once for every layer."""

    rows: frozenset[int]  # their indices in meta.prefill_rows
    q_index: torch.Tensor  # [R, T] each query's token index in the step (padding repeats the row's last)
    valid: torch.Tensor  # [R, T] bool: a real query, not padding
    slots: torch.Tensor  # [R * C] cache slots of each row's context, padded with slot 0
    causal: torch.Tensor  # [R, 1, T, C] bool: the key is real and not after the query
    distance: torch.Tensor  # [R, 1, T, C] query position minus key position (sliding windows)

    @classmethod
    def of(cls, meta: AttentionMetadata) -> ShortExtends | None:
        picked = [
            i
            for i, ((_, q_len, _), slots) in enumerate(zip(meta.prefill_rows, meta.prefill_slots))
            if slots is not None and q_len <= SHORT_EXTEND
        ]
        if not picked:
            return None
        dev = meta.slot_mapping.device
        starts, q_lens, ctx_lens = (
            torch.tensor(col, device=dev) for col in zip(*(meta.prefill_rows[i] for i in picked))
        )
        t = torch.arange(int(q_lens.max()), device=dev)
        valid = t[None, :] < q_lens[:, None]
        offset = torch.minimum(t[None, :], q_lens[:, None] - 1)  # padding: a copy of the last query
        width = padded(int(ctx_lens.max()))
        slots = torch.zeros(len(picked), width, dtype=torch.long, device=dev)
        for r, i in enumerate(picked):
            slots[r, : int(ctx_lens[r])] = meta.prefill_slots[i]
        q_pos = ctx_lens[:, None] - q_lens[:, None] + offset  # [R, T]
        k_pos = torch.arange(width, device=dev)
        distance = q_pos[:, :, None] - k_pos[None, None, :]
        causal = (distance >= 0) & (k_pos[None, None, :] < ctx_lens[:, None, None])
        return cls(
            frozenset(picked), starts[:, None] + offset, valid, slots.reshape(-1), causal[:, None], distance[:, None]
        )


def grouped_sdpa(q, k, v, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA of q [B, H, T, D] over k, v [B, KV, C, D], H a multiple of KV, with a bool mask
    [B, 1, T, C]: query head h reads KV head h // (H / KV), as `enable_gqa` has it, computed as
    KV heads of (H / KV) * T query rows each, so that each K/V is read once, in one kernel call."""
    b, h, t, d = q.shape
    kv, c = k.shape[1], k.shape[2]
    if h == kv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    g = h // kv
    if t > 1:  # one query row broadcasts its mask over the group; more need it per row
        mask = mask[:, :, None].expand(b, 1, g, t, c).reshape(b, 1, g * t, c)
    out = F.scaled_dot_product_attention(q.reshape(b, kv, g * t, d), k, v, attn_mask=mask, scale=scale)
    return out.view(b, h, t, d)


class TorchPagedAttention(AttentionBackend):
    def __init__(self, cache: KVCache):
        self.cache = cache
        self._planned: tuple[AttentionMetadata, ShortExtends | None] | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self._planned = (meta, ShortExtends.of(meta))

    def _short_extends(self, meta: AttentionMetadata) -> ShortExtends | None:
        if self._planned is None or self._planned[0] is not meta:  # a caller that did not plan
            self.plan(meta)
        return self._planned[1]

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata, scaling, sliding_window):
        k_cache, v_cache = self.cache.write(layer_idx, meta.slot_mapping, k, v)
        out = torch.empty_like(q)
        nd = meta.num_decode
        if nd:
            # Gather whole blocks (one index per block, not per token), then mask the tail.
            bsz, max_ctx = meta.decode_mask.shape
            blocks = meta.decode_block_tables.reshape(-1)
            paged = (self.cache.num_blocks, self.cache.block_size, *k.shape[1:])
            kd = k_cache.view(paged).index_select(0, blocks).view(bsz, max_ctx, *k.shape[1:]).transpose(1, 2)
            vd = v_cache.view(paged).index_select(0, blocks).view(bsz, max_ctx, *v.shape[1:]).transpose(1, 2)
            kd, vd = kd.to(q.dtype), vd.to(q.dtype)  # a KV cache kept in another dtype than q's
            mask = meta.decode_mask
            if max_ctx != padded(max_ctx):  # a KV block size that is not a multiple of KEY_MULTIPLE
                pad = padded(max_ctx) - max_ctx
                kd, vd = F.pad(kd, (0, 0, 0, pad)), F.pad(vd, (0, 0, 0, pad))
                mask, max_ctx = F.pad(mask, (0, pad)), max_ctx + pad
            if sliding_window is not None:
                pos = torch.arange(max_ctx, device=q.device)
                mask = mask & (meta.decode_positions[:, None] - pos[None, :] < sliding_window)
            qd = q[:nd].unsqueeze(2)  # [bsz, H, 1, D]
            out[:nd] = grouped_sdpa(qd, kd, vd, mask[:, None, None, :], scaling).squeeze(2)
        short = self._short_extends(meta)
        if short is not None:
            rows, width = short.q_index.shape[0], short.slots.numel() // short.q_index.shape[0]
            qb = q[short.q_index].transpose(1, 2)  # [R, H, T, D]
            kb = k_cache.index_select(0, short.slots).view(rows, width, *k.shape[1:]).transpose(1, 2)
            vb = v_cache.index_select(0, short.slots).view(rows, width, *v.shape[1:]).transpose(1, 2)
            kb, vb = kb.to(q.dtype), vb.to(q.dtype)
            mask = short.causal if sliding_window is None else short.causal & (short.distance < sliding_window)
            ob = grouped_sdpa(qb, kb, vb, mask, scaling)
            out[short.q_index[short.valid]] = ob.transpose(1, 2)[short.valid]
        for i, ((start, q_len, ctx_len), slots) in enumerate(zip(meta.prefill_rows, meta.prefill_slots)):
            if short is not None and i in short.rows:
                continue
            qs = q[start : start + q_len].transpose(0, 1).unsqueeze(0)
            if slots is None:  # no cached prefix: the fresh K/V are the whole context, as the cache holds them
                ks = k[start : start + q_len].to(k_cache.dtype).to(q.dtype)
                vs = v[start : start + q_len].to(v_cache.dtype).to(q.dtype)
            else:
                ks = k_cache.index_select(0, slots).to(q.dtype)
                vs = v_cache.index_select(0, slots).to(q.dtype)
            pad = padded(ctx_len) - ctx_len
            ks = F.pad(ks, (0, 0, 0, 0, 0, pad)).transpose(0, 1).unsqueeze(0)
            vs = F.pad(vs, (0, 0, 0, 0, 0, pad)).transpose(0, 1).unsqueeze(0)
            for c0 in range(0, q_len, PREFILL_QUERIES):  # each chunk over the keys up to its last query
                c1 = min(q_len, c0 + PREFILL_QUERIES)
                width = padded(ctx_len - q_len + c1)
                q_pos = torch.arange(ctx_len - q_len + c0, ctx_len - q_len + c1, device=q.device)
                diff = q_pos[:, None] - torch.arange(width, device=q.device)[None, :]
                mask = diff >= 0  # the padding lies after every query
                if sliding_window is not None:
                    mask = mask & (diff < sliding_window)
                oc = grouped_sdpa(qs[:, :, c0:c1], ks[:, :, :width], vs[:, :, :width], mask[None, None], scaling)
                out[start + c0 : start + c1] = oc[0].transpose(0, 1)
        return out
