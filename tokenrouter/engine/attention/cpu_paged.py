"""Paged attention on CPU by tokenrouter's C kernel (`native/paged_attention/`), one query at a time.

Why a kernel of our own: a query's result must not depend on what else is in the step. torch's
CPU SDPA tiles by the call's shapes, so a token's attention in a decode step, in a verifier's
check of k drafts and in a prefill differed in the last bits, and the argmax moved now and then:
greedy Speculative wrote the target's own answer on 145 of 164 HumanEval problems. The kernel
sums every query in one fixed order that depends only on that query's own keys (paged.h says
which), so a step's tokens are the same bits in any batch, any call width and any thread count.

It reads the paged cache in place through the block tables (no gather of the context), computes
in float32 (q float32 or bf16; K/V float32, bf16 or float16), and splits work over (query, KV
head) pairs. It is built for this CPU's level on first use (engine/native/build.py, cpu.py): vector
loops with AVX512 or with AVX2, FMA and F16C, else plain C that the compiler vectorizes, each level
summing in its own fixed order. `attention_backend="auto"` takes it at every level, as only it
computes a query alike in every step; where it cannot be built, torch's backend serves
(torch_paged.py), and the load says why.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import native
from ..kv import KVCache
from .backend import AttentionBackend, AttentionMetadata

SOURCES = native.sources("paged_attention")
DTYPES = (torch.float32, torch.bfloat16)  # what q and the output may be
KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # what K/V may be: the C file's KIND_*


@dataclass(frozen=True)
class Kernel:
    path: Path
    level: str  # the CPU level it was built for (native.cpu.ALL_LEVELS): its loops, and the last bits of its sums
    attention: Callable[..., int]  # tr_paged_attention, through ctypes

    @property
    def address(self) -> int:
        """tr_paged_attention's address, for C code that calls it (tr_decoder_layers)."""
        return ctypes.cast(self.attention, ctypes.c_void_p).value


def load(home: str | Path | None = None) -> tuple[Kernel | None, str]:
    """(the kernel, "") or (None, why not): built on first use, then read from the store."""
    return native.load(SOURCES, bind, home)


def unsupported_reason(device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> str | None:
    """Why the kernel cannot serve activations of `dtype` over a KV cache of `kv_dtype` (None: it can)."""
    if device.type != "cpu":
        return f"the C attention kernel runs on CPU, not {device.type}"
    if dtype not in DTYPES:
        return f"the C attention kernel computes float32 or bfloat16, not {dtype}"
    if (kv_dtype or dtype) not in KV_KINDS:
        return f"the C attention kernel reads a float32, bfloat16 or float16 KV cache, not {kv_dtype}"
    kernel, why = load()
    return why if kernel is None else None


def bind(lib: ctypes.CDLL, path: Path) -> Kernel:
    """The kernel's function in a loaded build of SOURCES."""
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    fn = lib.tr_paged_attention
    fn.restype = i32
    fn.argtypes = [
        *(ptr, i64, i64, ptr, i32),  # q, its strides, out, bf16 activations
        *(ptr, ptr, i32, i64),  # the K and V caches, their KV_KINDS value, their blocks
        *(i64, i32, i32, i32),  # tokens, heads, KV heads, head dim
        *(ptr, ptr, ptr, i64, i64, i32),  # token_row, token_keys, tables, rows, table width, block size
        *(i32, f32, i32),  # window, scale, threads
    ]
    lib.tr_attention_level.restype = i32
    return Kernel(path, native.cpu.ALL_LEVELS[lib.tr_attention_level()], fn)


@dataclass(frozen=True)
class StepQueries:
    """What the kernel needs of a step, built once in `plan` for every layer (int32, host)."""

    token_row: torch.Tensor  # [tokens] the row of each packed token
    token_keys: torch.Tensor  # [tokens] the keys it attends to: its position + 1
    tables: torch.Tensor  # [rows, widest] each row's block ids, padded with 0

    @classmethod
    def of(cls, meta: AttentionMetadata) -> StepQueries:
        q_lens = torch.tensor(meta.query_lens, dtype=torch.int32)
        ctx = torch.tensor(meta.context_lens, dtype=torch.int32)
        token_row = torch.repeat_interleave(torch.arange(len(q_lens), dtype=torch.int32), q_lens)
        first = torch.cumsum(q_lens, 0) - q_lens  # each row's first packed token
        index = torch.arange(int(q_lens.sum()), dtype=torch.int32) - first[token_row.long()]
        token_keys = (ctx - q_lens)[token_row.long()] + index + 1
        widest = max(len(t) for t in meta.block_tables)
        tables = torch.tensor([t + [0] * (widest - len(t)) for t in meta.block_tables], dtype=torch.int32)
        return cls(token_row, token_keys.to(torch.int32), tables)

    def args(self, block_size: int) -> tuple:
        """The kernel's arguments token_row .. block_size, in its order."""
        t = self.tables
        return self.token_row.data_ptr(), self.token_keys.data_ptr(), t.data_ptr(), t.shape[0], t.shape[1], block_size


class CpuPagedAttention(AttentionBackend):
    def __init__(self, cache: KVCache, kernel: Kernel):
        self.cache = cache
        self.kernel = kernel
        self._planned: tuple[AttentionMetadata, StepQueries] | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self._planned = (meta, StepQueries.of(meta))

    def queries(self, meta: AttentionMetadata) -> StepQueries:
        """The step's queries as the kernel takes them (planned once a step)."""
        if self._planned is None or self._planned[0] is not meta:  # a caller that did not plan
            self.plan(meta)
        return self._planned[1]

    def forward(self, layer_idx, q, k, v, meta: AttentionMetadata, scaling, sliding_window):
        k_cache, v_cache = self.cache.write(layer_idx, meta.slot_mapping, k, v)
        step = self.queries(meta)
        tokens, heads, dim = q.shape
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = torch.empty(tokens, heads, dim, dtype=q.dtype)
        rc = self.kernel.attention(
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            out.data_ptr(),
            int(q.dtype == torch.bfloat16),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            KV_KINDS[k_cache.dtype],
            self.cache.num_blocks,
            tokens,
            heads,
            k_cache.shape[1],
            dim,
            *step.args(meta.block_size),
            sliding_window or 0,
            float(scaling),
            torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"tr_paged_attention failed (layer {layer_idx}, {tokens} queries)")
        return out
