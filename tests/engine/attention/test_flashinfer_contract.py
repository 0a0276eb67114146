"""flashinfer 0.7.4's contract, on CPU: our calls bind against its real signatures, and the contract fake
(tokenrouter/testing/flashinfer_fake.py) computes its documented semantics and refuses what it refuses.

The real signatures were read from the 0.7.4 wheel by scripts/flashinfer_signatures.py into
tests/engine/attention/data/; where flashinfer is importable (the GPU kit's dry run) a test re-reads them from it.
Every check of the fake has a test here that feeds it the defect it guards and sees it raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import random
import re
from pathlib import Path

import pytest
import torch

from tokenrouter.engine import AttentionMetadata
from tokenrouter.engine.attention import FlashInferPagedAttention
from tokenrouter.engine.attention.paged_layout import PagedLayout
from tokenrouter.engine.kv import KVCache, KVLayout
from tokenrouter.testing.flashinfer_fake import CALLABLES, FORWARDED, Call, FakeFlashInfer, attention

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("flashinfer_signatures", ROOT / "scripts" / "flashinfer_signatures.py")
sigtool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sigtool)
RECORDED = json.loads(sigtool.RECORDED.read_text())
SIGNATURES = {name: sigtool.signature_from(params) for name, params in RECORDED["signatures"].items()}
F64 = torch.float64
INDEX_FIELDS = [f for f in dataclasses.fields(PagedLayout) if f.name != "page_size"]


def reference_attention(q, k_pages, v_pages, qo_indptr, kv_indptr, kv_indices, last_page_len, window_left, scale):
    """Paged attention one row at a time, as flashinfer documents it: row r's queries are the last
    tokens of its pages' context (causal, bottom-right); a key is visible iff it is at most
    window_left positions back (-1: all). K/V pages are [pages, page_size, kv_heads, head_dim]."""
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
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[q0:q1] = torch.einsum("htc,chd->thd", scores.softmax(-1), vr)
    return out


def bind(call: Call) -> None:
    """Bind one call as 0.7.4 takes it: TypeError where 0.7.4 would raise one, or where positional
    arguments would land in a `*args` (custom-kernel arguments in run(), deprecated optionals in the
    decode plan()), which we never mean to pass."""
    for name in filter(None, (call.name, FORWARDED.get(call.name))):
        sig = SIGNATURES[name]
        bound = sig.bind(*call.args, **call.kwargs)
        for p in sig.parameters.values():
            if p.kind == p.VAR_POSITIONAL and bound.arguments.get(p.name):
                raise TypeError(f"{call.name}: {len(bound.arguments[p.name])} positional arguments land in *{p.name}")


# ---- our calls against 0.7.4's signatures -------------------------------------------------------
def _meta(query_lens, context_lens, tables, num_decode, page):
    """A step's metadata as far as the flashinfer backend reads it (it plans from the pages)."""
    slots = PagedLayout.build(query_lens, context_lens, tables, page).slots()
    return AttentionMetadata(slots, num_decode, None, None, None, [], [], query_lens, context_lens, tables, page)


def _backend_calls(q_dtype: torch.dtype = F64) -> list[Call]:
    """Every call our backend makes to flashinfer: its load-time self-test, an eager step mixing
    decode and prefill rows over two layer kinds, and a graph-mode decode step run "captured"."""
    lib = FakeFlashInfer()
    import tokenrouter.engine.attention.flashinfer_paged as fp

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fp, "import_flashinfer", lambda *a, **k: lib)
        cache = KVCache(KVLayout(2, 2, 16, F64), 32, 4, "cpu")
        backend = FlashInferPagedAttention(cache, 4, torch.device("cpu"), prefill_backend="fa2")
        backend.self_test(scratch_block=31)
        tables = [[3, 7], [1], [4, 5, 6], [9, 2]]
        steps = [((1, 1, 5, 3), (6, 2, 9, 7), 2), ((1, 1, 1, 1), (5, 3, 10, 6), 4)]
        for graph, (query_lens, context_lens, nd) in zip((None, 4), steps):
            meta = _meta(list(query_lens), list(context_lens), tables, nd, 4)
            backend.use_graph(graph, max_pages_per_row=4)
            backend.plan(meta)
            n = sum(query_lens)
            q, k = torch.randn(n, 4, 16, dtype=q_dtype), torch.randn(n, 2, 16, dtype=F64)
            with lib.capture() if graph else contextlib.nullcontext():
                for layer, window in ((0, 3), (1, None)):
                    backend.forward(layer, q, k, k.clone(), meta, 0.25, window)
        backend.use_graph(None)
    return lib.calls


