"""CPU precision: the probe's decision (timings mocked: a machine where bf16 is slow keeps float32,
one where it is fast takes it), its cache, a CPU where torch's bf16 ops raise (an AVX2 CPU, or
the level pinned to one), and the bf16 engine against transformers in bf16.

Tolerances: the engine's bf16 prompt log-probabilities are within 0.15 nats of transformers' bf16
forward on the same model at every position, 0.04 on average (measured: at most 0.08 and 0.02 over
six models; both round activations to bf16 at every layer, in different orders: oneDNN's packed
kernels and paged attention against torch's matmuls and eager attention); and no further from
float32 than transformers' own bf16 is (1.5x its largest error, plus 0.02)."""

from __future__ import annotations

import anyio
import pytest
import torch

from tests.helpers import AVX2_BF16_ERROR, bf16_raises_as_on_an_avx2_cpu, torch_bf16_runs
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine import native
from tokenrouter.engine.quant import precision, probe
from tokenrouter.testing import build_tiny_model

pytestmark = pytest.mark.cpu_levels  # at this CPU's level and each lower one (tests/conftest.py)


@pytest.fixture
def needs_torch_bf16(cpu_level):
    if not torch_bf16_runs():
        pytest.skip(f"torch's bf16 ops do not run at CPU level {cpu_level}")


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU whose level lets torch's bf16 ops run, for the tests whose mocked timings have bf16 fast."""
    monkeypatch.setattr(native.cpu.CpuLevel, "torch_bf16", property(lambda self: None))


FAST = {"float32": {1: 2.56, 4: 2.30, 16: 3.42}, "bfloat16": {1: 0.77, 4: 1.03, 16: 1.53}}  # measured, issue 38
SLOW = {"float32": {1: 2.56, 4: 2.30, 16: 3.42}, "bfloat16": {1: 512.0, 4: 460.0, 16: 684.0}}  # no native bf16
EDGE = {"float32": {1: 2.6, 4: 2.3, 16: 3.4}, "bfloat16": {1: 1.0, 4: 1.0, 16: 2.9}}  # fast but at 16 rows


def test_bf16_is_chosen_only_where_it_is_clearly_faster_at_every_size():
    assert probe.choose(FAST)[0] == "bfloat16"
    dtype, reason = probe.choose(SLOW)
    assert dtype == "float32" and "0.01x at 1" in reason
    assert probe.choose(EDGE)[0] == "float32"  # 1.17x at 16 rows is not enough


@pytest.mark.parametrize("timings, want", [(SLOW, torch.float32), (FAST, torch.bfloat16)], ids=["slow", "fast"])
def test_auto_follows_the_probe_and_caches_it(monkeypatch, tmp_path, tokenizer, timings, want, needs_torch_bf16):
    """dtype="auto" on CPU loads in what the probe says, measures once per machine and caches it
    under the store home, and says why in one line."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(probe.SIMULATE_ENV, raising=False)
    calls = []

    def measure(shapes, threads, repeats=7):
        calls.append((tuple(map(tuple, shapes)), threads))
        return timings

    monkeypatch.setattr(probe, "measure", measure)
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer)

    async def main():
        async with Engine(models={"m": ModelSpec(path=path, kv_cache_tokens=256)}, num_threads=1) as e:
            out = await e.generate([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
            assert len(out.token_ids) == 3
            return e.info().models["m"]

    first = anyio.run(main)
    assert first.dtype == want and "measured" in first.precision
    assert len(calls) == 1 and calls[0][1] == 1  # the model's own shapes, on the forwards' threads
    assert (64 * 2, 64) in calls[0][0] or (128, 64) in calls[0][0]
    second = anyio.run(main)
    assert second.dtype == want and len(calls) == 1  # from the cache
    assert list((tmp_path / "home" / "probes").glob("precision-*.json"))


def _answer(path, **spec) -> object:
    async def main():
        async with Engine(models={"m": ModelSpec(path=path, kv_cache_tokens=256, **spec)}, num_threads=1) as e:
            out = await e.generate([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
            assert len(out.token_ids) == 3 and out.error is None
            return e.info().models["m"]

    return anyio.run(main)


def test_where_torchs_bf16_ops_raise_the_engine_loads_in_float32_and_says_why(monkeypatch, tmp_path, tokenizer):
    """torch's bf16 ops raising exactly as on an AVX2 CPU: the probe counts bf16 as not available
    here (never an error), the model loads in float32 and answers, the precision line says why."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(probe.SIMULATE_ENV, raising=False)  # the real bf16 probe runs, and raises
    bf16_raises_as_on_an_avx2_cpu(monkeypatch)
    with pytest.raises(RuntimeError, match="bf16 path needs"):
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(4, 4, dtype=torch.bfloat16))
    assert probe.measure([(64, 64)], threads=1, repeats=1)["bfloat16"] == {}
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer)
    loaded = _answer(path)
    why = "bf16 linear raised here: mkldnn" if torch_bf16_runs() else "no bfloat16: torch's bf16 linear needs"  # pinned
    assert loaded.dtype == torch.float32 and why in loaded.precision, loaded.precision
    assert f"CPU level {native.cpu.current().level}" in loaded.precision
    assert not list((tmp_path / "home" / "probes").glob("precision-*.json"))  # nothing kept: measured on each load


