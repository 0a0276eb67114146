"""oneDNN-packed linear layers (engine/quant/onednn.py): same results as torch's linear to float32
rounding, tied heads keep their embedding, and the loader packs exactly where it applies."""

import anyio
import pytest
import torch
import torch.nn.functional as F

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine.quant import onednn as onednn_linear
from tokenrouter.engine.quant.onednn import MIN_ROWS, PackedLinear, pack_linears
from tokenrouter.errors import ModelLoadError
from tokenrouter.testing import build_tiny_model

needs_onednn = pytest.mark.skipif(not onednn_linear.available(), reason="this torch build has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "shape", [(1, 48), (2, 48), (MIN_ROWS - 1, 48), (MIN_ROWS, 48), (9, 48), (1, 5, 48), (2, 3, 48)]
)
def test_packed_linear_matches_torch(bias, shape):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(*shape)
    want = F.linear(x, lin.weight, lin.bias)
    got = PackedLinear(lin)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("tie", [False, True])
def test_pack_linears_on_a_model(tmp_path, tokenizer, tie):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer, tie_word_embeddings=tie)
    dense = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    packed = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    linears = sum(type(m) is torch.nn.Linear for m in dense.modules())
    assert pack_linears(packed) == linears
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    head = packed.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight.shape == dense.get_output_embeddings().weight.shape
    # a tied head still shares the embedding's dense weight; untied weights are only kept packed
    assert (head.weight is packed.get_input_embeddings().weight) == tie
    assert not any(p.dim() == 2 and p.shape == (128, 64) for p in packed.parameters())  # MLP weights dropped
    ids = torch.tensor([[5, 17, 3, 99, 42, 7, 8]])
    with torch.inference_mode():
        for rows in (ids[:, :1], ids[:, :2], ids):
            torch.testing.assert_close(packed(rows).logits, dense(rows).logits, rtol=1e-4, atol=1e-4)


def test_loader_packs_float32_on_cpu_only(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", "llama", tokenizer=tokenizer)
    cases = [
        ("auto", None, "onednn" if onednn_linear.available() else "torch"),
        ("float64", None, "torch"),
        ("float32", False, "torch"),
    ]

    async def main():
        for dtype, flag, want in cases:
            spec = ModelSpec(path=path, dtype=dtype, kv_cache_tokens=256, onednn_linear=flag)
            async with Engine(models={"m": spec}) as engine:
                assert engine.info().models["m"].linear_kernel == want
                out = await engine.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
                assert len(out.token_ids) == 4

    anyio.run(main)


def test_onednn_linear_required_where_it_cannot_apply(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", "llama", tokenizer=tokenizer)

    async def main():
        spec = ModelSpec(path=path, dtype="float64", kv_cache_tokens=256, onednn_linear=True)
        async with Engine(models={"m": spec}):
            pass

    with pytest.raises(ModelLoadError, match="onednn_linear=True.*float32 or bfloat16 on CPU"):
        anyio.run(main)
