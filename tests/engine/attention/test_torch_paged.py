"""The torch backend's grouped-query attention: each KV head's query heads folded into its rows
computes what SDPA's own `enable_gqa` does, for one query row and for several, with masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenrouter.engine.attention.torch_paged import grouped_sdpa


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads, queries", [(12, 2, 1), (12, 2, 5), (4, 4, 3), (8, 1, 1)])
def test_grouped_sdpa_is_sdpas_grouped_query_attention(dtype, heads, kv_heads, queries):
    g = torch.Generator().manual_seed(heads * 10 + queries)
    b, c, d = 3, 37, 16
    q = torch.randn(b, heads, queries, d, generator=g).to(dtype)
    k, v = (torch.randn(b, kv_heads, c, d, generator=g).to(dtype) for _ in range(2))
    lengths = torch.tensor([37, 20, 9])
    q_pos = lengths[:, None] - queries + torch.arange(queries)[None, :]  # each row's queries end its context
    mask = (torch.arange(c)[None, None, :] <= q_pos[:, :, None])[:, None]  # [B, 1, T, C]: causal, padded
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=heads != kv_heads)
    got = grouped_sdpa(q, k, v, mask, 0.25)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