@pytest.mark.skipif(not native.cpu.current().x86, reason="x86 levels")
def test_a_level_without_torchs_bf16_never_probes_it(monkeypatch, tmp_path, tokenizer):
    """Pinned below avx512 (TOKENROUTER_CPU_LEVEL), bf16 counts as absent: never probed, never
    packed, float32 chosen with the reason; bf16 asked for runs on torch's own kernels."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(native.cpu.ENV, "plain")
    monkeypatch.setattr(probe, "measure", lambda *a, **k: pytest.fail("bf16 probed where it is refused"))
    assert "avx512bw" in native.cpu.current().torch_bf16 and not native.cpu.current().native_bf16
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer)
    loaded = _answer(path)
    assert loaded.dtype == torch.float32 and "no bfloat16: torch's bf16 linear needs" in loaded.precision
    assert "CPU level plain (TOKENROUTER_CPU_LEVEL=plain" in loaded.precision, loaded.precision
    asked = _answer(path, dtype="bfloat16")
    assert asked.dtype == torch.bfloat16 and asked.linear_kernel == "torch"
    # bf16 copies compute on oneDNN's bf16: gguf+bf16 holds none here, whatever the rows probe says
    from transformers import AutoConfig

    monkeypatch.setattr(probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (3, ROWS_MEASURED))
    spec = ModelSpec(path=path, quantization="gguf+bf16", dtype="bfloat16")
    p = precision.resolve_precision(spec, AutoConfig.from_pretrained(path), torch.device("cpu"), 1)
    assert (p.quantization, p.quantized_rows) == ("gguf", 0) and "no bf16 copies" in p.reason, p.reason
    assert AVX2_BF16_ERROR.startswith("mkldnn_reorder_linear_weight")


def test_a_simulated_cpu_without_native_bf16_keeps_float32(monkeypatch):
    monkeypatch.setenv(probe.SIMULATE_ENV, "no-native-bf16")
    timings = probe.measure([(64, 64)], threads=1, repeats=1)
    assert probe.choose(timings)[0] == "float32"
    rows = {"bfloat16": {1: 1.0}, "float32": {1: 2.0}, "blocks": {1: 0.5}}  # the rows probe: bf16 dense only
    assert probe.simulated(rows) == {**rows, "bfloat16": {1: probe.SLOW_BF16}}


def test_gguf_mode_falls_back_to_float32_where_bf16_is_slow(monkeypatch, tmp_path, bf16_cpu):
    """Without fast bf16: the GGUF block kernels in float32 where the rows probe measured them
    faster than float32 dense at every size or at one row (decode), else float32 weights; with it,
    the probe's kernels."""
    from transformers import AutoConfig

    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: probe.PrecisionChoice(*probe.choose(SLOW), SLOW, "x"))
    path = build_tiny_model(tmp_path / "m", "qwen2")
    config = AutoConfig.from_pretrained(path)
    f32 = dict.fromkeys(probe.QUANTIZED_ROWS, 2.0)
    faster = {**ROWS_MEASURED, "float32": f32, "blocks": dict.fromkeys(probe.QUANTIZED_ROWS, 1.0)}
    slower_at_most = {**faster, "blocks": {**faster["blocks"], 128: 2.5}}  # the plain C kernels' shape
    slower_at_one = {**faster, "blocks": {**faster["blocks"], 1: 2.5}}
    rows_probe = lambda t: lambda shape, threads, kind=None, dense="bfloat16": (0, t)  # noqa: E731
    for quantization in ("gguf", "gguf+bf16"):
        spec = ModelSpec(path=path, quantization=quantization)
        for timings in ({**ROWS_MEASURED, "float32": f32}, slower_at_one):  # no block kernels; slower at 1 row
            monkeypatch.setattr(probe, "quantized_rows", rows_probe(timings))
            p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
            assert p.dtype == torch.float32 and p.quantization is None and "falls back to float32" in p.reason
        for timings, said in ((faster, "at every size up to 128 rows"), (slower_at_most, "at one row (decode)")):
            monkeypatch.setattr(probe, "quantized_rows", rows_probe(timings))
            p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
            assert (p.dtype, p.kv, p.quantization, p.gguf_blocks) == (torch.float32, torch.float16, "gguf", True)
            assert f"faster than float32 {said}" in p.reason, p.reason
        as_cached = {k: {str(r): v for r, v in t.items()} for k, t in slower_at_most.items()}  # JSON's keys
        monkeypatch.setattr(probe, "quantized_rows", rows_probe(as_cached))
        assert precision.resolve_precision(spec, config, torch.device("cpu"), 1).gguf_blocks
        assert "about 7x the GGUF's memory" in p.reason, p.reason
    fast = probe.PrecisionChoice(*probe.choose(FAST), FAST, "x")
    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: fast)
    monkeypatch.setattr(probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (2, ROWS_MEASURED))
    p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
    assert p.dtype == torch.bfloat16 and p.quantization == "gguf+bf16" and not p.gguf_blocks


