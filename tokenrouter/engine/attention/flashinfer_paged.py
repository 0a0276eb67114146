"""Paged attention with flashinfer's kernels (CUDA, float16/bfloat16): the `gpu` extra.

One step is planned once (`plan`), then every layer appends its new K/V with flashinfer's page
append and runs two wrappers over the same pages: the batch-decode kernel for the decode rows
(one query each) and the batch-prefill kernel, causal, for prefill/extend rows. Plans depend on a
layer's sliding window and scale, so the backend keeps one wrapper pair per (window, scale) it
has seen; most models have one.

For CUDA graphs (engine/model/cuda_graph.py) the backend also keeps, per captured batch size, decode
wrappers over fixed index buffers: `plan` copies the step's pages into them before a replay, and
the captured append and attention kernels read them there.

Each wrapper's `plan()` writes its schedule into a pinned host buffer of its own and queues an
asynchronous copy of it to the device; the next `plan()` of that wrapper rewrites the buffer. So
every plan records an event on the stream after it (`PlanFences`), and the next plan of the same
wrapper waits for that event first: the copy has then read the buffer. Nothing else orders them
(the engine's own index tensors reach the device in one non-blocking copy, engine/model/runner.py;
the host indices each `plan()` is given are flashinfer's to copy, a few small copies per wrapper).

`self_test` runs the kernels once at load, on the scratch block, so that a kernel that cannot
build or run fails there, where `attention_backend="auto"` can still fall back to torch's backend
(engine/attention/choice.py), not inside a request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..kv import KVCache
from .backend import AttentionBackend, AttentionMetadata
from .paged_layout import PagedLayout

WORKSPACE_BYTES = 128 << 20  # flashinfer's float workspace (split-KV partial results), per worker
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)

PlanKey = tuple[int, float]  # (window_left, sm_scale)


NOT_INSTALLED = "flashinfer is not installed (pip install 'tokenrouter[gpu]')"
PREFILL_BACKENDS = ("auto", "fa2", "fa3")  # flashinfer's prefill `backend=` values we pass (ModelSpec.prefill_backend)
SELF_TEST_PREFILL_TOKENS = (8, 72)  # 0.7.4's "auto" runs FA2 up to 64 query tokens, FA3 (on Hopper) above


def _import() -> tuple[object | None, str | None]:
    try:
        import flashinfer
    except ImportError as e:
        if e.name == "flashinfer":
            return None, NOT_INSTALLED
        return None, f"flashinfer failed to import: {type(e).__name__}: {e}"
    except Exception as e:  # a shared library that will not load, version skew, ...: no flashinfer here
        return None, f"flashinfer failed to import: {type(e).__name__}: {e}"
    return flashinfer, None


def import_flashinfer():
    """flashinfer, or None when it is not installed or fails to import, for whatever reason (it
    imports fine without a GPU); `import_problem()` says why."""
    return _import()[0]


def import_problem() -> str | None:
    """Why flashinfer does not import here (e.g. "flashinfer failed to import: OSError: ..."), or None."""
    return _import()[1]


def unsupported_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why flashinfer cannot serve this model here, or None if it can."""
    if device.type != "cuda":
        return f"flashinfer runs on CUDA devices, not {device}"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if dtype not in SUPPORTED_DTYPES:
        return f"flashinfer computes in float16 or bfloat16, not {dtype}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"flashinfer's kernels take head_dim {SUPPORTED_HEAD_DIMS}, not {head_dim}"
    if import_flashinfer() is None:
        return import_problem() or NOT_INSTALLED
    return None


class PlanFences:
    """One event per wrapper, recorded on the stream after its `plan()` queued the copy of its
    pinned host buffer, and waited for before its next `plan()` rewrites that buffer. Only on
    CUDA (`make_event`: torch.cuda.Event); elsewhere plans are not fenced."""

    def __init__(self, device: torch.device, make_event: Callable[[], object] | None = None):
        if make_event is None and device.type == "cuda":
            make_event = torch.cuda.Event
        self.make_event = make_event
        self.events: dict[int, object] = {}  # by id() of the wrapper: wrappers live as long as the backend

    def plan(self, wrapper, *args, **kwargs) -> None:
        if self.make_event is None:
            wrapper.plan(*args, **kwargs)
            return
        event = self.events.get(id(wrapper))
        if event is None:
            event = self.events[id(wrapper)] = self.make_event()
        else:
            event.synchronize()  # the previous plan's copy has read the pinned buffer
        wrapper.plan(*args, **kwargs)
        event.record()


