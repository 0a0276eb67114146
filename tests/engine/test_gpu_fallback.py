"""The GPU path's fallbacks and orderings, decided on CPU: flashinfer that fails to import or fails
its load-time self-test leaves `attention_backend="auto"` on torch's backend (and fails the load
when asked for by name), `prefill_backend` reaches flashinfer's prefill wrapper, a failed CUDA-graph
capture is reported with its reason, float32 checkpoints compute in half precision on a GPU, each
wrapper's plan waits for its previous plan's copy, and a step's indices reach the device in one copy.

The flashinfer here is a stand-in written for these tests: paged attention as flashinfer documents
it, in plain torch, so the backend's self-test computes and checks real answers on CPU.
"""

from __future__ import annotations

import importlib.abc
import logging
import random
import sys
import weakref

import anyio
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.helpers import generate_all
from tokenrouter import Engine, ModelSpec, SamplingParams, Single
from tokenrouter.engine.attention import choice as attention_choice_module
from tokenrouter.engine.attention import flashinfer_paged
from tokenrouter.engine.attention.flashinfer_paged import FlashInferPagedAttention
from tokenrouter.engine.kv.cache import KVCache, KVLayout
from tokenrouter.engine.model import precision
from tokenrouter.engine.model.cuda_graph import DecodeGraphs
from tokenrouter.engine.model.loader import load_model
from tokenrouter.engine.model.runner import ModelRunner
from tokenrouter.engine.sched.batch import ScheduledBatch
from tokenrouter.engine.sequence import Request, SeqStatus, Sequence
from tokenrouter.errors import ModelLoadError

LIBCUDART = "libcudart.so.13: cannot open shared object file: No such file or directory"
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"


# ---- a flashinfer stand-in --------------------------------------------------------------------
def _attend(q, k_pages, v_pages, qo_indptr, kv_indptr, kv_indices, last_page_len, window_left, scale):
    """Row r's queries are the last tokens of its pages' context (causal, bottom-right)."""
    out = torch.empty_like(q)
    page = k_pages.shape[1]
    for r in range(len(last_page_len)):
        q0, q1 = int(qo_indptr[r]), int(qo_indptr[r + 1])
        pages = kv_indices[int(kv_indptr[r]) : int(kv_indptr[r + 1])].long()
        ctx = (len(pages) - 1) * page + int(last_page_len[r])
        kr = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:ctx]
        vr = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:ctx]
        group = q.shape[1] // kr.shape[1]
        kr, vr = kr.repeat_interleave(group, 1), vr.repeat_interleave(group, 1)
        scores = torch.einsum("thd,chd->htc", q[q0:q1], kr) * scale
        back = torch.arange(ctx - (q1 - q0), ctx)[:, None] - torch.arange(ctx)[None, :]
        allowed = (back >= 0) & ((back <= window_left) if window_left >= 0 else True)
        out[q0:q1] = torch.einsum("htc,chd->thd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), vr)
    return out


class StandIn:
    """A fake `flashinfer` module for the calls the backend makes. `broken`: "prefill" raises in
    the prefill kernel as a GPU without its build would; "wrong" returns zeros. `log` records
    (what, id of the wrapper, detail) in call order."""

    def __init__(self, broken: str | None = None):
        self.broken = broken
        self.log: list[tuple[str, int, object]] = []
        stand_in = self

        class Decode:
            def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False, **buffers):
                assert kv_layout == "NHD" and not use_cuda_graph

            def plan(self, indptr, indices, last, qo_heads, kv_heads, head_dim, page_size, **kw):
                stand_in.log.append(("plan", id(self), "decode"))
                self.plan_ = (torch.arange(len(last) + 1), indptr.clone(), indices.clone(), last.clone())
                self.args = (kw.get("window_left", -1), kw.get("sm_scale") or head_dim**-0.5)

            def run(self, q, kv, out=None):
                return stand_in.compute("decode", q, kv, self.plan_, self.args, out)

        class Prefill:
            def __init__(self, workspace, kv_layout="NHD", backend="auto"):
                stand_in.log.append(("new prefill", id(self), backend))

            def plan(self, qo_indptr, indptr, indices, last, qo_heads, kv_heads, head_dim, page_size, **kw):
                assert kw["causal"]
                stand_in.log.append(("plan", id(self), "prefill"))
                self.plan_ = (qo_indptr.clone(), indptr.clone(), indices.clone(), last.clone())
                self.args = (kw.get("window_left", -1), kw.get("sm_scale") or head_dim**-0.5)

            def run(self, q, kv, out=None):
                return stand_in.compute("prefill", q, kv, self.plan_, self.args, out)

        self.BatchDecodeWithPagedKVCacheWrapper = Decode
        self.BatchPrefillWithPagedKVCacheWrapper = Prefill

    def compute(self, kind, q, kv, plan, args, out):
        self.log.append(("run", 0, kind))
        if self.broken == kind:
            raise RuntimeError(NO_KERNEL)
        result = torch.zeros_like(q) if self.broken == "wrong" else _attend(q, *kv, *plan, *args)
        return result if out is None else out.copy_(result)

    @staticmethod
    def append_paged_kv_cache(k, v, batch_indices, positions, kv, kv_indices, kv_indptr, last_page_len, layout):
        k_pages, v_pages = kv
        page = k_pages.shape[1]
        for t in range(k.shape[0]):
            b, pos = int(batch_indices[t]), int(positions[t])
            block = int(kv_indices[int(kv_indptr[b]) + pos // page])
            k_pages[block, pos % page], v_pages[block, pos % page] = k[t], v[t]


@pytest.fixture
def flashinfer_here(monkeypatch):
    """flashinfer "supported" on this CPU, served by a stand-in; returns a function that installs one."""
    monkeypatch.setattr(attention_choice_module, "unsupported_reason", lambda device, dtype, head_dim: None)

    def install(stand_in: StandIn) -> StandIn:
        monkeypatch.setattr(flashinfer_paged, "import_flashinfer", lambda: stand_in)
        return stand_in

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
    from tokenrouter.engine.attention.choice import attention_choice

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
    stand_in = flashinfer_here(StandIn(broken="prefill"))
    with caplog.at_level(logging.WARNING):
        res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=4))
    assert all(r.error is None and len(r.token_ids) == 3 for r in res)
    assert stats.attention_backend == "torch" and stats.cuda_graph_batch_sizes == []
    assert stats.attention_fallback == f"flashinfer's load-time self-test failed: RuntimeError: {NO_KERNEL}"
    assert any(r.exc_info is not None and NO_KERNEL in r.getMessage() for r in caplog.records)
    assert ("run", 0, "prefill") in stand_in.log  # the self-test ran the kernel that failed

    with pytest.raises(ModelLoadError, match=f"attention_backend='flashinfer'.*self-test failed.*{NO_KERNEL}"):
        _serve(ModelSpec(path=tiny_model, attention_backend="flashinfer"))