def test_the_recorded_signatures_are_those_of_the_pinned_flashinfer():
    pins = re.findall(r"^flashinfer-python==(\S+)", (ROOT / "scripts" / "gpu_wheels.txt").read_text(), re.M)
    assert pins == [RECORDED["flashinfer"]] == ["0.7.4"], "a new pin: rerun scripts/flashinfer_signatures.py"
    assert sorted(RECORDED["signatures"]) == sorted(CALLABLES)


def test_the_fake_has_0_7_4s_signatures():
    assert sigtool.record(FakeFlashInfer(), CALLABLES) == RECORDED


def test_our_calls_bind_against_0_7_4s_signatures():
    calls = _backend_calls()
    assert {c.name for c in calls} == set(CALLABLES) - set(FORWARDED.values())
    assert any(c.kwargs.get("use_cuda_graph") for c in calls)  # the graph-mode constructor was bound too
    for call in calls:
        bind(call)


@pytest.mark.parametrize(
    "name, change",
    [
        ("BatchDecodeWithPagedKVCacheWrapper.plan", lambda a, k: (a, {**k, "window": k.pop("window_left")})),
        ("BatchDecodeWithPagedKVCacheWrapper.plan", lambda a, k: ((*a, "NONE"), k)),  # an optional, positionally
        ("BatchPrefillWithPagedKVCacheWrapper", lambda a, k: (a, {**k, "prefill_backend": "fa2"})),
        ("BatchPrefillWithPagedKVCacheWrapper.plan", lambda a, k: (a[:-1], k)),  # page_size left out
        ("BatchPrefillWithPagedKVCacheWrapper.run", lambda a, k: ((*a, k.pop("out")), k)),  # out= positionally
        ("append_paged_kv_cache", lambda a, k: ((*a, "NHD"), k)),  # one argument too many
    ],
)
def test_a_wrong_call_fails_the_binding(name, change):
    call = next(c for c in _backend_calls() if c.name == name)
    bind(call)
    args, kwargs = change(tuple(call.args), dict(call.kwargs))
    with pytest.raises(TypeError):
        bind(Call(name, args, kwargs))


def _installed_flashinfer():
    if importlib.util.find_spec("flashinfer") is None:
        return None
    try:
        import flashinfer
    except Exception:  # not importable here: nothing to compare with
        return None
    return flashinfer


@pytest.mark.skipif(_installed_flashinfer() is None, reason="flashinfer is not installed (the GPU kit installs it)")
def test_the_recorded_signatures_are_the_installed_flashinfers():
    found = sigtool.record(_installed_flashinfer(), CALLABLES)
    assert found == RECORDED, "rerun scripts/flashinfer_signatures.py, then check our calls still bind"


# ---- the fake's semantics ------------------------------------------------------------------------
def _step(page=4, query_lens=(1, 1, 5, 3, 8), context_lens=(6, 2, 9, 7, 8), kv_heads=2, heads=4, dim=8, seed=0):
    rng = random.Random(seed)
    free = list(range(40))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-c // page))] for c in context_lens]
    layout = PagedLayout.build(list(query_lens), list(context_lens), tables, page)
    torch.manual_seed(seed)
    k_pages, v_pages = (torch.randn(40, page, kv_heads, dim, dtype=F64) for _ in range(2))
    q = torch.randn(sum(query_lens), heads, dim, dtype=F64)
    return layout, q, k_pages, v_pages