def scratch_step(query_lens: list[int], num_decode: int, scratch_block: int, block_size: int) -> AttentionMetadata:
    """A step whose rows (new ones: no cached prefix) all write and read the scratch block: each
    row's pages are that one block, repeated."""
    tables = [[scratch_block] * -(-n // block_size) for n in query_lens]
    layout = PagedLayout.build(query_lens, query_lens, tables, block_size)
    return AttentionMetadata(
        slot_mapping=layout.slots(),
        num_decode=num_decode,
        decode_block_tables=None,
        decode_mask=None,
        decode_positions=None,
        prefill_rows=[],
        prefill_slots=[],
        query_lens=list(query_lens),
        context_lens=list(query_lens),
        block_tables=tables,
        block_size=block_size,
    )


@dataclass
class _DecodeGraphBuffers:
    """Fixed device buffers a captured decode graph of `size` rows reads its pages from."""

    size: int
    qo_indptr: torch.Tensor  # 0..size: one query per row
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor
    wrappers: dict[PlanKey, object] = field(default_factory=dict)


class FlashInferPagedAttention(AttentionBackend):
    def __init__(self, cache: KVCache, num_qo_heads: int, device: torch.device, prefill_backend: str = "auto"):
        flashinfer = import_flashinfer()
        if flashinfer is None:
            raise ImportError(import_problem() or NOT_INSTALLED)
        if prefill_backend not in PREFILL_BACKENDS:
            raise ValueError(f"prefill_backend must be one of {PREFILL_BACKENDS}, not {prefill_backend!r}")
        self.fi = flashinfer
        self.prefill_backend = prefill_backend  # the prefill wrappers' `backend=` ("fa2" where FA3 did not build)
        self.fences = PlanFences(device)
        self.cache = cache
        layout = cache.layout
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = layout.head_dim
        self.dtype = layout.dtype
        self.device = device
        self.page_size = cache.block_size
        pages = (cache.num_blocks, cache.block_size, layout.num_kv_heads, layout.head_dim)
        self.kv = [(k.view(pages), v.view(pages)) for k, v in zip(cache.k, cache.v)]  # NHD pages
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # flashinfer: zero at first use
        # flashinfer's advice (as SGLang follows): the prefill kernel serves decode better for wide GQA groups
        self.decode_tensor_cores = num_qo_heads // layout.num_kv_heads >= 4
        self.keys: list[PlanKey] = []  # every (window, scale) a layer has asked for
        self.decode_wrappers: dict[PlanKey, object] = {}
        self.prefill_wrappers: dict[PlanKey, object] = {}
        self.graph_buffers: dict[int, _DecodeGraphBuffers] = {}
        self.graph: _DecodeGraphBuffers | None = None  # set while capturing or replaying a decode graph
        self._host: PagedLayout | None = None
        self._layout: PagedLayout | None = None
        self._num_decode = 0
        self._planned: set[PlanKey] = set()

    # ---- planning ------------------------------------------------------------------------
    def plan(self, meta: AttentionMetadata) -> None:
        """The step's layout on the host (what the wrappers plan from) and on the device (one
        copy), then every layer kind seen so far planned; each plan fenced (`PlanFences`)."""
        self._host = PagedLayout.from_metadata(meta)
        self._num_decode = meta.num_decode
        self._planned = set()
        layout = self._host.to(self.device)
        if self.graph is not None:
            g = self.graph
            assert meta.num_decode == layout.num_rows == g.size, "a decode graph replays pure-decode steps of its size"
            g.positions.copy_(layout.positions)
            layout = PagedLayout(
                g.qo_indptr, g.kv_indptr, g.kv_indices, g.kv_last_page_len, g.batch_indices, g.positions, self.page_size
            )
        self._layout = layout
        for key in self.keys:
            self._plan(key)

    def use_graph(self, size: int | None, max_pages_per_row: int = 0) -> None:
        """Steps from now on are decode graphs of `size` rows (None: eager steps again)."""
        if size is None:
            self.graph = None
            return
        if size not in self.graph_buffers:
            i32 = {"dtype": torch.int32, "device": self.device}
            self.graph_buffers[size] = _DecodeGraphBuffers(
                size,
                qo_indptr=torch.arange(size + 1, **i32),
                kv_indptr=torch.zeros(size + 1, **i32),
                kv_indices=torch.zeros(size * max_pages_per_row, **i32),
                kv_last_page_len=torch.ones(size, **i32),
                batch_indices=torch.arange(size, **i32),
                positions=torch.zeros(size, **i32),
            )
        self.graph = self.graph_buffers[size]

    def _plan(self, key: PlanKey) -> None:
        window_left, scale = key
        host, nd = self._host, self._num_decode
        assert host is not None, "plan() runs before the step's forward"
        heads = (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)
        common = {"window_left": window_left, "sm_scale": scale, "q_data_type": self.dtype, "kv_data_type": self.dtype}
        if nd:
            d = host.rows(0, nd)
            wrapper = self._decode_wrapper(key)
            self.fences.plan(wrapper, d.kv_indptr, d.kv_indices, d.kv_last_page_len, *heads, **common)
        if nd < host.num_rows:
            p = host.rows(nd, host.num_rows)
            wrapper = self.prefill_wrappers.get(key)
            if wrapper is None:
                wrapper = self.fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", backend=self.prefill_backend
                )
                self.prefill_wrappers[key] = wrapper
            self.fences.plan(
                wrapper, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_last_page_len, *heads, causal=True, **common
            )
        self._planned.add(key)

    def _decode_wrapper(self, key: PlanKey):
        g = self.graph
        wrappers = g.wrappers if g is not None else self.decode_wrappers
        wrapper = wrappers.get(key)
        if wrapper is None:
            if g is not None:
                wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.decode_tensor_cores,
                    paged_kv_indptr_buffer=g.kv_indptr,
                    paged_kv_indices_buffer=g.kv_indices,
                    paged_kv_last_page_len_buffer=g.kv_last_page_len,
                )
            else:
                wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_tensor_cores=self.decode_tensor_cores
                )
            wrappers[key] = wrapper
        return wrapper

    # ---- one layer -----------------------------------------------------------------------
    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata, scaling, sliding_window):
        key = (sliding_window - 1 if sliding_window else -1, float(scaling))
        if key not in self._planned:  # a layer kind not seen before: plan it now (never while capturing)
            self.keys.append(key)
            self._plan(key)
        layout = self._layout
        k_pages, v_pages = self.kv[layer_idx]
        self.fi.append_paged_kv_cache(
            k.contiguous(),
            v.contiguous(),
            layout.batch_indices,
            layout.positions,
            (k_pages, v_pages),
            layout.kv_indices,
            layout.kv_indptr,
            layout.kv_last_page_len,
            "NHD",
        )
        q = q.contiguous()
        nd = self._num_decode
        if nd == q.shape[0]:
            return self._decode_wrapper(key).run(q, (k_pages, v_pages))
        out = torch.empty_like(q)
        if nd:
            self._decode_wrapper(key).run(q[:nd], (k_pages, v_pages), out=out[:nd])
        self.prefill_wrappers[key].run(q[nd:], (k_pages, v_pages), out=out[nd:])
        return out

    # ---- the load-time self-test -----------------------------------------------------------
    def self_test(self, scratch_block: int) -> None:
        """Plan and run the kernels a step uses, on the scratch block (a KV block no request
        owns): a decode row beside a short prefill row, then one prefill row long enough for
        FA3 where flashinfer picks it. This builds (JIT) and loads them, and proves they run: every
        key and value is one vector per KV head, so each query's attention must be its KV head's
        value, whatever the weights. Raises on any failure; the backend is then as new."""
        short, long = SELF_TEST_PREFILL_TOKENS
        scale = self.head_dim**-0.5
        gen = torch.Generator().manual_seed(0)
        kv = torch.randn(2, 1, self.num_kv_heads, self.head_dim, generator=gen).to(self.device, self.dtype)
        group = self.num_qo_heads // self.num_kv_heads
        try:
            for query_lens, num_decode in (([1, short], 1), ([long], 0)):
                meta = scratch_step(query_lens, num_decode, scratch_block, self.page_size)
                tokens = sum(query_lens)
                q = torch.randn(tokens, self.num_qo_heads, self.head_dim, generator=gen).to(self.device, self.dtype)
                k, v = (x.expand(tokens, -1, -1) for x in kv)
                self.plan(meta)
                out = self.forward(0, q, k, v, meta, scale, None)
                if out.shape != q.shape:
                    raise RuntimeError(f"flashinfer's attention came back {tuple(out.shape)}, not {tuple(q.shape)}")
                error = (out.float() - v.repeat_interleave(group, dim=1).float()).abs().max().item()
                if not error <= 2e-2 * (1 + v.float().abs().max().item()):  # NaN fails too
                    raise RuntimeError(
                        f"flashinfer's kernels computed wrong attention in the self-test (rows {query_lens}): "
                        f"max error {error:.3g}"
                    )
        finally:
            self.keys, self._planned = [], set()  # the model's own layer kinds are planned as they come
            self._host = self._layout = None