def test_the_self_test_catches_kernels_that_compute_wrong_attention(tiny_model, flashinfer_here):
    flashinfer_here(StandIn(broken="wrong"))
    res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=0))
    assert all(r.error is None for r in res)
    assert stats.attention_backend == "torch" and "computed wrong attention" in stats.attention_fallback


def test_kernels_that_pass_the_self_test_serve(tiny_model, flashinfer_here):
    stand_in = flashinfer_here(StandIn())
    res, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=0))
    assert all(r.error is None and len(r.token_ids) == 3 for r in res)
    assert stats.attention_backend == "flashinfer" and stats.attention_fallback is None
    runs = [d for what, _, d in stand_in.log if what == "run"]
    assert runs[:3] == ["decode", "prefill", "prefill"]  # the self-test: decode + short prefill, then a long one


def test_the_self_test_writes_only_the_scratch_block_and_leaves_the_backend_as_new(tiny_model, flashinfer_here):
    flashinfer_here(StandIn())
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

    stand_in = flashinfer_here(StandIn())
    _, stats = _serve(ModelSpec(path=tiny_model, cuda_graph_max_batch=0, prefill_backend="fa2"))
    assert stats.attention_backend == "flashinfer"
    made = [backend for what, _, backend in stand_in.log if what == "new prefill"]
    assert made and set(made) == {"fa2"}


# ---- CUDA-graph capture ---------------------------------------------------------------------
def test_a_failed_capture_is_logged_with_its_traceback_and_reported(tiny_model, flashinfer_here, monkeypatch, caplog):
    flashinfer_here(StandIn())

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
    _, stats = _serve(ModelSpec(path=tiny_model))
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
    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append(("record", id(self), None))

    def synchronize(self):
        self.log.append(("synchronize", id(self), None))


