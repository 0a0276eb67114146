"""ModelSpec(quantization="gguf"): a GGUF's Q4_K tensors kept 4-bit (int4 groups of 32), its other
quantized tensors int8, computed with bf16 activations, on tiny models with a GGUF written beside.

Tolerances:
- the Q4_K codes, scales and mins read here dequantize to exactly gguf's reference values;
- the int4 kernel's weight is the float32 dequantized one but for bf16 rounding of each group's
  scale and zero: within 0.5% (relative, Frobenius), and its output is that weight's product with
  the bf16 input to within (|y| + 1) / 32: the kernel keeps its partial sums in bf16 (measured:
  up to 0.06 at outputs of 8 to 21 over 768 inputs);
- the engine's prompt log-probabilities are as close to a float32 transformers model holding the
  same dequantized weights as that model computed in bf16 is: on average within 1.5x its error
  plus 0.03 nats, and within 1 nat at every position (measured over six models: 0.08-0.16 on
  average against bf16's 0.08-0.12); the unquantized model is three times further away, so the
  weights are the GGUF's 4-bit ones, not the originals; the same holds under gguf+bf16, whose
  prompt runs on bf16 copies of the GGUF's dequantized weights;
- with the GGUF block kernels under `gguf`, the prompt too runs on activations rounded to int8
  (llama.cpp's arithmetic): within 2.5x bf16's error plus 0.03 on average and 2 nats at every
  position (measured: 0.17-0.21 against bf16's 0.10-0.12, at most 0.99), still 8x closer to the
  dequantized model than to the original one;
- under gguf+bf16 each layer's two kernels agree to within 2% (relative, Frobenius) on a random
  bf16 input (measured: 0.3% for int4, 0.8% for int8 requantized from Q8_0)."""

from __future__ import annotations

import mmap

import anyio
import numpy as np
import pytest
import torch

from tests.helpers import torch_bf16_runs
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine.quant import GGUFTensor, q4k_groups
from tokenrouter.engine.quant.int4 import Int4Linear
from tokenrouter.testing import build_tiny_model, loaded_model, quantize_q4k, write_gguf

pytestmark = pytest.mark.cpu_levels  # at this CPU's level and each lower one (tests/conftest.py)


@pytest.mark.parametrize("shape", [(8, 256), (48, 512), (130, 768)])
def test_q4k_blocks_decode_exactly_as_gguf_dequantizes_them(shape):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = np.random.default_rng(sum(shape)).normal(0, 0.2, shape).astype(np.float32)
    blocks = quantize_q4k(w)
    ref = dequantize(blocks, GGMLQuantizationType.Q4_K).reshape(shape)
    assert np.linalg.norm(ref - w) / np.linalg.norm(w) < 0.1  # a valid 4-bit encoding of w
    codes, scale, minus = q4k_groups(GGUFTensor("t", "Q4_K", *shape, blocks))
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    mine = (codes.float().view(shape[0], -1, 32) * scale[..., None] - minus[..., None]).view(shape)
    assert torch.equal(mine, torch.from_numpy(ref))
    lin = Int4Linear(codes, scale, minus, None)
    eff = lin.effective_weight()
    assert (eff - mine).norm() / mine.norm() < 0.005
    x = torch.randn(5, shape[1])
    y = lin(x)
    exact = x.bfloat16().float() @ eff.t()
    assert ((y - exact).abs() <= (exact.abs() + 1) / 32).all()


def _dequantized_reference(path, gguf_path):
    """A float32 transformers model holding the GGUF's dequantized weights, un-permuted by
    transformers' own GGUF code (an implementation independent of the engine's)."""
    from gguf import GGUFReader, get_tensor_name_map
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    config = model.config
    from gguf import MODEL_ARCH_NAMES

    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == config.model_type)
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    processor = TENSOR_PROCESSORS.get(config.model_type, TensorProcessor)(config=config.to_dict())
    tensors = {t.name: t for t in GGUFReader(gguf_path).tensors}
    with torch.no_grad():
        for name, module in model.named_modules():
            gguf_name = names.get_name(name)
            t = tensors.get(f"{gguf_name}.weight") if gguf_name else None
            if t is None or len(t.shape) != 2:
                continue  # norms are float32 in the file, as in the model
            w = dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
            w = processor.process(w, t.name).weights
            module.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
    return model


def _log_probs(model, prompt) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)


