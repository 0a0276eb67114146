"""A contract fake of flashinfer 0.7.4's paged attention: the wrappers and page append tokenrouter's
flashinfer backend calls, with 0.7.4's signatures, computing the documented semantics in plain torch.

It stands in for the library where its kernels cannot run (CPU), and it is stricter than the library
about what the library needs but does not always check, so that a mistake in the caller fails here
instead of corrupting memory on a GPU:

- index tensors are int32 (the kernels read them as `int32_t*`) and 1-D; those the page append and
  the kernels read are contiguous and on the key's device; plan() takes them on the host or there;
- the K and V pages have the planned kv dtype, the appended K/V the pages' dtype, q the planned
  q_data_type; q, the pages and `out` are on the wrapper's device; `out` has q's shape and the
  planned output dtype (0.7.4's messages);
- a wrapper made with use_cuda_graph=True plans and runs its buffers' batch size only, and only such
  a wrapper may run while a CUDA graph is captured; plan() never runs during capture.

Capture is torch.cuda's stream capture, or `FakeFlashInfer.capture()` where there is no CUDA.
Attention is computed without host reads (static shapes: each row gets room for all the planned
pages), so a capture-safety check can run the fake inside a "captured" forward. Every public call
is recorded in `FakeFlashInfer.calls`, for tests to bind against 0.7.4's signatures, which
scripts/flashinfer_signatures.py recorded in tests/engine/attention/data/flashinfer_0_7_4_signatures.json.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import reprlib
import warnings
from dataclasses import dataclass

import torch

VERSION = "0.7.4"
# What tokenrouter calls ("Class": its constructor). 0.7.4's decode plan() takes *args, **kwargs and
# hands them to _plan_impl (FORWARDED), whose signature is the one that checks them.
CALLABLES = (
    "BatchDecodeWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper.plan",
    "BatchDecodeWithPagedKVCacheWrapper._plan_impl", "BatchDecodeWithPagedKVCacheWrapper.run",
    "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper.plan",
    "BatchPrefillWithPagedKVCacheWrapper.run", "append_paged_kv_cache",
)  # fmt: skip
FORWARDED = {"BatchDecodeWithPagedKVCacheWrapper.plan": "BatchDecodeWithPagedKVCacheWrapper._plan_impl"}
_LEGACY_DECODE_PLAN_ARGS = (  # 0.7.4's _BATCH_DECODE_PLAN_LEGACY_POS_ARGS
    "pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "o_data_type",
    "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens",
    "fixed_split_size", "disable_split_kv", "q_len_per_req",
)  # fmt: skip
DECODE_BACKENDS = ("auto", "fa2", "fa3", "trtllm-gen", "cute-dsl", "cudnn", "cutile")
PREFILL_BACKENDS = ("auto", "fa2", "fa3", "cudnn", "trtllm-gen", "cute-dsl", "cute-dsl-prims")


# ---- the checks ------------------------------------------------------------------------------
def _index(name: str, t: torch.Tensor, device: torch.device, planning: bool = False) -> None:
    if not torch.is_tensor(t) or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 (flashinfer reads it as int32_t*), got {t.dtype}")
    if planning and t.device.type == "cpu":
        return  # plan() copies (and makes contiguous) what it is given, from the host or the device
    if not t.is_contiguous() and not planning:
        raise ValueError(f"{name} must be contiguous")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, not on the key's device {device}")


def _dtype(d) -> torch.dtype:
    return getattr(torch, d) if isinstance(d, str) else d


def _pages(paged_kv_cache, kv_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) pages, NHD: [pages, page_size, kv_heads, head_dim] (views of a 5-D cache or an HND one)."""
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
    elif torch.is_tensor(paged_kv_cache):
        k, v = paged_kv_cache.unbind(1)
    else:
        raise KeyError(f"Unrecognized paged_kv_cache type {type(paged_kv_cache)}")
    if k.dim() != 4 or v.dim() != 4:
        raise ValueError("K and V pages must be 4-D")
    return (k, v) if kv_layout == "NHD" else (k.transpose(1, 2), v.transpose(1, 2))