ROWS_MEASURED = {  # probe.measure_quantized on the demo 1.5B's largest layer, 2 threads, this machine
    "int4": {1: 0.77, 2: 0.97, 4: 1.37, 8: 2.71, 16: 5.44, 32: 10.64},
    "bfloat16": {1: 1.28, 2: 1.14, 4: 1.07, 8: 1.54, 16: 2.36, 32: 4.46},
}


def test_the_quantized_kernels_take_the_rows_where_they_are_no_slower():
    assert probe.crossover(ROWS_MEASURED) == 2
    as_cached = {k: {str(r): v for r, v in t.items()} for k, t in ROWS_MEASURED.items()}  # JSON keys
    assert probe.crossover(as_cached) == 2
    never = {"int4": {1: 2.0, 2: 2.0}, "bfloat16": {1: 1.0, 2: 1.0}}
    always = {"int4": {1: 1.0, 2: 1.0}, "bfloat16": {1: 2.0, 2: 2.0}}
    assert probe.crossover(never) == 0 and probe.crossover(always) == 2
    # a noisy small size does not extend the range past a size where bf16 won
    assert probe.crossover({"int4": {1: 1.0, 2: 3.0, 4: 1.0}, "bfloat16": {1: 2.0, 2: 2.0, 4: 2.0}}) == 1


def test_the_block_kernels_serve_few_rows_only_where_measured_no_slower_than_int4():
    blocks = {**ROWS_MEASURED, "blocks": {1: 0.5, 2: 0.9, 4: 1.0, 8: 3.0, 16: 6.0, 32: 12.0}}
    assert probe.few_kernel(blocks) == "blocks" and probe.crossover(blocks) == 4  # its own timings
    slower = {**ROWS_MEASURED, "blocks": {1: 0.9, 2: 0.9, 4: 0.9}}
    assert probe.few_kernel(slower) == "int4" and probe.crossover(slower) == 2
    assert probe.few_kernel(ROWS_MEASURED) == "int4"  # not built here: not measured
    cached = {k: {str(r): v for r, v in t.items()} for k, t in blocks.items()}
    assert probe.few_kernel(cached) == "blocks" and probe.crossover(cached) == 4


