"""The fused decoder (engine/model/fused_decoder.py) against transformers' forward it replaces.

Tolerances: the group calls are the same bits as the block linears one by one ("store" side by
side, "add" into the residual), and the rotary product is transformers' bit for bit; RMSNorm
sums its squares in double (torch in float32), and SiLU's exp is libm's, so their outputs agree
to float32 rounding (measured: 1e-7 relative), and a model's log-probabilities to within 5e-3
nats: where those last bits put an x on the other side of an int8 rounding, a block linear's
output moves by a code's worth (measured under 2e-5 on these tiny models at AVX2 and AVX512,
6.6e-4 in plain C, whose float steps are not fused). A token's log-probability is the same bits in a
decode step, in a step beside other requests and in a prefill.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine.quant import FusedLinears, GGUFBlockLinear, gguf_native, rope
from tokenrouter.testing import build_tiny_model, quantize_q4k, write_gguf

pytestmark = pytest.mark.cpu_levels  # at this CPU's level and each lower one (tests/conftest.py)


def _lib():
    lib = gguf_native.load()[0]
    if lib is None:
        pytest.skip(f"no GGUF block kernels here: {gguf_native.load()[1]}")
    return lib


def _linear(lib, rows: int, cols: int, seed: int, bias: bool = False) -> GGUFBlockLinear:
    g = np.random.default_rng(seed)
    w = g.standard_normal((rows, cols)).astype(np.float32) * 0.05
    b = torch.from_numpy(g.standard_normal(rows).astype(np.float32)) if bias else None
    return GGUFBlockLinear(lib, "Q4_K", quantize_q4k(w), (rows, cols), b)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def test_a_group_is_its_linears_one_by_one_bit_for_bit():
    torch.manual_seed(0)
    lib = _lib()
    q, k, v = _linear(lib, 512, 256, 1, bias=True), _linear(lib, 64, 256, 2, bias=True), _linear(lib, 48, 256, 3)
    x = torch.randn(5, 256)
    got = FusedLinears([q, k, v])(x)
    assert torch.equal(got, torch.cat([q(x), k(x), v(x)], 1))
    for rows in (1, 3):  # each row alone: the same bits in a call of any rows
        assert torch.equal(FusedLinears([q, k, v])(x[:rows]), got[:rows])
    h = torch.randn(5, 512)
    o = _linear(lib, 512, 256, 4)
    want = h + o(x)
    assert torch.equal(FusedLinears([o], "add")(x, out=h.clone()), want)


def test_the_norm_and_silu_epilogue_agree_with_torch():
    torch.manual_seed(0)
    lib = _lib()
    gate, up = _linear(lib, 320, 256, 5), _linear(lib, 320, 256, 6)
    x, w = torch.randn(4, 256) * 3, torch.rand(256) + 0.5
    got = FusedLinears([gate, up], "silu_mul", norm=w, eps=1e-6)(x)
    xn = _rms(x, w, 1e-6)
    want = torch.nn.functional.silu(gate(xn)) * up(xn)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()


def test_rope_is_transformers_rotary_bit_for_bit():
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    lib = _lib()
    torch.manual_seed(0)
    t, heads, kv_heads, dim = 6, 4, 2, 32
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim)
    angles = torch.randn(t, dim // 2) * 4
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    q = qkv[:, : heads * dim].view(1, t, heads, dim).transpose(1, 2)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(1, t, kv_heads, dim).transpose(1, 2)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    v = qkv[:, (heads + kv_heads) * dim :].clone()
    rope(lib, qkv, heads + kv_heads, dim, cos, sin)
    assert torch.equal(qkv[:, : heads * dim], want_q.transpose(1, 2).reshape(t, -1))
    assert torch.equal(qkv[:, heads * dim : (heads + kv_heads) * dim], want_k.transpose(1, 2).reshape(t, -1))
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v)  # the values are not rotated


def test_bad_groups_and_inputs_are_refused():
    lib = _lib()
    a, b = _linear(lib, 32, 256, 1), _linear(lib, 48, 256, 2)
    with pytest.raises(ValueError, match="silu_mul"):
        FusedLinears([a], "silu_mul")
    with pytest.raises(ValueError, match="same width"):
        FusedLinears([a, b], "silu_mul")
    with pytest.raises(ValueError, match="'sum'"):
        FusedLinears([a], "sum")
    with pytest.raises(ValueError, match="float32"):
        FusedLinears([a])(torch.randn(2, 256, dtype=torch.float64))
    with pytest.raises(ValueError, match="out"):
        FusedLinears([a], "add")(torch.randn(2, 256))


def _run(path, monkeypatch, fused: str, prompt: list[int], tokens: int = 8, dtype: str = "float32"):
    """Greedy `tokens` from `prompt` with each token's log-probability (decode steps), and the
    prompt's log-probabilities (a prefill), with TOKENROUTER_FUSED_LAYERS=`fused` ("on": the
    layers in one C call; "python": the fused decoder's Python loop; "off": transformers')."""
    monkeypatch.setenv("TOKENROUTER_FUSED_LAYERS", fused)

    async def main():
        spec = ModelSpec(path=path, dtype=dtype, quantization="gguf", kv_cache_tokens=512)
        async with Engine(models={"m": spec}, num_threads=1) as e:
            assert e.info().models["m"].linear_kernel.startswith("blocks")
            forward = e.stats()["m"].model_forward
            off = fused == "off"
            assert forward.startswith("transformers: TOKENROUTER_FUSED_LAYERS=off") if off else forward == "fused"
            params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, logprobs=0, prompt_logprobs=0)
            got = {}

            async def one(key, ids):
                got[key] = await e.generate(ids, params)

            async with anyio.create_task_group() as tg:  # a second request in the same steps
                tg.start_soon(one, "out", prompt)
                tg.start_soon(one, "other", [5, 9, 11, 40, 7])
            out = got["out"]
            again = await e.generate(prompt + out.token_ids, SamplingParams(max_tokens=1, prompt_logprobs=0))
        decoded = [lp.logprob for lp in out.logprobs]
        prefilled = [lp.logprob for lp in again.prompt_logprobs[len(prompt) :]]
        return out.token_ids, decoded, [lp.logprob for lp in out.prompt_logprobs[1:]], prefilled

    return anyio.run(main)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_fused_model_is_transformers_model_and_the_same_bits_in_any_step(tmp_path, tokenizer, monkeypatch, arch):
    from tokenrouter.engine.quant import probe

    _lib()
    monkeypatch.setattr(probe, "few_kernel", lambda timings: "blocks")
    # weights of a trained model's spread: at the default 0.2 the tiny model's attention is so sharp
    # that the level's last bits (fused multiply-adds or not) moved the two forwards 0.03 nats apart
    path = build_tiny_model(
        tmp_path / arch,
        arch,
        tokenizer=tokenizer,
        weight_std=0.05,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
    )
    write_gguf(path, kind="Q4_K")
    prompt = [(7 * i + 3) % 300 + 3 for i in range(24)]
    tokens, decoded, prompt_lp, prefilled = _run(path, monkeypatch, "on", prompt)
    _, _, want_prompt, _ = _run(path, monkeypatch, "off", prompt)
    err = (torch.tensor(prompt_lp) - torch.tensor(want_prompt)).abs().max()
    assert 0 < err < 5e-3, err  # not the same bits (RMSNorm's sum): the two forwards did run
    # a token decoded beside another request, and the same token in a prefill: the same bits
    assert decoded == prefilled


def test_the_layers_in_one_c_call_are_the_python_loops_bits(tmp_path, tokenizer, monkeypatch):
    """tr_decoder_layers (engine/model/layer_stack.py) runs the fused layers' kernels in the Python
    loop's order, the K and V rounded into the cache as torch rounds them: every token and
    log-probability of a decode beside another request, of a prompt and of a prefill is the same
    bits either way."""
    from tokenrouter.engine.quant import probe

    _lib()
    monkeypatch.setattr(probe, "few_kernel", lambda timings: "blocks")
    path = build_tiny_model(
        tmp_path / "qwen2",
        "qwen2",
        tokenizer=tokenizer,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    write_gguf(path, kind="Q4_K")
    from tokenrouter.engine.model.layer_stack import LayerStack

    calls = []
    stack_call = LayerStack.__call__
    monkeypatch.setattr(LayerStack, "__call__", lambda self, *a: calls.append(self.kv_kind) or stack_call(self, *a))
    prompt = [(11 * i + 5) % 300 + 3 for i in range(40)]  # over two KV blocks
    in_c = _run(path, monkeypatch, "on", prompt, tokens=12)
    assert calls and set(calls) == {2}  # it ran, over a float16 KV cache (the GGUF blocks' precision)
    calls.clear()
    in_python = _run(path, monkeypatch, "python", prompt, tokens=12)
    assert not calls
    assert in_c == in_python