@pytest.mark.parametrize("window", [-1, 0, 3])
@pytest.mark.parametrize("page", [1, 4, 16])
def test_the_fakes_attention_is_the_documented_one(window, page):
    layout, q, k, v = _step(page)
    tensors = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
    expected = reference_attention(q, k, v, *tensors, window, 0.3)
    torch.testing.assert_close(attention(q, k, v, *tensors, window, 0.3), expected, rtol=1e-12, atol=1e-12)


def test_the_fakes_append_writes_each_key_at_its_slot():
    layout, _, k_pages, v_pages = _step()
    k, v = torch.randn(len(layout.positions), 2, 8, dtype=F64), torch.randn(len(layout.positions), 2, 8, dtype=F64)
    before = k_pages.clone()
    lib = FakeFlashInfer()
    lib.append_paged_kv_cache(k, v, layout.batch_indices, layout.positions, (k_pages, v_pages), layout.kv_indices,
                              layout.kv_indptr, layout.kv_last_page_len)  # fmt: skip
    slots = layout.slots()
    torch.testing.assert_close(k_pages.view(-1, 2, 8)[slots], k, rtol=0, atol=0)
    torch.testing.assert_close(v_pages.view(-1, 2, 8)[slots], v, rtol=0, atol=0)
    untouched = torch.ones(k_pages.view(-1, 2, 8).shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(k_pages.view(-1, 2, 8)[untouched], before.view(-1, 2, 8)[untouched])


# ---- each check of the fake, fed the defect it guards ------------------------------------------
WORKSPACE = torch.zeros(1 << 10, dtype=torch.uint8)
HEADS = (4, 2, 8, 4)  # num_qo_heads, num_kv_heads, head_dim, page_size


def _planned(kind: str, lib: FakeFlashInfer | None = None, **plan_kwargs):
    """A planned wrapper of `kind` over `_step()`'s rows (decode: its two one-token rows), and its inputs."""
    lib = lib or FakeFlashInfer()
    layout, q, k, v = _step()
    if kind == "decode":
        rows, q = layout.rows(0, 2), q[:2]
        wrapper = lib.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
        wrapper.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len, *HEADS, q_data_type=F64, **plan_kwargs)
    else:
        wrapper = lib.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD")
        indices = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
        wrapper.plan(*indices, *HEADS, causal=True, q_data_type=F64, **plan_kwargs)
    return wrapper, q, (k, v)


def _graph_decode(lib: FakeFlashInfer, size: int = 2, indices: int = 8, dtype=torch.int32):
    bufs = (torch.zeros(size + 1, dtype=dtype), torch.zeros(indices, dtype=dtype), torch.ones(size, dtype=dtype))
    names = ("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer")
    return lib.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_cuda_graph=True, **dict(zip(names, bufs)))


def _defect(t: torch.Tensor, defect: str) -> torch.Tensor:
    return {"int64": t.long(), "strided": t.repeat_interleave(2)[::2], "meta": t.to("meta")}[defect]


@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.parametrize("defect, error", [("int64", "must be int32"), ("meta", "not on the key's device")])
def test_plan_takes_int32_index_tensors_from_the_host_or_the_device(kind, defect, error):
    layout, *_ = _step()
    lib = FakeFlashInfer()
    if kind == "decode":
        rows = layout.rows(0, 2)
        wrapper = lib.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
        given = [rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len]
    else:
        wrapper = lib.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
        given = [layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len]
    for i in range(len(given)):
        strided = _defect(given[i], "strided")  # plan() copies what it is given: a strided view is fine
        wrapper.plan(*given[:i], strided, *given[i + 1 :], *HEADS, q_data_type=F64)
        with pytest.raises(ValueError, match=error):
            wrapper.plan(*given[:i], _defect(given[i], defect), *given[i + 1 :], *HEADS, q_data_type=F64)