def _seq(i: int, n: int, rng: random.Random, block_size: int, pool: list[int]) -> Sequence:
    ids = [rng.randrange(5, 300) for _ in range(n)]
    req = Request(f"r{i}", ids, SamplingParams(), seed=0, stop_token_ids=frozenset(), max_tokens=8)
    seq = Sequence(req, list(ids), status=SeqStatus.RUNNING)
    seq.block_table = [pool.pop() for _ in range(-(-(n + 4) // block_size))]
    return seq


def test_each_wrappers_plan_waits_for_its_previous_plans_copy(flashinfer_here):
    from tokenrouter.engine.attention.flashinfer_paged import PlanFences, scratch_step

    stand_in = flashinfer_here(StandIn())
    layout = KVLayout(1, 2, 16, torch.float32)
    cache = KVCache(layout, 8, 4, "cpu")
    backend = FlashInferPagedAttention(cache, 4, torch.device("cpu"))
    assert backend.fences.make_event is None  # no events off CUDA
    backend.fences = PlanFences(torch.device("cpu"), make_event=lambda: _Event(stand_in.log))
    key = (-1, 0.25)
    backend.keys.append(key)
    for _ in range(3):
        backend.plan(scratch_step([1, 5], 1, 7, 4))
    order = [(what, ident) for what, ident, _ in stand_in.log if what in ("plan", "record", "synchronize")]
    wrappers = [backend.decode_wrappers[key], backend.prefill_wrappers[key]]
    events = {id(w): id(backend.fences.events[id(w)]) for w in wrappers}
    for w in wrappers:
        mine = [what for what, ident in order if ident in (id(w), events[id(w)])]
        # every plan is followed by its event's record, and every plan but the first preceded by its wait
        assert mine == ["plan", "record"] + ["synchronize", "plan", "record"] * 2


# ---- one copy a step ------------------------------------------------------------------------
class _Transfers(TorchDispatchMode):
    """Counts host-to-device transfers onto the meta device: copies between devices, and meta
    tensors that appear without an op this mode saw making them (`torch.tensor(data,
    device=...)` moves its host data below the modes); `check` counts those among results too."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.seen: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # by id(): tensors compare by value

    def check(self, *tensors) -> None:
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "meta" and self.seen.get(id(t)) is not t:
                self.count += 1
                self.seen[id(t)] = t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.check(args, kwargs)
        out = func(*args, **(kwargs or {}))
        src = args[1] if func is torch.ops.aten.copy_.default else args[0]
        if isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.device != out.device:
            self.count += 1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.seen[id(t)] = t
        return out


def _step_tensors(step) -> list:
    meta = step.meta
    return [step.input_ids, step.positions, step.keep, meta.slot_mapping, meta.decode_block_tables, meta.decode_mask]


def test_a_steps_indices_reach_the_device_in_one_copy(tiny_model):
    loaded = load_model("m", ModelSpec(path=tiny_model, dtype="float64"))
    runner = ModelRunner(loaded, None, 4)
    rng, pool = random.Random(0), list(range(64))
    seqs = [_seq(i, n, rng, 4, pool) for i, n in enumerate([9, 4, 13, 6])]
    for s, computed in zip(seqs, [8, 3, 5, 0]):  # 2 decode rows, an extend row after a prefix, a prefill row
        s.num_computed = computed
    batch = ScheduledBatch(seqs, [1, 1, 8, 6], 2)
    with _Transfers() as transfers:
        runner.prepare(batch)
    assert transfers.count == 0  # on CPU, the host tensors are used where they are
    runner.device = torch.device("meta")  # an accelerator's stand-in: shapes and devices, no data
    with _Transfers() as transfers:
        prepared = runner.prepare(batch)
        transfers.check(_step_tensors(prepared), prepared.meta.prefill_slots)
    assert transfers.count == 1

    step = runner.prepare(batch, extra_rows=[5])
    runner.device = torch.device("cpu")
    on_cpu = runner.prepare(batch, extra_rows=[5])
    meta, cpu_meta = step.meta, on_cpu.meta
    for got, want in [
        (step.input_ids, on_cpu.input_ids),
        (step.positions, on_cpu.positions),
        (step.keep, on_cpu.keep),
        (meta.slot_mapping, cpu_meta.slot_mapping),
        (meta.decode_block_tables, cpu_meta.decode_block_tables),
        (meta.decode_mask, cpu_meta.decode_mask),
        (meta.decode_positions, cpu_meta.decode_positions),
        (meta.prefill_slots[0], cpu_meta.prefill_slots[0]),
    ]:
        assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype
    assert meta.prefill_slots[1] is None and cpu_meta.prefill_slots[1] is None
    assert on_cpu.keep.tolist() == [0, 1, 9, 15, 5]  # each sampled row's last token, then the extra row

    from tokenrouter.engine.attention.device_copy import to_device

    with _Transfers() as transfers:
        moved = to_device([torch.arange(3), None, torch.ones(2, 2, dtype=torch.long)], "meta")
    assert transfers.count == 1 and moved[1] is None and moved[2].shape == (2, 2)