# ---- the semantics ---------------------------------------------------------------------------
def attention(
    q, k_pages, v_pages, qo_indptr, kv_indptr, kv_indices, last_page_len, window_left, scale, soft_cap=0.0, causal=True
):
    """Paged attention as flashinfer documents it, all rows at once and without host reads: row r's
    queries q[qo_indptr[r]:qo_indptr[r+1]] are the last tokens of its context, the pages
    kv_indices[kv_indptr[r]:kv_indptr[r+1]] with last_page_len[r] tokens in the last (a causal mask
    aligns bottom-right); a key is visible iff at most window_left positions back (-1: all)."""
    tokens, heads, dim = q.shape
    if tokens == 0:
        return q.new_zeros(q.shape)
    page, kv_heads = k_pages.shape[1], k_pages.shape[2]
    dev, ct = q.device, torch.promote_types(q.dtype, torch.float32)
    room = kv_indices.shape[0]  # static: no row holds more pages than were planned in all
    slot = (kv_indptr[:-1, None].long() + torch.arange(room, device=dev)).clamp(max=room - 1)
    pages = kv_indices.long()[slot]  # [rows, room]
    ctx = (kv_indptr[1:] - kv_indptr[:-1] - 1).long() * page + last_page_len.long()
    t = torch.arange(tokens, device=dev)
    row = torch.searchsorted(qo_indptr[1:].long(), t, right=True)
    starts, ends = qo_indptr[:-1].long()[row], qo_indptr[1:].long()[row]
    qpos = ctx[row] - (ends - starts) + (t - starts)  # each query's position in its row's context
    keys = torch.arange(room * page, device=dev)[None, :]
    visible = keys < ctx[row][:, None]
    if causal:
        visible &= keys <= qpos[:, None]
    if window_left >= 0:
        visible &= qpos[:, None] - keys <= window_left
    group = heads // kv_heads
    kr = k_pages[pages].to(ct).reshape(pages.shape[0], room * page, kv_heads, dim)[row].repeat_interleave(group, 2)
    vr = v_pages[pages].to(ct).reshape(pages.shape[0], room * page, kv_heads, -1)[row].repeat_interleave(group, 2)
    scores = torch.einsum("thd,tlhd->thl", q.to(ct), kr) * scale
    if soft_cap > 0:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("thl,tlhd->thd", scores.softmax(-1), vr)


# ---- the library -----------------------------------------------------------------------------
@dataclass
class Call:
    name: str  # one of CALLABLES
    args: tuple
    kwargs: dict


def _recorded(name: str):
    def wrap(fn):
        @functools.wraps(fn)  # inspect.signature follows __wrapped__: the fake keeps 0.7.4's signature
        def call(self, *args, **kwargs):
            self.lib.calls.append(Call(name, args, kwargs))
            return fn(self, *args, **kwargs)

        return call

    return wrap


def _only_modelled(fn, given: dict, modelled: str) -> None:
    """Options the fake does not compute must be left at 0.7.4's defaults (`given`: fn's locals)."""
    for p in inspect.signature(fn).parameters.values():
        value = given[p.name]
        if p.kind == p.VAR_POSITIONAL:
            fine = value == ()
        else:
            plain = isinstance(value, (bool, int, float, str)) and value == p.default
            fine = p.name in modelled.split() or p.default is p.empty or value is p.default or plain
        if not fine:
            raise NotImplementedError(f"the flashinfer fake does not model {p.name}={reprlib.repr(value)}")


