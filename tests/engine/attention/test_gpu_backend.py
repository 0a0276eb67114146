"""The GPU path: flashinfer's paged attention, CUDA graphs of decode steps, several models on one GPU.

What runs here on CPU checks the parts that do not need CUDA: the paged layout flashinfer plans
from (it must describe exactly the attention the torch backend computes), the padding of decode
steps to a captured size (the padded rows must not change the real rows' logits or KV), the
backend choice and its errors, and the flashinfer backend's own logic over flashinfer 0.7.4's
contract fake (tokenrouter/testing/flashinfer_fake.py). The tests marked `gpu` run the kernels and
graphs themselves: page sizes 4 and 16, a prefill row over 64 tokens (FA3 on Hopper under "auto"),
and the engine on CUDA with torch's attention and no flashinfer at all.
"""

from __future__ import annotations

import os
import random
import sys

import anyio
import pytest
import torch

from tests.engine.attention.test_flashinfer_contract import reference_attention
from tests.helpers import generate_all, holds_nothing
from tokenrouter import Engine, ModelSpec, RStitch, SamplingParams, Single
from tokenrouter.engine import Request, ScheduledBatch, SeqStatus, Sequence
from tokenrouter.engine.attention import cpu_paged
from tokenrouter.engine.attention.choice import AttentionChoice, attention_choice, choose_attention_backend
from tokenrouter.engine.attention.flashinfer_paged import import_flashinfer
from tokenrouter.engine.attention.paged_layout import PagedLayout
from tokenrouter.engine.attention.torch_paged import TorchPagedAttention
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.engine.model import ModelRunner, load_model
from tokenrouter.engine.model.cuda_graph import graph_batch_sizes, pad_decode
from tokenrouter.errors import ModelLoadError
from tokenrouter.testing.flashinfer_fake import FakeFlashInfer

BS = 4  # block size: small, so rows span several pages and partial last pages


def _seq(i: int, n: int, vocab: int, rng: random.Random) -> Sequence:
    ids = [rng.randrange(5, vocab) for _ in range(n)]
    req = Request(f"r{i}", ids, SamplingParams(), seed=0, stop_token_ids=frozenset(), max_tokens=8)
    return Sequence(req, list(ids), status=SeqStatus.RUNNING)


class _Pool:
    """Hands out blocks in a shuffled order, so block tables are not contiguous."""

    def __init__(self, num_blocks: int, rng: random.Random, block_size: int = BS):
        self.free = list(range(num_blocks))
        self.block_size = block_size
        rng.shuffle(self.free)

    def grow(self, seq: Sequence, tokens: int) -> None:
        while len(seq.block_table) * self.block_size < tokens:
            seq.block_table.append(self.free.pop())


def _runner(path, dtype=torch.float64, device="cpu", blocks=64, extra_blocks=0, block_size=BS):
    name = "float64" if dtype == torch.float64 else "float32"
    loaded = load_model("m", ModelSpec(path=path, dtype=name, device=device))
    layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
    cache = KVCache(layout, blocks + extra_blocks, block_size, loaded.device)
    return ModelRunner(loaded, TorchPagedAttention(cache), block_size), cache


def _mixed_step(runner, rng, long_prefill=0):
    """Prefill 6 sequences, then a step mixing 3 decode rows with 3 extend rows (cached prefix +
    several new tokens), and a new row of `long_prefill` tokens if any; returns that step's batch."""
    vocab = runner.loaded.vocab_size
    pool = _Pool(64, rng, runner.block_size)
    seqs = [_seq(i, n, vocab, rng) for i, n in enumerate([9, 4, 13, 6, 11, 8])]
    for s in seqs:
        pool.grow(s, len(s.token_ids))
    runner.forward(ScheduledBatch(seqs, [len(s.token_ids) for s in seqs], 0))
    for s in seqs:
        s.num_computed = len(s.token_ids)
    for s, extra in zip(seqs, [1, 1, 1, 3, 5, 2]):
        s.token_ids += [rng.randrange(5, vocab) for _ in range(extra)]
        pool.grow(s, len(s.token_ids))
    if long_prefill:
        seqs.append(_seq(6, long_prefill, vocab, rng))
        pool.grow(seqs[-1], long_prefill)
    return ScheduledBatch(seqs, [len(s.token_ids) - s.num_computed for s in seqs], 3)