@pytest.mark.parametrize("name", ["batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"])
@pytest.mark.parametrize(
    "defect, error", [("int64", "must be int32"), ("strided", "must be contiguous"), ("meta", "not on the key's")]
)
def test_the_page_append_takes_int32_contiguous_index_tensors_on_the_keys_device(name, defect, error):
    layout, _, k_pages, v_pages = _step()
    k = torch.randn(len(layout.positions), 2, 8, dtype=F64)
    names = ["batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"]
    given = {n: getattr(layout, n) for n in names}

    def append(g):
        FakeFlashInfer().append_paged_kv_cache(k, k, g["batch_indices"], g["positions"], (k_pages, v_pages),
                                               g["kv_indices"], g["kv_indptr"], g["kv_last_page_len"])  # fmt: skip

    append(given)
    with pytest.raises(ValueError, match=error):
        append({**given, name: _defect(given[name], defect)})


def test_the_page_append_takes_keys_of_the_pages_dtype_on_their_device():
    layout, _, k_pages, v_pages = _step()
    k = torch.randn(len(layout.positions), 2, 8, dtype=F64)
    lib = FakeFlashInfer()
    tail = (layout.kv_indices, layout.kv_indptr, layout.kv_last_page_len)
    with pytest.raises(ValueError, match="append_key is torch.float32 but the pages are torch.float64"):
        lib.append_paged_kv_cache(k.float(), k, layout.batch_indices, layout.positions, (k_pages, v_pages), *tail)
    with pytest.raises(ValueError, match="paged_k_cache is on meta"):
        lib.append_paged_kv_cache(k, k, layout.batch_indices, layout.positions, (k_pages.to("meta"), v_pages), *tail)
    with pytest.raises(ValueError, match="outside its row's pages"):
        lib.append_paged_kv_cache(k, k, layout.batch_indices, layout.positions + 1, (k_pages, v_pages), *tail)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_run_takes_q_and_pages_of_the_planned_dtypes_on_the_wrappers_device(kind):
    wrapper, q, (k, v) = _planned(kind)
    torch.testing.assert_close(wrapper.run(q, (k, v)), wrapper.run(q, torch.stack([k, v], 1)))  # both cache forms
    with pytest.raises(ValueError, match="The dtype of q torch.float32 does not match the q_data_type torch.float64"):
        wrapper.run(q.float(), (k, v))
    with pytest.raises(ValueError, match="The dtype of k torch.float32 does not match the kv_data_type torch.float64"):
        wrapper.run(q, (k.float(), v.float()))
    with pytest.raises(ValueError, match="q is on meta, not on the wrapper's device cpu"):
        wrapper.run(q.to("meta"), (k, v))
    with pytest.raises(ValueError, match="paged_v_cache is on meta"):
        wrapper.run(q, (k, v.to("meta")))
    with pytest.raises(ValueError, match="as planned"):
        wrapper.run(q[1:], (k, v))


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_run_checks_outs_shape_dtype_and_device(kind):
    wrapper, q, kv = _planned(kind)
    out = torch.empty_like(q)
    assert wrapper.run(q, kv, out=out) is out
    torch.testing.assert_close(out, wrapper.run(q, kv))
    for bad, error in [
        (torch.empty(q.shape[0] + 1, *q.shape[1:], dtype=F64), "Invalid shape of out"),
        (torch.empty_like(q, dtype=torch.float32), "Invalid dtype of out: expected torch.float64"),
        (torch.empty_like(q, device="meta"), "Invalid device of out: expected cpu, got meta"),
    ]:
        with pytest.raises(ValueError, match=error):
            wrapper.run(q, kv, out=bad)