class FakeFlashInfer:
    """One fake flashinfer module: what `import flashinfer` gives the backend. Its wrapper classes are
    bound to it, so its `calls` and capture state are this instance's only."""

    __version__ = VERSION

    def __init__(self, check_values: bool = True):
        self.check_values = check_values  # validate index values (host reads) outside capture
        self.calls: list[Call] = []
        self.capturing = False
        self.lib = self
        for base in (_Decode, _Prefill):
            setattr(self, base.name, type(base.name, (base,), {"lib": self}))

    @contextlib.contextmanager
    def capture(self):
        """Stands for a CUDA graph capture where there is no CUDA."""
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False

    def is_capturing(self) -> bool:
        return self.capturing or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())

    # fmt: off
    @_recorded("append_paged_kv_cache")
    def append_paged_kv_cache(
        self, append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
        kv_last_page_len, kv_layout="NHD",
    ) -> None:
        # fmt: on
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        k_pages, v_pages = _pages(paged_kv_cache, kv_layout)
        dev = append_key.device
        indices = {"batch_indices": batch_indices, "positions": positions, "kv_indices": kv_indices}
        for name, t in {**indices, "kv_indptr": kv_indptr, "kv_last_page_len": kv_last_page_len}.items():
            _index(name, t, dev)
        for name, t in (("append_value", append_value), ("paged_k_cache", k_pages), ("paged_v_cache", v_pages)):
            if t.device != dev:
                raise ValueError(f"{name} is on {t.device}, not on the key's device {dev}")
        for name, t in (("append_key", append_key), ("append_value", append_value)):
            if t.dim() != 3 or t.stride(-1) != 1:
                raise ValueError(f"{name} must be 3-D and contiguous in its last dimension")
            if t.dtype != k_pages.dtype or v_pages.dtype != k_pages.dtype:
                raise ValueError(f"{name} is {t.dtype} but the pages are {k_pages.dtype}: the kernel would reinterpret")
            if t.shape[1:] != k_pages.shape[2:]:
                raise ValueError(f"{name} has heads x dim {tuple(t.shape[1:])}, the pages {tuple(k_pages.shape[2:])}")
        nnz, batch = append_key.shape[0], kv_last_page_len.shape[0]
        if kv_indptr.shape[0] != batch + 1 or batch_indices.shape[0] != nnz or positions.shape[0] != nnz:
            raise ValueError("kv_indptr must have batch_size + 1 entries, batch_indices and positions one per key")
        page = k_pages.shape[1]
        if self.check_values and not self.is_capturing() and nnz:
            ctx = (kv_indptr[1:] - kv_indptr[:-1] - 1) * page + kv_last_page_len
            b = batch_indices.long()
            if bool(((b < 0) | (b >= batch)).any()) or bool(((positions < 0) | (positions >= ctx[b])).any()):
                raise ValueError("a key's position lies outside its row's pages")
        block = kv_indices.long()[kv_indptr.long()[batch_indices.long()] + positions.long() // page]
        offset = positions.long() % page
        k_pages[block, offset] = append_key
        v_pages[block, offset] = append_value


class _Wrapper:
    """What 0.7.4's decode and prefill wrappers share: the workspace's device, CUDA-graph buffers, plan and run."""

    lib: FakeFlashInfer

    def _setup(self, workspace, kv_layout, use_cuda_graph, buffers: dict, backend, backends) -> None:
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        if backend not in backends:
            raise ValueError(f"backend must be one of {backends}, not {backend!r}")
        self.kv_layout, self.device, self.backend = kv_layout, workspace.device, backend
        self.use_cuda_graph = use_cuda_graph
        self.buffers = buffers if use_cuda_graph else {}
        self.fixed_batch_size = 0
        self.planned: dict | None = None
        if use_cuda_graph:
            for name, t in buffers.items():
                if not torch.is_tensor(t):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
                _index(name, t, self.device)
            self.fixed_batch_size = n = len(buffers["last_page_len"])
            if any(len(buffers[name]) != n + 1 for name in ("qo_indptr", "indptr") if name in buffers):
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")

    def _plan(self, qo_indptr, indptr, indices, last_page_len, heads, page_size, dtypes, **attrs) -> None:
        if self.lib.is_capturing():
            raise RuntimeError("plan() runs on the host and cannot be used in a CUDA graph (flashinfer 0.7.4's docs)")
        given = {"qo_indptr": qo_indptr, "indptr": indptr, "indices": indices, "last_page_len": last_page_len}
        for name, t in given.items():
            _index(name, t, self.device, planning=True)
        batch = len(last_page_len)
        if len(indptr) != batch + 1 or len(qo_indptr) != batch + 1:
            raise ValueError("indptr and qo_indptr must have batch_size + 1 entries")
        if heads[0] % heads[1]:
            raise ValueError("num_qo_heads must be a multiple of num_kv_heads")
        host = [t.cpu() for t in given.values()]
        qo, kv, idx, last = host
        if self.lib.check_values:
            if qo[0] != 0 or kv[0] != 0 or bool((qo.diff() < 0).any()) or bool((kv.diff() < 1).any()):
                raise ValueError("indptr arrays must start at 0 and grow (every row holds a page)")
            if len(idx) != int(kv[-1]) or bool(((last < 1) | (last > page_size)).any()):
                raise ValueError("indices must hold indptr[-1] pages and last_page_len be in 1..page_size")
        if self.use_cuda_graph:
            if batch != self.fixed_batch_size:
                raise ValueError(
                    f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch} "
                    f" mismatches the batch size set during initialization {self.fixed_batch_size}"
                )
            bufs = self.buffers
            if len(indices) > len(bufs["indices"]):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            for name in bufs:  # the kernels read the whole buffers: indptr bounds which indices count
                bufs[name][: len(given[name])].copy_(given[name])
            tensors = (
                bufs["qo_indptr"] if "qo_indptr" in bufs else qo.to(self.device),
                bufs["indptr"],
                bufs["indices"],
                bufs["last_page_len"],
            )
        else:  # plan() copies the host tensors to the device (flashinfer: `.to(self.device)`)
            tensors = tuple(t.to(self.device, copy=True) for t in host)
        q_dtype, kv_dtype, o_dtype = (_dtype(d) if d is not None else None for d in dtypes)
        scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(heads[2])
        self.planned = dict(attrs, tensors=tensors, rows=int(qo[-1]), heads=heads, page_size=page_size, scale=scale)
        self.planned.update(q_dtype=q_dtype, kv_dtype=kv_dtype or q_dtype, o_dtype=o_dtype or q_dtype)
        self.planned["soft_cap"] = attrs["soft_cap"] or 0.0

    def _run(self, q, paged_kv_cache, out, window_left, q_scale, k_scale, v_scale):
        p = self.planned
        if p is None:
            raise RuntimeError("run() before plan()")
        if window_left is not None and window_left != p["window_left"]:
            raise AssertionError("run()'s window_left must equal the planned one")
        if self.lib.is_capturing() and not self.use_cuda_graph:
            raise RuntimeError(
                "a wrapper made without use_cuda_graph=True was captured: its next plan() allocates new "
                "buffers, and the graph would replay reading the old ones"
            )
        k_pages, v_pages = _pages(paged_kv_cache, self.kv_layout)
        for what, t, kind in (("q", q, "q_data_type"), ("k", k_pages, "kv_data_type"), ("k", v_pages, "kv_data_type")):
            planned = p["q_dtype" if what == "q" else "kv_dtype"]
            if t.dtype != planned:  # flashinfer.utils._check_cached_qkv_data_type's messages
                msg = f"The dtype of {what} {t.dtype} does not match the {kind} {planned} specified in plan function."
                raise ValueError(msg)
        for name, t in (("q", q), ("paged_k_cache", k_pages), ("paged_v_cache", v_pages)):
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, not on the wrapper's device {self.device}")
        num_qo_heads, num_kv_heads, head_dim = p["heads"]
        if q.dim() != 3 or tuple(q.shape[1:]) != (num_qo_heads, head_dim) or q.shape[0] != p["rows"]:
            raise ValueError(f"q must be [{p['rows']}, {num_qo_heads}, {head_dim}] as planned, got {tuple(q.shape)}")
        if tuple(k_pages.shape[1:]) != (p["page_size"], num_kv_heads, head_dim) or v_pages.shape != k_pages.shape:
            raise ValueError(f"the pages {tuple(k_pages.shape)} do not match the planned page size and heads")
        if out is not None:  # flashinfer.utils.check_shape_dtype_device's messages
            for what, want in (("shape", q.shape), ("dtype", p["o_dtype"]), ("device", q.device)):
                if getattr(out, what) != want:
                    raise ValueError(f"Invalid {what} of out: expected {want}, got {getattr(out, what)}")
        scale = p["scale"] * (q_scale if q_scale is not None else 1.0) * (k_scale if k_scale is not None else 1.0)
        result = attention(
            q, k_pages, v_pages, *p["tensors"], p["window_left"], scale, p["soft_cap"], causal=p["causal"]
        )
        if v_scale is not None:
            result = result * v_scale
        return result.to(p["o_dtype"]) if out is None else out.copy_(result)