def _reference_attention(q, k, v, k_cache, v_cache, layout: PagedLayout, scaling, window):
    """Attention computed from the paged layout alone: K/V appended at layout.slots(), then each
    row read from its pages (a HF sliding window w keeps keys less than w positions back)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    slots = layout.slots()
    k_cache[slots], v_cache[slots] = k, v
    pages = (-1, layout.page_size, *k.shape[1:])
    return reference_attention(
        q,
        k_cache.view(pages),
        v_cache.view(pages),
        layout.qo_indptr,
        layout.kv_indptr,
        layout.kv_indices,
        layout.kv_last_page_len,
        window - 1 if window else -1,
        scaling,
    )


@pytest.mark.parametrize("window", [None, 5])
def test_paged_layout_describes_the_torch_backends_attention(tiny_model, window):
    rng = random.Random(0)
    runner, cache = _runner(tiny_model)
    batch = _mixed_step(runner, rng)
    meta = runner.prepare(batch).meta
    layout = PagedLayout.from_metadata(meta)
    assert torch.equal(layout.slots(), meta.slot_mapping)
    assert layout.qo_indptr.tolist() == [0, 1, 2, 3, 6, 11, 13]
    new_positions = [list(range(s.num_computed, len(s.token_ids))) for s in batch.seqs]
    assert layout.positions.tolist() == sum(new_positions, [])

    lay = cache.layout
    torch.manual_seed(0)
    heads = lay.num_kv_heads * 2
    q = torch.randn(len(meta.slot_mapping), heads, lay.head_dim, dtype=torch.float64)
    k = torch.randn(len(meta.slot_mapping), lay.num_kv_heads, lay.head_dim, dtype=torch.float64)
    v = torch.randn_like(k)
    expected = _reference_attention(q, k, v, cache.k[0], cache.v[0], layout, 0.3, window)
    got = TorchPagedAttention(cache).forward(0, q, k, v, meta, 0.3, window)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)

    # rows() describes a slice of the rows as a batch of its own
    tail = layout.rows(3, 6)
    assert tail.qo_indptr.tolist() == [0, 3, 8, 10]
    assert torch.equal(tail.slots(), meta.slot_mapping[3:])
    head = layout.rows(0, 3)
    assert torch.equal(head.slots(), meta.slot_mapping[:3])


def test_paged_layout_rejects_a_short_block_table():
    with pytest.raises(ValueError, match="2 pages has a block table of 1"):
        PagedLayout.build([1], [5], [[7]], page_size=4)


def test_graph_batch_sizes():
    assert graph_batch_sizes(0) == []
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(6) == [1, 2, 4, 6]
    assert graph_batch_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert graph_batch_sizes(36) == [1, 2, 4, 8, 16, 24, 32, 36]


def test_padding_a_decode_step_leaves_real_rows_and_their_cache_unchanged(tiny_model):
    """What a CUDA-graph replay computes, run eagerly: the padded rows touch only the scratch block."""
    rng = random.Random(1)
    runner, cache = _runner(tiny_model, extra_blocks=1)
    scratch = cache.num_blocks - 1
    batch = _mixed_step(runner, rng)
    decode = ScheduledBatch(batch.seqs[:3], [1, 1, 1], 3)
    step = runner.prepare(decode)
    ids, pos, meta = step.input_ids, step.positions, step.meta
    before_k = [t.clone() for t in cache.k]

    runner.backend.plan(meta)
    eager, _ = runner.run_model(ids, pos, meta, keep=0)
    after_eager = [t.clone() for t in cache.k]
    for size in (3, 4, 8):
        pids, ppos, padded = pad_decode(ids, pos, meta, size, scratch)
        assert padded.num_decode == size and padded.block_tables[3:] == [[scratch]] * (size - 3)
        runner.backend.plan(padded)
        logits, _ = runner.run_model(pids, ppos, padded, keep=0)
        assert logits.shape[0] == size
        torch.testing.assert_close(logits[:3], eager, rtol=1e-12, atol=1e-12)
        not_scratch = slice(0, scratch * BS)  # (the real rows rewrite their own K, equal to rounding)
        for a, b in zip(cache.k, after_eager):
            torch.testing.assert_close(a[not_scratch], b[not_scratch], rtol=1e-12, atol=1e-12)
    assert any(not torch.equal(a, b) for a, b in zip(after_eager, before_k))  # the real rows did write


def test_attention_backend_choice_on_cpu(tiny_model, monkeypatch):
    spec = ModelSpec(path=tiny_model)
    want = "cpu" if cpu_paged.load()[0] is not None else "torch"  # our C kernel, where it builds
    assert choose_attention_backend(spec, torch.device("cpu"), torch.float32, 64) == want
    assert choose_attention_backend(spec, torch.device("cpu"), torch.float16, 64) == "torch"
    torch_asked = ModelSpec(path=tiny_model, attention_backend="torch")
    assert choose_attention_backend(torch_asked, torch.device("cpu"), torch.float32, 64) == "torch"
    cpu_asked = ModelSpec(path=tiny_model, attention_backend="cpu")
    with pytest.raises(ModelLoadError, match="attention_backend='cpu'.*runs on CPU, not cuda"):
        choose_attention_backend(cpu_asked, torch.device("cuda"), torch.bfloat16, 64)
    monkeypatch.setattr(cpu_paged, "load", lambda home=None: (None, "no C compiler (cc or gcc) on PATH"))
    assert attention_choice(spec, torch.device("cpu"), torch.bfloat16, 64) == AttentionChoice(
        "torch", fallback="no C compiler (cc or gcc) on PATH"
    )
    with pytest.raises(ModelLoadError, match="attention_backend='cpu'.*no C compiler"):
        choose_attention_backend(cpu_asked, torch.device("cpu"), torch.bfloat16, 64)
    forced = ModelSpec(path=tiny_model, attention_backend="flashinfer")
    with pytest.raises(ModelLoadError, match="attention_backend='flashinfer'.*CUDA devices, not cpu"):
        choose_attention_backend(forced, torch.device("cpu"), torch.bfloat16, 64)
    with pytest.raises(ValueError, match="attention_backend"):
        ModelSpec(path=tiny_model, attention_backend="triton")
    with pytest.raises(ValueError, match="cuda_graph_max_batch"):
        ModelSpec(path=tiny_model, cuda_graph_max_batch=-1)


def test_engine_on_cpu_reports_its_backend_and_no_graphs(tiny_model):
    async def main():
        async with Engine(models={"m": tiny_model}, policy=Single("m")) as engine:
            await engine.generate("hello", SamplingParams(max_tokens=2, temperature=0))
            return engine.stats()["m"]

    stats = anyio.run(main)
    want = "cpu" if cpu_paged.load()[0] is not None else "torch"
    assert stats.attention_backend == want and stats.cuda_graph_batch_sizes == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_cuda_device_without_cuda_fails_at_start_naming_the_device(tiny_model):
    async def main():
        async with Engine(models={"m": ModelSpec(path=tiny_model, device="cuda:0")}, policy=Single("m")):
            pass

    with pytest.raises(ModelLoadError, match="device='cuda:0'.*no CUDA device"):
        anyio.run(main)


# ---- the flashinfer backend's own logic, on CPU ----------------------------------------------
@pytest.fixture
def flashinfer_fake(monkeypatch):
    """flashinfer 0.7.4's contract fake (tokenrouter/testing/flashinfer_fake.py) in place of the library:
    its documented semantics in plain torch, and its checks, on CPU. The kernels themselves are
    checked against the torch backend by the `gpu` tests below."""
    from tokenrouter.engine.attention import flashinfer_paged as flashinfer_attention

    lib = FakeFlashInfer()
    monkeypatch.setattr(flashinfer_attention, "import_flashinfer", lambda: lib)
    return lib


@pytest.mark.parametrize("window", [None, 5])
def test_flashinfer_backend_logic_equals_the_torch_backend(tiny_model, flashinfer_fake, window):
    """A mixed step through the flashinfer backend, two layer kinds planned lazily, equals the torch backend."""
    from tokenrouter.engine.attention import FlashInferPagedAttention

    runner, cache = _runner(tiny_model)
    batch = _mixed_step(runner, random.Random(4))
    meta = runner.prepare(batch).meta
    lay = cache.layout
    torch.manual_seed(1)
    heads = lay.num_kv_heads * 2
    ntok = len(meta.slot_mapping)
    fi_cache = KVCache(lay, cache.num_blocks, BS, "cpu")
    for dst, src in zip(fi_cache.k + fi_cache.v, cache.k + cache.v):
        dst.copy_(src)
    fi = FlashInferPagedAttention(fi_cache, heads, torch.device("cpu"))
    fi.plan(meta)
    for layer in range(lay.num_layers):
        q = torch.randn(ntok, heads, lay.head_dim, dtype=torch.float64)
        k = torch.randn(ntok, lay.num_kv_heads, lay.head_dim, dtype=torch.float64)
        v = torch.randn_like(k)
        w = window if layer == 0 else None  # a second layer kind, planned when first seen
        expected = TorchPagedAttention(cache).forward(layer, q, k, v, meta, 0.3, w)
        got = fi.forward(layer, q.transpose(0, 1).contiguous().transpose(0, 1), k, v, meta, 0.3, w)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(fi_cache.k[layer], cache.k[layer], rtol=0, atol=0)
    assert set(fi.keys) == {(window - 1 if window else -1, 0.3), (-1, 0.3)}


def test_flashinfer_backend_graph_mode_reads_the_step_from_its_buffers(tiny_model, flashinfer_fake):
    """What a capture and replay do, the fake standing in for the capture: plan a padded decode
    step into a graph size's fixed buffers, warm up (planning every layer kind), plan again and run
    "captured" (no plan then, only graph wrappers); the real rows equal an eager step."""
    from tokenrouter.engine.attention import FlashInferPagedAttention

    runner, cache = _runner(tiny_model, extra_blocks=1)
    scratch = cache.num_blocks - 1
    batch = _mixed_step(runner, random.Random(5))
    eager = FlashInferPagedAttention(cache, 4, torch.device("cpu"))
    runner.backend = eager
    decode = ScheduledBatch(batch.seqs[:3], [1, 1, 1], 3)
    step = runner.prepare(decode)
    ids, pos, meta = step.input_ids, step.positions, step.meta
    eager.plan(meta)
    expected, _ = runner.run_model(ids, pos, meta, keep=0)
    graphed = FlashInferPagedAttention(cache, 4, torch.device("cpu"))
    runner.backend = graphed
    for size in (8, 4):
        pids, ppos, padded = pad_decode(ids, pos, meta, size, scratch)
        graphed.use_graph(size, max_pages_per_row=16)
        graphed.plan(padded)
        runner.run_model(pids, ppos, padded, keep=0)  # the warm-up
        graphed.plan(padded)
        with flashinfer_fake.capture():
            got, _ = runner.run_model(pids, ppos, padded, keep=0)
        graphed.use_graph(None)
        torch.testing.assert_close(got[:3], expected, rtol=1e-10, atol=1e-10)
    assert sorted(graphed.graph_buffers) == [4, 8] and graphed.graph is None
    with pytest.raises(AssertionError, match="pure-decode steps of its size"):
        graphed.use_graph(8, max_pages_per_row=16)
        graphed.plan(meta)  # 3 rows are not a graph of 8


# ---- on a CUDA GPU with flashinfer ----------------------------------------------------------
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or import_flashinfer() is None, reason="needs a CUDA GPU and flashinfer"
)


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory, tokenizer):
    """A bfloat16 pair with head_dim 64 (a size flashinfer's kernels take)."""
    from tokenrouter.testing import build_tiny_model

    root = tmp_path_factory.mktemp("gpu")
    shape = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 512}
    common = dict(dtype=torch.bfloat16, tokenizer=tokenizer, logit_scale=3.0, **shape)
    small = build_tiny_model(root / "s", "qwen2", seed=1, **common)
    large = build_tiny_model(root / "l", "qwen2", seed=2, num_hidden_layers=3, **common)
    return {"small": small, "large": large}