@pytest.mark.parametrize(
    "arch, quantization, kernels, dtype",
    [
        ("qwen2", "gguf", "int4+int8+gguf-embedding", "bfloat16"),
        ("llama", "gguf", "int4+int8+gguf-embedding", "bfloat16"),
        ("qwen2", "gguf+bf16", "int4+int8+bf16-by-rows+gguf-embedding", "bfloat16"),
        ("llama", "gguf+bf16", "int4+int8+bf16-by-rows+gguf-embedding", "bfloat16"),
        ("qwen2", "gguf", "blocks+gguf-embedding", "bfloat16"),
        ("llama", "gguf", "blocks+gguf-embedding", "bfloat16"),
        ("qwen2", "gguf+bf16", "blocks+bf16-by-rows+gguf-embedding", "bfloat16"),
        ("llama", "gguf+bf16", "blocks+bf16-by-rows+gguf-embedding", "bfloat16"),
        ("qwen2", "gguf", "blocks+gguf-embedding", "float32"),
        ("llama", "gguf", "blocks+gguf-embedding", "float32"),
    ],
)
def test_the_gguf_engine_computes_the_checkpoints_own_weights(
    tmp_path, tokenizer, monkeypatch, arch, quantization, kernels, dtype
):
    """Under gguf+bf16 the prompt (40 rows) runs on the bf16 copies and the decode on the
    quantized kernels: both must hold the GGUF's weights. The quantized kernels are torch's
    (int4, int8) or the GGUF block kernels, whichever the case names (the probe's pick forced);
    in float32 the block kernels compute between float32 activations over a float16 KV cache."""
    from transformers import AutoModelForCausalLM

    from tokenrouter.engine.quant import gguf_native, probe

    blocks = kernels.startswith("blocks")
    if blocks and gguf_native.load()[0] is None:
        pytest.skip(f"no GGUF block kernels here: {gguf_native.load()[1]}")
    if quantization == "gguf+bf16" and not torch_bf16_runs():
        pytest.skip("bf16 copies need torch's oneDNN bf16, which does not run at this CPU level")
    monkeypatch.setattr(probe, "few_kernel", lambda timings: "blocks" if blocks else "int4")
    # the prompt's 40 rows on the bf16 copies (gguf+bf16), whatever this machine's crossover
    monkeypatch.setattr(probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (8, {}))

    path = build_tiny_model(
        tmp_path / arch, arch, tokenizer=tokenizer, hidden_size=256, intermediate_size=320, num_attention_heads=4
    )
    gguf_path = write_gguf(path)  # Q4_K where rows are multiples of 256 long, Q8_0 (down_proj) elsewhere
    prompt = [(7 * i + 3) % 300 + 3 for i in range(40)]

    async def main():
        spec = ModelSpec(path=path, dtype=dtype, quantization=quantization, kv_cache_tokens=256)
        async with Engine(models={"m": spec}, num_threads=1) as e:
            out = await e.generate(prompt, SamplingParams(max_tokens=4, prompt_logprobs=0, temperature=0))
            return torch.tensor([r.logprob for r in out.prompt_logprobs[1:]]), loaded_model(e, "m")

    got, loaded = anyio.run(main)
    assert loaded.dtype == getattr(torch, dtype)
    assert loaded.kv == (torch.float16 if dtype == "float32" else torch.bfloat16)
    assert loaded.linear_kernel == kernels, loaded.linear_kernel
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    want_kinds = {"GGUFBlockLinear"} if blocks else {"Int4Linear", "Int8WeightLinear"}
    assert want_kinds | {"GGUFEmbedding"} <= kinds and "Linear" not in kinds
    table = loaded.model.get_input_embeddings().table.data  # the file's blocks, mapped, not read
    base = table
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap) and not table.flags.writeable
    reference = _dequantized_reference(path, gguf_path)
    want = _log_probs(reference, prompt)
    bf16 = _log_probs(reference.to(torch.bfloat16), prompt)
    err = (got - want).abs()
    original = _log_probs(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), prompt)
    if quantization == "gguf" and blocks:  # the prompt too runs on int8-rounded activations
        assert err.mean() <= 2.5 * (bf16 - want).abs().mean() + 0.03 and err.max() < 2.0
    else:
        assert err.mean() <= 1.5 * (bf16 - want).abs().mean() + 0.03 and err.max() < 1.0
    assert (got - original).abs().mean() > 3 * err.mean()
    if quantization == "gguf+bf16":  # both kernels of every layer hold the same weights
        layers = [m for m in loaded.model.modules() if type(m).__name__ == "ByRowsLinear"]
        assert layers and all(layer.max_few_rows >= 0 for layer in layers)
        for layer in layers:
            x = torch.randn(3, layer.in_features, dtype=torch.bfloat16)
            few, many = layer.few(x).float(), layer.many(x).float()
            assert (few - many).norm() <= 0.02 * many.norm(), type(layer.few).__name__  # measured: under 0.01


def test_gguf_mode_needs_a_gguf_and_cpu(tmp_path, tokenizer):
    from pydantic import ValidationError

    from tokenrouter import ModelLoadError

    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer, hidden_size=256, num_attention_heads=4)

    async def main(dtype):
        async with Engine(models={"m": ModelSpec(path=path, dtype=dtype, quantization="gguf")}):
            pass

    # the GGUF is looked for first, whatever the dtype resolves to
    for dtype in ("bfloat16", "float32", "auto"):
        with pytest.raises(ModelLoadError, match="quantization='gguf'.*no GGUF file"):
            anyio.run(main, dtype)
    with pytest.raises(ValidationError, match="quantization='gguf' runs on .* dtype auto, bfloat16 or float32, not"):
        ModelSpec(path=path, quantization="gguf", dtype="float16")
    with pytest.raises(ValidationError, match="quantization='gguf\\+bf16' runs on .* dtype auto or bfloat16, not"):
        ModelSpec(path=path, quantization="gguf+bf16", dtype="float32")