class _Decode(_Wrapper):
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper: one query per row, after the row's context."""

    name = "BatchDecodeWithPagedKVCacheWrapper"

    # fmt: off
    @_recorded("BatchDecodeWithPagedKVCacheWrapper")
    def __init__(
        self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
        paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
        backend="auto", jit_args=None, jit_kwargs=None,
    ) -> None:
        # fmt: on
        buffers = "paged_kv_indptr_buffer paged_kv_indices_buffer paged_kv_last_page_len_buffer"
        _only_modelled(_Decode.__init__, locals(), f"kv_layout use_cuda_graph use_tensor_cores backend {buffers}")
        bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        buffers = dict(zip(("indptr", "indices", "last_page_len"), bufs))
        self._setup(float_workspace_buffer, kv_layout, use_cuda_graph, buffers, backend, DECODE_BACKENDS)
        self.use_tensor_cores = use_tensor_cores

    # fmt: off
    @_recorded("BatchDecodeWithPagedKVCacheWrapper.plan")
    def plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        *deprecated_positional_args, **kwargs,
    ) -> None:
        # fmt: on
        if deprecated_positional_args:  # as 0.7.4 does, with its warning
            legacy = _LEGACY_DECODE_PLAN_ARGS[: len(deprecated_positional_args)]
            if len(deprecated_positional_args) > len(_LEGACY_DECODE_PLAN_ARGS) or set(legacy) & set(kwargs):
                raise TypeError("BatchDecodeWithPagedKVCacheWrapper.plan(): too many or repeated arguments")
            kwargs.update(zip(legacy, deprecated_positional_args))
            warnings.warn("optional arguments to plan() passed positionally", DeprecationWarning, stacklevel=2)
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    # fmt: off
    def _plan_impl(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
        pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None, q_data_type="float16",
        kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
        non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
        q_len_per_req=1, is_causal=None, use_token_head_sf=False,
    ) -> None:
        # fmt: on
        modelled = "window_left logits_soft_cap q_data_type kv_data_type o_data_type data_type sm_scale rope_scale"
        modelled += " rope_theta non_blocking fixed_split_size disable_split_kv"  # (rope_*: unused without RoPE)
        _only_modelled(self._plan_impl, locals(), modelled)
        if data_type is not None:
            q_data_type = q_data_type if q_data_type is not None else data_type
            kv_data_type = kv_data_type if kv_data_type is not None else data_type
        qo_indptr = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        heads, dtypes = (num_qo_heads, num_kv_heads, head_dim), (q_data_type, kv_data_type, o_data_type)
        attrs = {"window_left": window_left, "scale": sm_scale, "soft_cap": logits_soft_cap, "causal": True}
        self._plan(qo_indptr, indptr, indices, last_page_len, heads, page_size, dtypes, **attrs)

    # fmt: off
    @_recorded("BatchDecodeWithPagedKVCacheWrapper.run")
    def run(
        self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
        return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
        skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
    ):
        # fmt: on
        _only_modelled(_Decode.run, locals(), "q_scale k_scale v_scale out enable_pdl window_left")
        if self.use_cuda_graph and q.shape[0] != self.fixed_batch_size:
            raise ValueError(f"a CUDA-graph wrapper of batch size {self.fixed_batch_size} was run on {q.shape[0]} rows")
        return self._run(q, paged_kv_cache, out, window_left, q_scale, k_scale, v_scale)