@pytest.fixture
def prefill_backend():
    """flashinfer's prefill kernels for the gpu tests: TOKENROUTER_PREFILL_BACKEND (the GPU kit sets
    "fa2" when FA3 did not build), else "auto"."""

    return os.environ.get("TOKENROUTER_PREFILL_BACKEND", "auto")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(
    "window, block_size, long_prefill",
    # a row of 80 new tokens: flashinfer 0.7.4's "auto" runs FA3 on Hopper for steps with a row over 64
    # (no window there: FA3 with a window is a module the GPU kit does not build)
    [(None, 4, 0), (5, 4, 0), (None, 16, 0), (5, 16, 0), (None, 4, 80), (None, 16, 80)],
)
def test_flashinfer_equals_the_torch_backend(gpu_pair, window, block_size, long_prefill, prefill_backend):
    from tokenrouter.engine.attention import FlashInferPagedAttention

    rng = random.Random(2)
    runner, cache = _runner(gpu_pair["small"], dtype=torch.float32, device="cuda", block_size=block_size)
    batch = _mixed_step(runner, rng, long_prefill)
    assert max(batch.num_new) == max(long_prefill, 5)
    meta = runner.prepare(batch).meta
    lay = cache.layout
    torch.manual_seed(0)
    q = torch.randn(len(meta.slot_mapping), 4, lay.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(len(meta.slot_mapping), lay.num_kv_heads, lay.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    bf16_layout = KVLayout(lay.num_layers, lay.num_kv_heads, lay.head_dim, torch.bfloat16)
    bf16 = KVCache(bf16_layout, cache.num_blocks, block_size, "cuda")
    reference = TorchPagedAttention(bf16).forward(0, q, k, v, meta, 0.125, window)
    bf16.k[0].zero_()
    bf16.v[0].zero_()
    fi = FlashInferPagedAttention(bf16, 4, torch.device("cuda"), prefill_backend)
    fi.plan(meta)
    got = fi.forward(0, q, k, v, meta, 0.125, window)
    torch.testing.assert_close(got.float(), reference.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(bf16.k[0][meta.slot_mapping], k)  # flashinfer's append wrote the new K


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("block_size", [BS, 16])
def test_cuda_graph_replay_equals_eager(gpu_pair, block_size, prefill_backend):
    """Replaying a captured decode step (padded to the next size) gives the eager step's logits, to
    bf16 rounding: flashinfer's graph kernels split the KV differently, so not bit for bit."""
    from tokenrouter.engine.attention import FlashInferPagedAttention
    from tokenrouter.engine.model.cuda_graph import DecodeGraphs

    rng = random.Random(3)
    spec = ModelSpec(path=gpu_pair["small"], device="cuda", dtype="bfloat16", prefill_backend=prefill_backend)
    loaded = load_model("m", spec)
    layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
    cache = KVCache(layout, 65, block_size, loaded.device)  # block 64: the scratch block
    backend = FlashInferPagedAttention(cache, loaded.model.config.num_attention_heads, loaded.device, prefill_backend)
    runner = ModelRunner(loaded, backend, block_size)
    graphs = DecodeGraphs(
        runner.run_model,
        backend,
        runner.device,
        runner.block_size,
        max_batch=8,
        scratch_block=64,
        max_pages_per_row=128,
    )
    graphs.capture()
    batch = _mixed_step(runner, rng)
    decode = ScheduledBatch(batch.seqs[:3], [1, 1, 1], 3)
    with torch.inference_mode():
        eager = runner.forward(decode).logits.float()
        runner.graphs = graphs
        assert graphs.fits(3, 3) and not graphs.fits(9, 9) and not graphs.fits(4, 3)
        replayed = runner.forward(decode).logits.float()  # replays the graph of 4 rows
    assert replayed.shape == eager.shape == (3, loaded.vocab_size)
    torch.testing.assert_close(replayed, eager, rtol=3e-2, atol=3e-2)
    assert (replayed.argmax(-1) == eager.argmax(-1)).float().mean() >= 2 / 3


@pytest.mark.gpu
@needs_gpu
def test_engine_with_cuda_graphs_serves_and_frees_everything(gpu_pair, prefill_backend):
    spec = ModelSpec(path=gpu_pair["small"], device="cuda", cuda_graph_max_batch=8, prefill_backend=prefill_backend)

    async def main():
        async with Engine(models={"m": spec}, policy=Single("m")) as engine:
            stats = engine.stats()["m"]
            assert stats.attention_backend == "flashinfer"
            assert stats.cuda_graph_batch_sizes == [1, 2, 4, 8]
            prompts = [f"prompt {i} " * (i + 1) for i in range(12)]
            res = await generate_all(engine, prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
            assert all(r.error is None and len(r.token_ids) == 12 for r in res)
            assert holds_nothing(engine)

    anyio.run(main)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_engine_on_cuda_with_the_torch_backend_needs_no_flashinfer(gpu_pair, prefill_backend, monkeypatch):
    """attention_backend="torch" on a GPU: the fallback when flashinfer is missing or broken."""
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # `import flashinfer` raises ImportError
    spec = ModelSpec(path=gpu_pair["small"], device="cuda", attention_backend="torch", prefill_backend=prefill_backend)

    async def main():
        async with Engine(models={"m": spec}, policy=Single("m")) as engine:
            prompts = [f"prompt {i} " * (i + 1) for i in range(6)]
            res = await generate_all(engine, prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
            assert all(r.error is None and len(r.token_ids) == 8 for r in res)
            assert holds_nothing(engine)
            return engine.stats()["m"]

    stats = anyio.run(main)
    # asked for by name, torch's backend is what runs (the C kernel is a CPU backend: never on CUDA)
    assert stats.attention_backend == "torch" and stats.cuda_graph_batch_sizes == []


@pytest.mark.gpu
@needs_gpu
def test_two_models_on_one_gpu_route_and_free_everything(gpu_pair, prefill_backend):
    specs = {
        name: ModelSpec(path=p, device="cuda:0", kv_cache_tokens=4096, prefill_backend=prefill_backend)
        for name, p in gpu_pair.items()
    }

    async def main():
        async with Engine(models=specs, policy=RStitch(tau=0.2, small="small", large="large")) as engine:
            params = SamplingParams(max_tokens=24, temperature=0)
            res = await generate_all(engine, [f"question {i}" for i in range(16)], params)
            assert all(r.error is None for r in res)
            assert {m for r in res for m in r.token_models} == {"small", "large"}
            assert holds_nothing(engine)
            return engine.stats()

    stats = anyio.run(main)
    assert stats["small"].attention_backend == stats["large"].attention_backend == "flashinfer"