def test_the_bf16_copy_is_the_layer_itself_only_where_it_holds_the_ggufs_weights():
    """gguf+bf16's dense kernel: a store-converted checkpoint already holds the GGUF's weights
    dequantized to bf16, and is taken as it is; any other weights (the maker's originals beside a
    GGUF) are replaced by the GGUF's own, so that both kernels of a layer compute the same."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from tokenrouter.engine.quant.kernels import dense_bf16

    w = np.random.default_rng(3).normal(0, 0.2, (40, 512)).astype(np.float32)
    t = GGUFTensor("blk.0.ffn_up", "Q4_K", 40, 512, quantize_q4k(w))
    exact = torch.from_numpy(dequantize(t.data, GGMLQuantizationType.Q4_K).reshape(40, 512)).bfloat16()
    converted = torch.nn.Linear(512, 40, dtype=torch.bfloat16)
    with torch.no_grad():
        converted.weight.copy_(exact)
    assert dense_bf16(t, converted) is converted
    original = torch.nn.Linear(512, 40, dtype=torch.bfloat16)
    with torch.no_grad():
        original.weight.copy_(torch.from_numpy(w))
        original.weight[39, 7] += 0.5  # one row the sample reaches differs
    for other in (original, torch.nn.Linear(512, 40)):  # different values; float32
        made = dense_bf16(t, other)
        assert made is not other and torch.equal(made.weight, exact) and made.bias is other.bias


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_header_index_agrees_with_ggufs_reader(tmp_path, alignment):
    """Every kind of metadata value is stepped over (a vocabulary's string arrays among them), and
    a custom alignment moves where the tensors start."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    from tokenrouter.engine import tensor_places

    path = tmp_path / "m.gguf"
    writer = GGUFWriter(path, "qwen2")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_token_list([f"tok{i}" for i in range(300)] + ["é", ""])
    writer.add_array("test.ints", [1, 2, 3])
    writer.add_array("test.nested", [["a", "bc"], [4.5]])
    writer.add_bool("test.bool", True)
    writer.add_float64("test.f64", 0.25)
    writer.add_uint64("test.u64", 7)
    writer.add_string("test.str", "x" * 1000)
    rng = np.random.default_rng(0)
    writer.add_tensor("output_norm.weight", rng.normal(size=33).astype(np.float32))
    writer.add_tensor(
        "token_embd.weight",
        quantize_q4k(rng.normal(size=(3, 256)).astype(np.float32)),
        raw_dtype=GGMLQuantizationType.Q4_K,
    )
    writer.add_tensor("blk.0.ffn_up.weight", rng.normal(size=(5, 16)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    places = tensor_places(path)
    reader = GGUFReader(path).tensors
    assert len(places) == len(reader) == 3
    for t in reader:
        got = places[t.name]
        assert (got.kind, got.shape) == (t.tensor_type.name, tuple(int(d) for d in t.shape))
        assert (got.offset, got.n_bytes) == (int(t.data_offset), int(t.n_bytes))
        if alignment:
            assert got.offset % alignment == 0
    (tmp_path / "not.gguf").write_bytes(b"{}" * 20)
    with pytest.raises(ValueError, match="not a GGUF file"):
        tensor_places(tmp_path / "not.gguf")


def test_a_prompt_chunked_over_steps_runs_on_the_block_kernels(tmp_path, tokenizer, monkeypatch):
    """A prompt longer than the step's token budget is prefilled in chunks, and a step holding only
    a chunk that does not end the prompt samples nothing: the output head then computes no row.
    The block kernels refused a call of 0 rows, which failed such a step (it ended a HumanEval
    run under RStitch). The answer is the one an unchunked prefill gives."""
    from tokenrouter.engine.quant import gguf_native, probe

    lib = gguf_native.load()[0]
    if lib is None:
        pytest.skip(f"no GGUF block kernels here: {gguf_native.load()[1]}")
    monkeypatch.setattr(probe, "few_kernel", lambda timings: "blocks")
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer, hidden_size=256, intermediate_size=320)
    write_gguf(path)
    prompt = [(7 * i + 3) % 300 + 3 for i in range(40)]

    async def main(budget: int):
        spec = ModelSpec(path=path, dtype="bfloat16", quantization="gguf", max_num_batched_tokens=budget)
        async with Engine(models={"m": spec}, num_threads=1) as e:
            assert e.info().models["m"].linear_kernel.startswith("blocks")
            return (await e.generate(prompt, SamplingParams(max_tokens=4, temperature=0))).token_ids

    assert anyio.run(main, 16) == anyio.run(main, 512)
