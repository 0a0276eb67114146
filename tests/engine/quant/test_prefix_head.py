"""ModelSpec(draft_vocab=N): the output head scores its first N rows, the same bits as the full
head's, and -inf elsewhere (engine/quant/prefix_head.py)."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch

from tokenrouter.engine.quant import GGUFBlockLinear, PrefixHead, gguf_native
from tokenrouter.testing import quantize_q4k

pytestmark = pytest.mark.cpu_levels  # at this CPU's level and each lower one (tests/conftest.py)


def test_the_first_rows_of_a_block_head_are_the_full_heads_bits():
    lib = gguf_native.load()[0]
    if lib is None:
        pytest.skip(f"no GGUF block kernels here: {gguf_native.load()[1]}")
    w = np.random.default_rng(0).standard_normal((200, 256)).astype(np.float32)
    head = GGUFBlockLinear(lib, "Q4_K", quantize_q4k(w), (200, 256))
    x = torch.randn(3, 256)
    for rows in (1, 16, 37):  # whole groups of 16 interleaved rows and a part of one
        got = PrefixHead(head, rows)(x)
        assert got.shape == (3, 200)
        assert torch.equal(got[:, :rows], head(x)[:, :rows])
        assert torch.isneginf(got[:, rows:]).all()


def test_a_dense_head_narrows_and_others_are_refused():
    head = torch.nn.Linear(64, 100, bias=True)
    x = torch.randn(2, 5, 64)
    got = PrefixHead(head, 30)(x)
    assert got.shape == (2, 5, 100)
    assert torch.equal(got[..., :30], torch.nn.functional.linear(x, head.weight[:30], head.bias[:30]))
    assert torch.isneginf(got[..., 30:]).all()
    with pytest.raises(ValueError, match=r"draft_vocab must be in \[1, 99\]"):
        PrefixHead(head, 100)
    with pytest.raises(TypeError, match="cannot be narrowed"):
        PrefixHead(torch.nn.Sequential(head), 10)


def test_a_draft_vocab_past_the_vocabulary_fails_the_load_by_name(tiny_models):
    from tokenrouter import Engine, ModelSpec
    from tokenrouter.errors import ModelLoadError

    spec = ModelSpec(path=tiny_models["qwen2"], dtype="float64", draft_vocab=10**7, kv_cache_tokens=64)
    with pytest.raises(ModelLoadError, match=r"draft_vocab=10000000 must be below .* vocabulary of \d+"):
        anyio.run(_start, Engine(models={"m": spec}))


async def _start(engine) -> None:
    async with engine:
        pass