def test_a_graph_wrapper_plans_and_runs_its_batch_size_only():
    lib = FakeFlashInfer()
    layout, q, k, v = _step(query_lens=(1, 1, 1), context_lens=(6, 2, 9))
    rows = layout.rows(0, 2)
    eager, q2, kv = _planned("decode", lib)
    graph = _graph_decode(lib, size=2)
    graph.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len, *HEADS, q_data_type=F64)
    torch.testing.assert_close(graph.run(q2, kv), eager.run(q2, kv), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="batch size should be fixed in cudagraph mode, the runtime batch size 3"):
        graph.plan(layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len, *HEADS, q_data_type=F64)
    with pytest.raises(ValueError, match="CUDA-graph wrapper of batch size 2 was run on 3 rows"):
        graph.run(q, kv)
    small = _graph_decode(lib, size=2, indices=2)
    with pytest.raises(ValueError, match="less than or equal to the allocated buffer"):
        small.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len, *HEADS, q_data_type=F64)
    with pytest.raises(ValueError, match="must be int32"):
        _graph_decode(lib, dtype=torch.int64)
    with pytest.raises(ValueError, match="should be a torch.Tensor in cudagraph mode"):
        lib.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, use_cuda_graph=True)
    bufs = (torch.zeros(2, dtype=torch.int32), torch.zeros(8, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="batch_size \\+ 1"):
        lib.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD", True, False, *bufs)


def test_no_plan_during_capture_and_only_graph_wrappers_are_captured():
    lib = FakeFlashInfer()
    eager, q, kv = _planned("decode", lib)
    graph = _graph_decode(lib, size=2)
    layout, *_ = _step()
    rows = layout.rows(0, 2)
    graph.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len, *HEADS, q_data_type=F64)
    expected = eager.run(q, kv)
    with lib.capture():
        torch.testing.assert_close(graph.run(q, kv), expected, rtol=1e-12, atol=1e-12)
        with pytest.raises(RuntimeError, match="cannot be used in a CUDA graph"):
            graph.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len, *HEADS, q_data_type=F64)
        with pytest.raises(RuntimeError, match="without use_cuda_graph=True was captured"):
            eager.run(q, kv)
    assert not lib.is_capturing()
    eager.run(q, kv)  # after the capture, fine again


def test_the_fake_refuses_what_it_does_not_model_and_takes_0_7_4s_deprecated_forms():
    with pytest.raises(NotImplementedError, match="pos_encoding_mode='ROPE_LLAMA'"):
        _planned("decode", pos_encoding_mode="ROPE_LLAMA")
    wrapper, q, kv = _planned("prefill")
    with pytest.raises(NotImplementedError, match="return_lse=True"):
        wrapper.run(q, kv, return_lse=True)
    layout, *_ = _step()
    rows = layout.rows(0, 2)
    decode = FakeFlashInfer().BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.warns(DeprecationWarning, match="positionally"):
        decode.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len, *HEADS, "NONE", -1, q_data_type=F64)
    with pytest.raises(ValueError, match="last_page_len be in 1..page_size"):
        decode.plan(rows.kv_indptr, rows.kv_indices, rows.kv_last_page_len * 0, *HEADS, q_data_type=F64)


# ---- the fake catches a backend that breaks the contract ---------------------------------------
def test_the_fake_catches_a_backend_that_hands_it_int64_indices(monkeypatch):
    to = PagedLayout.to

    def int64_to(self, device):
        moved = to(self, device)
        return dataclasses.replace(moved, **{f.name: getattr(moved, f.name).long() for f in INDEX_FIELDS})

    monkeypatch.setattr(PagedLayout, "to", int64_to)
    with pytest.raises(ValueError, match=r"must be int32 .flashinfer reads it as int32_t\*., got torch.int64"):
        _backend_calls()


def test_the_fake_catches_a_backend_whose_q_is_not_of_the_planned_dtype():
    with pytest.raises(ValueError, match="The dtype of q torch.float32 does not match the q_data_type torch.float64"):
        _backend_calls(q_dtype=torch.float32)