class _Prefill(_Wrapper):
    """flashinfer.BatchPrefillWithPagedKVCacheWrapper: several queries per row, the last of its context."""

    name = "BatchPrefillWithPagedKVCacheWrapper"

    # fmt: off
    @_recorded("BatchPrefillWithPagedKVCacheWrapper")
    def __init__(
        self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
        paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, custom_mask_buf=None,
        mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, variant_owns_mask=False,
        max_total_num_rows=None,
    ) -> None:
        # fmt: on
        buffers = "qo_indptr_buf paged_kv_indptr_buf paged_kv_indices_buf paged_kv_last_page_len_buf"
        _only_modelled(_Prefill.__init__, locals(), f"kv_layout use_cuda_graph backend {buffers}")
        bufs = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf)
        buffers = dict(zip(("qo_indptr", "indptr", "indices", "last_page_len"), bufs))
        self._setup(float_workspace_buffer, kv_layout, use_cuda_graph, buffers, backend, PREFILL_BACKENDS)

    # fmt: off
    @_recorded("BatchPrefillWithPagedKVCacheWrapper.plan")
    def plan(
        self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
        head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
        pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
        rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
        non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
        max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None,
        max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False, uniform_q_len=None,
        use_token_head_sf=False,
    ) -> None:
        # fmt: on
        if head_dim_vo not in (None, head_dim_qk):
            raise NotImplementedError("the flashinfer fake models head_dim_vo == head_dim_qk only")
        modelled = "head_dim_vo causal use_fp16_qk_reduction sm_scale window_left logits_soft_cap rope_scale"
        modelled += " rope_theta q_data_type kv_data_type o_data_type non_blocking fixed_split_size disable_split_kv"
        _only_modelled(_Prefill.plan, locals(), modelled + " uniform_q_len")
        heads, dtypes = (num_qo_heads, num_kv_heads, head_dim_qk), (q_data_type, kv_data_type, o_data_type)
        attrs = {"window_left": window_left, "scale": sm_scale, "soft_cap": logits_soft_cap, "causal": causal}
        indices = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        self._plan(*indices, heads, page_size, dtypes, **attrs)

    # fmt: off
    @_recorded("BatchPrefillWithPagedKVCacheWrapper.run")
    def run(
        self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
        return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None,
        kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None,
    ):
        # fmt: on
        modelled = "q_scale k_scale v_scale out enable_pdl window_left lse_base lse_layout"
        _only_modelled(_Prefill.run, locals(), modelled)
        return self._run(q, paged_kv_cache, out, window_left, q_scale, k_scale, v_scale)
