"""Int8 linear layers (engine/quant/int8.py, `ModelSpec(quantization="int8")`): close to the float32
layer, the MLP output projections kept float32, the loader quantizing only where it can, and a
quantized draft model leaving greedy speculative decoding the large model's own output."""

from __future__ import annotations

import anyio
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from tests.helpers import generate_all, hf_greedy, holds_nothing, wait_all_free
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine.quant import int8 as int8_linear
from tokenrouter.engine.quant import onednn as onednn_linear
from tokenrouter.engine.quant.int8 import KEEP_FLOAT, Int8Linear, quantize_linears
from tokenrouter.policies import Speculative
from tokenrouter.testing import build_perturbed_copy, build_tiny_model

pytestmark = pytest.mark.skipif(not int8_linear.available(), reason="this torch build has no fbgemm int8 kernels")


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_close_to_the_float_layer(bias):
    """Per-channel int8 weights and 7-bit activations: a few percent of the output's scale, for
    one layer called with one row, several, and a batch of sequences."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 80, bias=bias)
    layer = Int8Linear(lin)
    for shape in [(1, 96), (3, 96), (9, 96), (2, 5, 96)]:
        x = torch.randn(*shape)
        want, got = F.linear(x, lin.weight, lin.bias), layer(x)
        assert got.shape == want.shape and got.dtype == torch.float32
        err = (got - want).abs().max() / want.abs().max()
        assert 0 < err < 0.05, shape  # int8, not a float copy; yet close


@pytest.mark.parametrize("tie", [False, True])
def test_quantize_linears_keeps_the_mlp_output_projections(tmp_path, tokenizer, tie):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer, tie_word_embeddings=tie, logit_scale=3.0)
    dense = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    quant = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    names = [n for n, m in dense.named_modules() if type(m) is torch.nn.Linear]
    kept = [n for n in names if n.rpartition(".")[2] in KEEP_FLOAT]
    assert kept and len(kept) == dense.config.num_hidden_layers  # one down_proj per layer
    assert quantize_linears(quant) == len(names) - len(kept)
    assert all(type(quant.get_submodule(n)) is torch.nn.Linear for n in kept)
    head = quant.get_output_embeddings()
    assert isinstance(head, Int8Linear) and head.weight.shape == dense.get_output_embeddings().weight.shape
    assert (head.weight is quant.get_input_embeddings().weight) == tie  # a tied embedding stays float32
    ids = torch.tensor([[5, 17, 3, 99, 42, 7, 8, 250, 31, 64]])
    with torch.inference_mode():
        want, got = dense(ids).logits, quant(ids).logits
    assert (got - want).abs().max() / want.abs().max() < 0.1
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8


def test_the_loader_quantizes_on_cpu_float32_only(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", "llama", tokenizer=tokenizer)
    packs = "onednn" if onednn_linear.available() else "torch"

    async def kernel(**kw) -> str:
        async with Engine(models={"m": ModelSpec(path=path, kv_cache_tokens=256, **kw)}) as engine:
            out = await engine.generate([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
            assert len(out.token_ids) == 4
            return engine.info().models["m"].linear_kernel

    assert anyio.run(lambda: kernel(quantization="int8")) == f"int8+{packs}"
    assert anyio.run(lambda: kernel(quantization="int8", onednn_linear=False)) == "int8+torch"
    assert anyio.run(lambda: kernel()) == packs
    for bad in ({"dtype": "float64"}, {"dtype": "bfloat16"}, {"device": "cuda"}):
        with pytest.raises(
            ValidationError, match="quantization='int8' runs on device 'cpu' with dtype auto or float32"
        ):
            ModelSpec(path=path, quantization="int8", **bad)
    with pytest.raises(ValidationError, match="quantization"):
        ModelSpec(path=path, quantization="int4")


def test_an_int8_draft_leaves_greedy_speculative_the_large_models_output(tiny_pair, tokenizer, tmp_path):
    """Lossless whatever the drafter computes: 12 requests at once, against Hugging Face generate
    on the large model; the int8 drafter (a perturbed copy of the large one) still has drafts
    accepted, so it drafts sensibly."""
    large = tiny_pair["large"]
    small = build_perturbed_copy(large, tmp_path / "small", noise=0.01)
    specs = {
        "small": ModelSpec(path=small, dtype="float32", quantization="int8", kv_cache_tokens=2048, block_size=8),
        "large": ModelSpec(path=large, dtype="float64", kv_cache_tokens=2048, block_size=8),
    }
    prompts = [[17, 40, 9, 101, 33], [250, 3, 77], [5, 6, 7, 8, 9, 10, 11, 12, 13], [300, 12]] * 3
    lengths = [12, 20, 7, 16] * 3

    async def main():
        async with Engine(models=specs, policy=Speculative(k=4)) as e:
            outs = await generate_all(
                e, prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
            )
            await wait_all_free(e)
            assert holds_nothing(e)
            return outs

    outs = anyio.run(main)
    for prompt, n, out in zip(prompts, lengths, outs):
        assert out.token_ids == hf_greedy(large, prompt, n), prompt
    assert sum(m == "small" for out in outs for m in out.token_models) > sum(lengths) // 4
