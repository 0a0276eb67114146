"""Paged attention with flashinfer's kernels (CUDA, float16/bfloat16): the `gpu` extra.

One step is planned once (`plan`), then every layer appends its new K/V with flashinfer's page
append and runs two wrappers over the same pages: the batch-decode kernel for the decode rows
(one query each) and the batch-prefill kernel, causal, for prefill/extend rows. Plans depend on a
layer's sliding window and scale, so the backend keeps one wrapper pair per (window, scale) it
has seen; most models have one.

For CUDA graphs (engine/model/cuda_graph.py) the backend also keeps, per captured batch size, decode
wrappers over fixed index buffers: `plan` copies the step's pages into them before a replay, and
the captured append and attention kernels read them there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kv.cache import KVCache
from .backend import AttentionBackend, AttentionMetadata
from .paged_layout import PagedLayout

WORKSPACE_BYTES = 128 << 20  # flashinfer's float workspace (split-KV partial results), per worker
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)

PlanKey = tuple[int, float]  # (window_left, sm_scale)


def import_flashinfer():
    """flashinfer, or None when the `gpu` extra is not installed (it imports fine without a GPU)."""
    try:
        import flashinfer
    except ImportError:
        return None
    return flashinfer


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
        return "flashinfer is not installed (pip install 'tokenrouter[gpu]')"
    return None


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
    def __init__(self, cache: KVCache, num_qo_heads: int, device: torch.device):
        flashinfer = import_flashinfer()
        if flashinfer is None:
            raise ImportError("flashinfer is not installed (pip install 'tokenrouter[gpu]')")
        self.fi = flashinfer
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
        # flashinfer's plan() rewrites a pinned host buffer that the previous plan's async copy may
        # still read; ModelRunner.prepare's blocking host-to-device copies order the stream first.
        self._host = PagedLayout.from_metadata(meta)
        self._num_decode = meta.num_decode
        self._planned = set()
        if self.graph is not None:
            g, host = self.graph, self._host
            assert meta.num_decode == host.num_rows == g.size, "a decode graph replays pure-decode steps of its size"
            g.positions.copy_(host.positions, non_blocking=True)
            self._layout = PagedLayout(
                g.qo_indptr, g.kv_indptr, g.kv_indices, g.kv_last_page_len, g.batch_indices, g.positions, self.page_size
            )
        else:
            self._layout = self._host.to(self.device)
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
            wrapper.plan(d.kv_indptr, d.kv_indices, d.kv_last_page_len, *heads, **common)
        if nd < host.num_rows:
            p = host.rows(nd, host.num_rows)
            wrapper = self.prefill_wrappers.get(key)
            if wrapper is None:
                wrapper = self.fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
                self.prefill_wrappers[key] = wrapper
            wrapper.plan(p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_last_page_len, *heads, causal=True, **common)
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