def test_gguf_modes_take_the_block_kernels_where_the_probe_picks_them(monkeypatch, tmp_path, bf16_cpu):
    from transformers import AutoConfig

    path = build_tiny_model(tmp_path / "m", "qwen2")
    config = AutoConfig.from_pretrained(path)
    fast = probe.PrecisionChoice(*probe.choose(FAST), FAST, "x")
    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: fast)
    for timings, want in [({**ROWS_MEASURED, "blocks": {1: 0.5, 2: 0.9}}, True), (ROWS_MEASURED, False)]:
        monkeypatch.setattr(
            probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16", t=timings: (2, t)
        )
        for quantization in ("gguf", "gguf+bf16"):
            for dtype in ("auto", "bfloat16"):  # bf16 asked for still probes which kernel
                spec = ModelSpec(path=path, quantization=quantization, dtype=dtype)
                p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
                assert p.gguf_blocks is want and ("block kernels" in p.reason) is want, (quantization, dtype)
                # with no bf16 copies (asked for none; gguf+bf16 holds them here, crossing at 2
                # rows) and the dtype left to it, float32 between the block kernels, KV float16
                f32 = want and dtype == "auto" and quantization == "gguf"
                assert (p.dtype, p.kv) == ((torch.float32, torch.float16) if f32 else (torch.bfloat16,) * 2)


def test_the_rows_probe_is_measured_once_and_cached(monkeypatch, tmp_path):
    calls = []
    real = probe.measure_quantized

    def measure(shape, threads, repeats=7, kind="Q4_K", dense="bfloat16"):
        calls.append(shape)
        return ROWS_MEASURED

    monkeypatch.setattr(probe, "measure_quantized", measure)
    assert probe.quantized_rows((256, 64), 1, home=tmp_path)[0] == 2
    assert probe.quantized_rows((256, 64), 1, home=tmp_path)[0] == 2 and len(calls) == 1
    assert list((tmp_path / "probes").glob("rows-*.json"))
    timings = real((64, 256), threads=1, repeats=1)  # the real measurement runs: Q4_K by default
    dense = {"bfloat16"} if torch_bf16_runs() else set()  # bf16 left out where torch refuses it
    assert {"int4", *dense} <= set(timings) <= {"int4", "blocks", *dense}
    assert not dense or set(timings["bfloat16"]) == set(probe.QUANTIZED_ROWS)
    # torch's kernel at every size only where it may serve: no block kernels, or faster at one row
    every = "blocks" not in timings or timings["int4"][1] < timings["blocks"][1]
    assert set(timings["int4"]) == (set(probe.QUANTIZED_ROWS) if every else {1})
    # torch's kernel for any other type is int8 per channel: the one it would compute that type with
    assert {"int8", *dense} <= set(real((64, 64), threads=1, repeats=1, kind="Q8_0")) <= {"int8", "blocks", *dense}
    assert set(real((64, 64), threads=1, repeats=1, dense="float32")) - {"int8", "blocks"} == {"float32"}


def test_gguf_with_bf16_copies_takes_the_probed_rows_and_falls_back_alike(monkeypatch, tmp_path, bf16_cpu):
    from transformers import AutoConfig

    path = build_tiny_model(tmp_path / "m", "qwen2")
    config = AutoConfig.from_pretrained(path)
    spec = ModelSpec(path=path, quantization="gguf+bf16")
    monkeypatch.setattr(probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (3, ROWS_MEASURED))
    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: probe.PrecisionChoice(*probe.choose(FAST), FAST, "x"))
    p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
    assert (p.dtype, p.quantization, p.quantized_rows) == (
        torch.bfloat16,
        "gguf+bf16",
        3,
    ) and "up to 3 rows" in p.reason
    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: probe.PrecisionChoice(*probe.choose(SLOW), SLOW, "x"))
    p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
    assert p.dtype == torch.float32 and p.quantization is None and "falls back to float32" in p.reason


