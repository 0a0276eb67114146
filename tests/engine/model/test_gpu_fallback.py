"""The GPU path's fallbacks and orderings, decided on CPU: flashinfer that fails to import or fails
its load-time self-test leaves `attention_backend="auto"` on torch's backend (and fails the load
when asked for by name), `prefill_backend` reaches flashinfer's prefill wrapper, a failed CUDA-graph
capture is reported with its reason, float32 checkpoints compute in half precision on a GPU, each
wrapper's plan waits for its previous plan's copy, a step's indices reach the device in one copy,
and a step's pieces (its paged layout, the padding of a decode step, the backend's plan and a
layer's attention, eager and for a graph) sync with the host no more than that.

flashinfer here is its 0.7.4 contract fake (tokenrouter/testing/flashinfer_fake.py), which computes
paged attention in plain torch, so the backend's self-test computes and checks real answers on CPU;
the failing kernels are that fake with a failure added. The device is the stand-in accelerator
(tokenrouter/testing/accelerator.py): tensors that hold CPU data, whose uploads and host reads are
counted, so a step's values are compared with the CPU's and its host syncs are pinned.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import inspect
import logging
import random
import sys

import anyio
import pytest
import torch

from tests.helpers import generate_all
from tokenrouter import Engine, ModelSpec, SamplingParams, Single
from tokenrouter.engine import Request, ScheduledBatch, SeqStatus, Sequence
from tokenrouter.engine.attention import FlashInferPagedAttention, flashinfer_paged
from tokenrouter.engine.attention import choice as attention_choice_module
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.engine.model import ModelRunner, load_model
from tokenrouter.engine.model.cuda_graph import DecodeGraphs
from tokenrouter.engine.quant import precision
from tokenrouter.errors import ModelLoadError
from tokenrouter.testing.accelerator import StandInAccelerator
from tokenrouter.testing.flashinfer_fake import FakeFlashInfer

LIBCUDART = "libcudart.so.13: cannot open shared object file: No such file or directory"
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"


# ---- flashinfer that fails as a GPU without its build fails -----------------------------------
DECODE, PREFILL = "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"


class BrokenFlashInfer(FakeFlashInfer):
    """The contract fake with failing kernels: `raises` names the wrapper whose run() raises as on a
    GPU its build has no kernels for (once 0.7.4's checks pass and the call is recorded); `wrong`
    makes every run() return zeros."""

    def __init__(self, raises: str | None = None, wrong: bool = False):
        super().__init__()
        for name in (DECODE, PREFILL):
            setattr(self, name, _failing(getattr(self, name), raises=name == raises, wrong=wrong))


def _failing(wrapper: type, raises: bool, wrong: bool) -> type:
    def run(self, *args, **kwargs):
        out = wrapper.run(self, *args, **kwargs)
        if raises:
            raise RuntimeError(NO_KERNEL)
        return out.zero_() if wrong else out

    return type(wrapper.__name__, (wrapper,), {"run": run})


def _runs(lib: FakeFlashInfer) -> list[tuple[str, int]]:
    """(wrapper, query rows) of each run() made, in order."""
    return [(c.name.removesuffix(".run"), c.args[0].shape[0]) for c in lib.calls if c.name.endswith(".run")]


@pytest.fixture
def flashinfer_here(monkeypatch):
    """flashinfer "supported" on this CPU, served by a fake; returns a function that installs one."""
    monkeypatch.setattr(attention_choice_module, "unsupported_reason", lambda device, dtype, head_dim: None)

    def install(lib: FakeFlashInfer) -> FakeFlashInfer:
        monkeypatch.setattr(flashinfer_paged, "import_flashinfer", lambda: lib)
        return lib

    return install


def _serve(spec: ModelSpec):
    async def main():
        async with Engine(models={"m": spec}, policy=Single("m")) as engine:
            res = await generate_all(engine, ["hello there", "a b c"], SamplingParams(max_tokens=3, temperature=0))
            return res, engine.stats()["m"]

    return anyio.run(main)


# ---- flashinfer that will not import --------------------------------------------------------
class _BrokenFlashInfer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "flashinfer":
            raise OSError(LIBCUDART)
        return None


def test_flashinfer_that_raises_oserror_on_import_leaves_auto_on_torch(tiny_model, monkeypatch, caplog):
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenFlashInfer(), *sys.meta_path])
    assert flashinfer_paged.import_flashinfer() is None  # the gpu tests' skip condition, at collection
    assert flashinfer_paged.import_problem() == f"flashinfer failed to import: OSError: {LIBCUDART}"
    from tokenrouter.engine.attention import attention_choice

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on the GPU machine
    cuda, spec = torch.device("cuda:0"), ModelSpec(path=tiny_model)
    with caplog.at_level(logging.WARNING):
        chosen = attention_choice(spec, cuda, torch.bfloat16, 64)
    assert chosen.name == "torch" and chosen.fallback == f"flashinfer failed to import: OSError: {LIBCUDART}"
    assert LIBCUDART in caplog.text
    forced = ModelSpec(path=tiny_model, attention_backend="flashinfer")
    with pytest.raises(ModelLoadError, match=f"attention_backend='flashinfer'.*failed to import: OSError: {LIBCUDART}"):
        attention_choice(forced, cuda, torch.bfloat16, 64)
    # on CPU nothing falls back: flashinfer was never a candidate
    assert attention_choice(spec, torch.device("cpu"), torch.float32, 64).fallback is None


# ---- the load-time self-test ----------------------------------------------------------------
def test_a_kernel_that_raises_in_the_self_test_leaves_auto_on_torch(tiny_model, flashinfer_here, caplog):
    lib = flashinfer_here(BrokenFlashInfer(raises=PREFILL))
    with caplog.at_level(logging.WARNING):
        res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=4))
    assert all(r.error is None and len(r.token_ids) == 3 for r in res)
    assert stats.attention_backend == "torch" and stats.cuda_graph_batch_sizes == []
    assert stats.attention_fallback == f"flashinfer's load-time self-test failed: RuntimeError: {NO_KERNEL}"
    assert any(r.exc_info is not None and NO_KERNEL in r.getMessage() for r in caplog.records)
    assert (PREFILL, 8) in _runs(lib)  # the self-test ran the kernel that failed

    with pytest.raises(ModelLoadError, match=f"attention_backend='flashinfer'.*self-test failed.*{NO_KERNEL}"):
        _serve(ModelSpec(path=tiny_model, attention_backend="flashinfer"))


def test_the_self_test_catches_kernels_that_compute_wrong_attention(tiny_model, flashinfer_here):
    flashinfer_here(BrokenFlashInfer(wrong=True))
    res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=0))
    assert all(r.error is None for r in res)
    assert stats.attention_backend == "torch" and "computed wrong attention" in stats.attention_fallback


def test_kernels_that_pass_the_self_test_serve(tiny_model, flashinfer_here):
    lib = flashinfer_here(FakeFlashInfer())
    res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=0))
    assert all(r.error is None and len(r.token_ids) == 3 for r in res)
    assert stats.attention_backend == "flashinfer" and stats.attention_fallback is None
    # the self-test: a decode row beside a short prefill row, then a prefill row past the 64 tokens
    # up to which 0.7.4's "auto" runs FA2; then the requests
    assert _runs(lib)[:3] == [(DECODE, 1), (PREFILL, 8), (PREFILL, 72)]
    assert len(_runs(lib)) > 3


def test_the_self_test_writes_only_the_scratch_block_and_leaves_the_backend_as_new(tiny_model, flashinfer_here):
    flashinfer_here(FakeFlashInfer())
    loaded = load_model("m", ModelSpec(path=tiny_model, dtype="float64"))
    layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
    cache = KVCache(layout, 9, 4, "cpu")
    backend = FlashInferPagedAttention(cache, loaded.model.config.num_attention_heads, torch.device("cpu"))
    backend.self_test(scratch_block=8)
    pages = cache.k[0].view(9, 4, -1)
    assert pages[:8].abs().sum() == 0 and pages[8].abs().sum() > 0
    assert backend.keys == [] and all(c.abs().sum() == 0 for c in cache.k[1:])


# ---- prefill_backend ------------------------------------------------------------------------
def test_prefill_backend_is_validated_and_reaches_flashinfers_prefill_wrapper(tiny_model, flashinfer_here):
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="prefill_backend") as e:
        ModelSpec(path=tiny_model, prefill_backend="fa4")
    assert "'auto', 'fa2' or 'fa3'" in str(e.value)
    assert ModelSpec(path=tiny_model).prefill_backend == "auto"

    lib = flashinfer_here(FakeFlashInfer())
    _, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=0, prefill_backend="fa2"))
    assert stats.attention_backend == "flashinfer"
    made_with = inspect.signature(lib.BatchPrefillWithPagedKVCacheWrapper)  # 0.7.4's constructor
    made = [
        made_with.bind(*c.args, **c.kwargs).arguments.get("backend", "auto") for c in lib.calls if c.name == PREFILL
    ]
    assert made and set(made) == {"fa2"}


# ---- CUDA-graph capture ---------------------------------------------------------------------
def test_a_failed_capture_is_logged_with_its_traceback_and_reported(tiny_model, flashinfer_here, monkeypatch, caplog):
    flashinfer_here(FakeFlashInfer())

    def capture(self):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(DecodeGraphs, "capture", capture)
    with caplog.at_level(logging.WARNING):
        res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=4))
    assert all(r.error is None for r in res)  # decode steps run eagerly
    assert stats.attention_backend == "flashinfer" and stats.cuda_graph_batch_sizes == []
    assert stats.cuda_graph_error == "RuntimeError: operation not permitted when stream is capturing"
    failed = [r for r in caplog.records if "CUDA graph capture failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None and failed[0].exc_info[0] is RuntimeError


def test_no_capture_no_capture_error(tiny_model):
    _, stats = _serve(ModelSpec(path=tiny_model, attention_backend="torch"))
    assert stats.attention_backend == "torch" and stats.cuda_graph_error is None and stats.attention_fallback is None


# ---- float32 checkpoints on a GPU -----------------------------------------------------------
def test_dtype_auto_on_a_gpu_computes_in_half_precision(tiny_model, tmp_path, caplog):
    from transformers import AutoConfig

    from tokenrouter.testing import build_tiny_model

    bf16, fp16 = torch.bfloat16, torch.float16
    float32 = build_tiny_model(tmp_path / "f32", "qwen2", dtype=torch.float32)
    for path, stored in ((float32, "float32"), (tiny_model, "float64")):
        with caplog.at_level(logging.INFO, logger=precision.__name__):
            p = precision.resolve_precision(
                ModelSpec(path=path), AutoConfig.from_pretrained(path), torch.device("cuda"), 1
            )
        assert p.dtype == bf16 and f"the {stored} checkpoint mapped to bfloat16" in p.describe()
        assert f"the {stored} checkpoint computes in bfloat16 on cuda" in caplog.text
        caplog.clear()
        assert p.dtype in flashinfer_paged.SUPPORTED_DTYPES  # flashinfer serves it, not silently torch's backend
    asked = precision.resolve_precision(
        ModelSpec(path=float32, dtype="float32"), AutoConfig.from_pretrained(float32), torch.device("cuda"), 1
    )
    assert asked.dtype == torch.float32  # asked for by name: as asked
    # the decision itself, for GPUs with and without bfloat16
    assert precision.gpu_dtype(torch.float32, bf16=True)[0] == bf16
    assert precision.gpu_dtype(torch.float64, bf16=True)[0] == bf16
    assert precision.gpu_dtype(torch.float32, bf16=False)[0] == fp16  # a GPU without bfloat16
    assert precision.gpu_dtype(None, bf16=True)[0] == bf16
    assert precision.gpu_dtype(fp16, bf16=True) == (fp16, "the checkpoint's dtype")
    assert precision.gpu_dtype(bf16, bf16=False) == (bf16, "the checkpoint's dtype")


# ---- the pinned-buffer ordering -------------------------------------------------------------
class _Event:
    """A CUDA event's stand-in: logs what is done to it, stamped with the number of flashinfer calls
    made before."""

    def __init__(self, lib: FakeFlashInfer, log: list):
        self.lib, self.log = lib, log

    def record(self):
        self.log.append((len(self.lib.calls), "record", id(self)))

    def synchronize(self):
        self.log.append((len(self.lib.calls), "synchronize", id(self)))


def _timeline(lib: FakeFlashInfer, events: list) -> list[tuple[str, int | None]]:
    """flashinfer's calls (name, None) and the events' (what, id), in the order they were made."""
    merged, e = [], 0
    for i, call in enumerate([*lib.calls, None]):
        while e < len(events) and events[e][0] <= i:
            merged.append(events[e][1:])
            e += 1
        if call is not None:
            merged.append((call.name, None))
    return merged


def _seq(i: int, n: int, rng: random.Random, block_size: int, pool: list[int]) -> Sequence:
    ids = [rng.randrange(5, 300) for _ in range(n)]
    req = Request(f"r{i}", ids, SamplingParams(), seed=0, stop_token_ids=frozenset(), max_tokens=8)
    seq = Sequence(req, list(ids), status=SeqStatus.RUNNING)
    seq.block_table = [pool.pop() for _ in range(-(-(n + 4) // block_size))]
    return seq


def test_each_wrappers_plan_waits_for_its_previous_plans_copy(flashinfer_here):
    from tokenrouter.engine.attention.flashinfer_paged import PlanFences, scratch_step

    lib = flashinfer_here(FakeFlashInfer())
    layout = KVLayout(1, 2, 16, torch.float32)
    cache = KVCache(layout, 8, 4, "cpu")
    backend = FlashInferPagedAttention(cache, 4, torch.device("cpu"))
    assert backend.fences.make_event is None  # no events off CUDA
    events: list = []
    backend.fences = PlanFences(torch.device("cpu"), make_event=lambda: _Event(lib, events))
    key = (-1, 0.25)
    backend.keys.append(key)
    for _ in range(3):
        backend.plan(scratch_step([1, 5], 1, 7, 4))
    assert [c.name for c in lib.calls if c.name in (DECODE, PREFILL)] == [DECODE, PREFILL]  # one wrapper each
    order = _timeline(lib, events)
    for w in [backend.decode_wrappers[key], backend.prefill_wrappers[key]]:
        plan, event = f"{type(w).__name__}.plan", id(backend.fences.events[id(w)])
        mine = ["plan" if what == plan else what for what, ident in order if what == plan or ident == event]
        # every plan is followed by its event's record, and every plan but the first preceded by its wait
        assert mine == ["plan", "record"] + ["synchronize", "plan", "record"] * 2


# ---- one copy a step ------------------------------------------------------------------------
BS = 4
BLOCKS = 64  # the last one is the scratch block padded decode rows use


def _runner(tiny_model) -> ModelRunner:
    return ModelRunner(load_model("m", ModelSpec(path=tiny_model, dtype="float64")), None, BS)


def _batch(lens: list[int], computed: list[int], num_new: list[int], num_decode: int) -> ScheduledBatch:
    rng, pool = random.Random(0), list(range(BLOCKS - 1))
    seqs = [_seq(i, n, rng, BS, pool) for i, n in enumerate(lens)]
    for s, c in zip(seqs, computed):
        s.num_computed = c
    return ScheduledBatch(seqs, num_new, num_decode)


def _mixed_batch() -> ScheduledBatch:
    """2 decode rows, an extend row after a cached prefix, a prefill row."""
    return _batch([9, 4, 13, 6], [8, 3, 5, 0], [1, 1, 8, 6], 2)


def _step_tensors(step) -> list:
    meta = step.meta
    return [
        step.input_ids,
        step.positions,
        step.keep,
        meta.slot_mapping,
        meta.decode_block_tables,
        meta.decode_mask,
        meta.decode_positions,
        meta.prefill_slots[0],
    ]


def _same(accel: StandInAccelerator, got: torch.Tensor, want: torch.Tensor) -> bool:
    """`got` is on the accelerator and holds `want`'s values (a host tensor)."""
    return accel.holds(got) and not accel.holds(want) and torch.equal(accel.peek(got), want)


def test_a_steps_indices_reach_the_device_in_one_copy(tiny_model):
    runner, batch, accel = _runner(tiny_model), _mixed_batch(), StandInAccelerator()
    with accel:
        with accel.syncs() as syncs:
            runner.prepare(batch)
        assert syncs.total == 0  # on CPU, the host tensors are used where they are
        runner.device = accel.device
        with accel.syncs() as syncs:
            runner.prepare(batch)
        assert (syncs.reads, syncs.uploads) == (0, 1), syncs.log

        step = runner.prepare(batch, extra_rows=[5])
        runner.device = torch.device("cpu")
        on_cpu = runner.prepare(batch, extra_rows=[5])
        assert all(_same(accel, got, want) for got, want in zip(_step_tensors(step), _step_tensors(on_cpu)))
        assert step.meta.prefill_slots[1] is None and on_cpu.meta.prefill_slots[1] is None
        assert on_cpu.keep.tolist() == [0, 1, 9, 15, 5]  # each sampled row's last token, then the extra row

        from tokenrouter.engine.attention import to_device

        host = [torch.arange(3), None, torch.ones(2, 2, dtype=torch.long)]
        with accel.syncs() as syncs:
            moved = to_device(host, accel.device)
        assert (syncs.reads, syncs.uploads) == (0, 1) and moved[1] is None
        assert _same(accel, moved[0], host[0]) and _same(accel, moved[2], host[2])


# ---- a step's pieces on the accelerator -----------------------------------------------------
def test_a_steps_paged_layout_reaches_the_device_in_one_copy(tiny_model):
    from tokenrouter.engine.attention.paged_layout import PagedLayout

    meta = _runner(tiny_model).prepare(_mixed_batch()).meta
    accel = StandInAccelerator()
    with accel:
        with accel.syncs() as syncs:
            layout = PagedLayout.from_metadata(meta, accel.device)
        assert (syncs.reads, syncs.uploads) == (0, 1), syncs.log
        on_cpu = PagedLayout.from_metadata(meta)
        fields = [f.name for f in dataclasses.fields(PagedLayout) if f.name != "page_size"]
        assert all(_same(accel, getattr(layout, f), getattr(on_cpu, f)) for f in fields)
        with accel.syncs() as syncs:
            assert layout.to(accel.device) is layout
        assert syncs.total == 0


def test_padding_a_decode_step_does_not_sync(tiny_model):
    from tokenrouter.engine.model.cuda_graph import pad_decode, scratch_decode

    runner, accel = _runner(tiny_model), StandInAccelerator()
    batch = _batch([9, 4, 13], [8, 3, 12], [1, 1, 1], 3)
    with accel:
        on_cpu = runner.prepare(batch)
        runner.device = accel.device
        step = runner.prepare(batch)
        with accel.syncs() as syncs:
            ids, pos, meta = pad_decode(step.input_ids, step.positions, step.meta, 4, BLOCKS - 1)
            scratch = scratch_decode(2, BLOCKS - 1, BS, accel.device)
        assert syncs.total == 0, syncs.log
        want_ids, want_pos, want = pad_decode(on_cpu.input_ids, on_cpu.positions, on_cpu.meta, 4, BLOCKS - 1)
        assert _same(accel, ids, want_ids) and _same(accel, pos, want_pos)
        for f in ("slot_mapping", "decode_block_tables", "decode_mask", "decode_positions"):
            assert _same(accel, getattr(meta, f), getattr(want, f)), f
        assert (meta.query_lens, meta.context_lens, meta.block_tables) == (
            want.query_lens,
            want.context_lens,
            want.block_tables,
        )
        want_scratch = scratch_decode(2, BLOCKS - 1, BS, torch.device("cpu"))
        assert _same(accel, scratch[0], want_scratch[0])
        assert _same(accel, scratch[2].decode_mask, want_scratch[2].decode_mask)


HEADS, KV_HEADS, DIM = 4, 2, 16
KEY = (-1, DIM**-0.5)  # (window_left, scale) of a layer without a sliding window


def _paged_backend(flashinfer_here, device, pages: torch.Tensor) -> FlashInferPagedAttention:
    """The flashinfer backend over its own fake and one layer's cache holding `pages` (K, V)."""
    flashinfer_here(FakeFlashInfer(check_values=False))  # its value checks read the host: not the step's
    cache = KVCache(KVLayout(1, KV_HEADS, DIM, torch.float32), BLOCKS, BS, device)
    cache.k[0].copy_(pages[0])
    cache.v[0].copy_(pages[1])
    backend = FlashInferPagedAttention(cache, HEADS, torch.device(device))
    backend.keys.append(KEY)  # a layer kind seen before: plan() plans it
    return backend


def _plans_syncs(accel: StandInAccelerator, backend: FlashInferPagedAttention) -> list:
    """(wrapper, syncs) of each wrapper's plan() from now on: flashinfer's own, apart from the engine's."""
    made, plan = [], backend.fences.plan

    def counted(wrapper, *args, **kwargs):
        with accel.syncs() as syncs:
            plan(wrapper, *args, **kwargs)
        made.append((type(wrapper).__name__, syncs))

    backend.fences.plan = counted
    return made


def _plan_and_attend(flashinfer_here, meta, graph_size: int | None = None):
    """Plans `meta` and runs one layer's attention over it on the accelerator (through a decode
    graph's buffers when `graph_size`) and eagerly on the CPU, and checks both compute the same
    attention and append the same keys. Returns the accelerator's syncs: the plan's, those of
    flashinfer's plans within it (`_plans_syncs`), the attention's."""
    gen = torch.Generator().manual_seed(0)
    tokens = sum(meta.query_lens)
    pages = torch.randn(2, BLOCKS * BS, KV_HEADS, DIM, generator=gen)
    q = torch.randn(tokens, HEADS, DIM, generator=gen)
    k, v = torch.randn(2, tokens, KV_HEADS, DIM, generator=gen)
    on_cpu = _paged_backend(flashinfer_here, "cpu", pages)
    on_cpu.plan(meta)
    want = on_cpu.forward(0, q, k, v, meta, KEY[1], None)
    accel = StandInAccelerator()
    with accel:
        backend = _paged_backend(flashinfer_here, accel.device, accel.put(pages))
        q, k, v = accel.put(q), accel.put(k), accel.put(v)
        with accel.syncs() as graph_syncs:
            backend.use_graph(graph_size, max_pages_per_row=8)
        assert graph_syncs.total == 0, graph_syncs.log  # a graph's buffers are made on the device
        plans = _plans_syncs(accel, backend)
        with accel.syncs() as planned:
            backend.plan(meta)
        with accel.syncs() as attended:
            got = backend.forward(0, q, k, v, meta, KEY[1], None)
        backend.use_graph(None)
    assert accel.holds(got) and accel.holds(backend.kv[0][0])
    torch.testing.assert_close(accel.peek(got), want)
    torch.testing.assert_close(accel.peek(backend.kv[0][0]), on_cpu.kv[0][0])  # the appended keys too
    return planned, plans, attended


def test_an_eager_steps_plan_uploads_its_layout_once_and_its_attention_does_not_sync(tiny_model, flashinfer_here):
    meta = _runner(tiny_model).prepare(_mixed_batch()).meta  # the plan reads its host lists only
    planned, plans, attended = _plan_and_attend(flashinfer_here, meta)
    assert [name for name, _ in plans] == [DECODE, PREFILL]  # one plan per wrapper
    # flashinfer's plan() moves the host index arrays it is given to the device itself: 0.7.4's
    # `.to(self.device, non_blocking=True)` of indptr, indices, last_page_len and qo_indptr
    assert all((s.reads, s.uploads) == (0, 4) for _, s in plans), [s.log for _, s in plans]
    own = (planned.reads - sum(s.reads for _, s in plans), planned.uploads - sum(s.uploads for _, s in plans))
    assert own == (0, 1), planned.log  # the engine's: the step's paged layout, in one copy
    assert attended.total == 0, attended.log


def test_a_decode_graphs_plan_uploads_its_layout_once_and_its_attention_does_not_sync(tiny_model, flashinfer_here):
    from tokenrouter.engine.model.cuda_graph import pad_decode

    step = _runner(tiny_model).prepare(_batch([9, 4, 13], [8, 3, 12], [1, 1, 1], 3))
    _, _, meta = pad_decode(step.input_ids, step.positions, step.meta, 4, BLOCKS - 1)
    planned, plans, attended = _plan_and_attend(flashinfer_here, meta, graph_size=4)
    assert [name for name, _ in plans] == [DECODE]
    # flashinfer's plan() copies the host arrays into the graph's buffers (0.7.4: indptr,
    # last_page_len, indices; the fake also uploads a qo_indptr): no read
    assert all(s.reads == 0 for _, s in plans), [s.log for _, s in plans]
    own = (planned.reads - sum(s.reads for _, s in plans), planned.uploads - sum(s.uploads for _, s in plans))
    assert own == (0, 1), planned.log  # the engine's: the step's paged layout, in one copy
    assert attended.total == 0, attended.log