def test_gguf_with_bf16_copies_holds_none_where_the_quantized_kernel_wins_at_every_size(
    monkeypatch, tmp_path, bf16_cpu
):
    from transformers import AutoConfig

    path = build_tiny_model(tmp_path / "m", "qwen2")
    config = AutoConfig.from_pretrained(path)
    spec = ModelSpec(path=path, quantization="gguf+bf16")
    fast = probe.PrecisionChoice(*probe.choose(FAST), FAST, "x")
    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: fast)
    most = max(probe.QUANTIZED_ROWS)
    blocks = {**ROWS_MEASURED, "blocks": dict.fromkeys(probe.QUANTIZED_ROWS, 0.0)}
    monkeypatch.setattr(probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (most, blocks))
    p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
    assert (p.quantization, p.quantized_rows, p.gguf_blocks) == ("gguf", 0, True)
    assert f"every size up to {most} rows: no bf16 copies" in p.reason
    assert (p.dtype, p.kv) == (torch.float32, torch.float16) and "float32 between them" in p.describe()
    monkeypatch.setattr(
        probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (most // 2, blocks)
    )
    p = precision.resolve_precision(spec, config, torch.device("cpu"), 1)
    assert (p.quantization, p.quantized_rows) == ("gguf+bf16", most // 2)


def test_a_by_rows_linear_runs_few_rows_on_one_kernel_and_more_on_the_other():
    from tokenrouter.engine.quant.by_rows import ByRowsLinear

    calls = []

    class Kernel(torch.nn.Linear):
        def forward(self, x):
            calls.append((self.name, x.shape[:-1]))
            return super().forward(x)

    few, many = Kernel(8, 4), Kernel(8, 4)
    few.name, many.name = "few", "many"
    layer = ByRowsLinear(few, many, max_few_rows=2)
    assert layer.weight is many.weight and (layer.in_features, layer.out_features) == (8, 4)
    layer(torch.randn(1, 2, 8))
    layer(torch.randn(3, 8))
    layer(torch.randn(1, 1, 8))
    assert calls == [("few", (1, 2)), ("many", (3,)), ("few", (1, 1))]


def _prompt_logprobs_hf(path, prompt, dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return lp[:-1].gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)


async def _prompt_logprobs_engine(spec, prompt) -> tuple[torch.Tensor, object]:
    async with Engine(models={"m": spec}, num_threads=1) as e:
        out = await e.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
        return torch.tensor([r.logprob for r in out.prompt_logprobs[1:]]), e.info().models["m"]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_bf16_engine_matches_transformers_in_bf16(tmp_path, tokenizer, arch):
    """On oneDNN's packed kernels, or torch's own where its bf16 ops do not run at this CPU level."""
    path = build_tiny_model(tmp_path / arch, arch, tokenizer=tokenizer)
    prompt = [(7 * i + 3) % 300 + 3 for i in range(40)]
    got, loaded = anyio.run(_prompt_logprobs_engine, ModelSpec(path=path, dtype="bfloat16"), prompt)
    assert loaded.dtype == torch.bfloat16 and loaded.linear_kernel == ("onednn" if torch_bf16_runs() else "torch")
    want = _prompt_logprobs_hf(path, prompt, torch.bfloat16)
    assert (got - want).abs().max() < 0.15 and (got - want).abs().mean() < 0.04
    exact = _prompt_logprobs_hf(path, prompt, torch.float32)
    assert 0 < (got - exact).abs().max() <= 1.5 * (want - exact).abs().max() + 0.02  # bf16, as good as theirs


def test_the_block_kernels_are_weighed_against_torchs_kernel_for_the_models_type():
    """A Q8_0 model's alternative to the block kernels is torch's int8 kernel, not its 4-bit one
    (which would never compute it): the 0.5B requantized to Q8_0 took int8 for a 4-bit timing."""
    assert probe.torch_kernel_for("Q4_K") == ("int4", 4) and probe.torch_kernel_for("Q8_0") == ("int8", 8)
    q8 = {"bfloat16": {1: 2.0}, "int8": {1: 0.9}, "blocks": {1: 0.8}}
    assert probe.few_kernel(q8) == "blocks"
    assert probe.few_kernel({**q8, "int8": {1: 0.5}}) == "int8"


def test_deterministic_holds_no_bf16_copies_where_auto_would(monkeypatch, tmp_path, bf16_cpu):
    """With bf16 fast and the rows probe finding bf16 copies faster for big steps, "auto" holds
    them (a second kernel by the step's rows); deterministic=True resolves as "gguf": one kernel
    at every size."""
    from transformers import AutoConfig

    path = build_tiny_model(tmp_path / "m", "qwen2")
    config = AutoConfig.from_pretrained(path)
    monkeypatch.setattr(probe, "quantized_rows", lambda shape, threads, kind=None, dense="bfloat16": (2, ROWS_MEASURED))
    monkeypatch.setattr(probe, "precision_for", lambda *a, **k: probe.PrecisionChoice(*probe.choose(FAST), FAST, "x"))
    cpu = torch.device("cpu")
    auto = precision.resolve_precision(ModelSpec(path=path), config, cpu, 1, gguf_kind="Q4_K")
    assert (auto.quantization, auto.quantized_rows) == ("gguf+bf16", 2)
    held = precision.resolve_precision(ModelSpec(path=path, deterministic=True), config, cpu, 1, gguf_kind="Q4_K")
    assert held.quantization == "gguf" and not held.quantized_rows, held
