"""The GGUF block kernels (`engine/native/gguf/`): compiled for this CPU's level on first use, kept, called.

torch's CPU kernels for 4-bit and 8-bit weights dequantize every weight to float before they
multiply, so a decode step of the demo 1.5B read 23 GB/s where llama.cpp reads 35. The kernels
(`engine/native/gguf/`) compute as llama.cpp does (x quantized to int8 per block, integer dot
products on the file's own blocks' codes), for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K
tensors. Each tensor is repacked once at load, 16 rows interleaved (the layout is in
`gguf/repack.c`; the same size give or take 3%), which replaces the file's bytes: no second copy.
The group kernels over that layout are the CPU level's (`native/cpu.py`): AVX512 VNNI, AVX2, or
plain C for any other CPU; the plain-C path on the file's own blocks (`matmul(packed=False)`) is
the reference the tests hold them to.

It is built for this CPU's level on first use and kept under the store (engine/native/build.py). Without
a compiler, or where the build fails, `load()` answers None with the reason and the engine keeps
torch's kernels; `TOKENROUTER_GGUF_KERNELS=off` does the same on purpose.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import native

SOURCES = native.sources("gguf")
ENV = "TOKENROUTER_GGUF_KERNELS"
# ggml's type numbers, and (values, bytes) per block
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCKS = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
# where each block's float16 scales sit (d, and m or dmin where the type has one)
SCALES = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


@dataclass(frozen=True)
class Library:
    path: Path
    level: str  # the CPU level its group kernels compute at: one of native.cpu.ALL_LEVELS (x86 or ARM64)
    matmul: Callable[..., int]  # tr_gguf_matmul (plain C, the file's blocks), through ctypes
    packed_bytes: Callable[..., int]  # tr_gguf_packed_bytes
    repack: Callable[..., int]  # tr_gguf_repack
    matmul_packed: Callable[..., int]  # tr_gguf_matmul_packed (the level's group kernels)
    linears: Callable[..., int]  # tr_gguf_linears (a layer's fused calls)
    rope: Callable[..., None]  # tr_rope
    rows: Callable[..., int]  # tr_gguf_rows (a table's rows dequantized: embeddings)
    layers: Callable[..., int]  # tr_decoder_layers (a stack of fused layers in one call)


MAX_LINEARS = 4  # blocks.h's: weights in one tr_gguf_linears call


class LinearsArgs(ctypes.Structure):
    """One tr_gguf_linears call's weights and epilogue (layers.c's TrLinears)."""

    _fields_ = [
        ("count", ctypes.c_int),
        ("epilogue", ctypes.c_int),
        ("types", ctypes.c_int * MAX_LINEARS),
        ("packed", ctypes.c_void_p * MAX_LINEARS),
        ("Ns", ctypes.c_int64 * MAX_LINEARS),
        ("biases", ctypes.c_void_p * MAX_LINEARS),
        ("norm_w", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("K", ctypes.c_int64),
        ("out_features", ctypes.c_int64),
    ]


class LayerArgs(ctypes.Structure):
    """A decoder layer for tr_decoder_layers (layers.c's TrLayer): its four weight groups, its
    K and V caches, its sliding window (0: none)."""

    _fields_ = [
        ("qkv", LinearsArgs),
        ("o", LinearsArgs),
        ("gate_up", LinearsArgs),
        ("down", LinearsArgs),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
        ("window", ctypes.c_int),
    ]


def load(home: str | Path | None = None) -> tuple[Library | None, str]:
    """(the library, "") or (None, why not): built on first use, then read from the store."""
    if os.environ.get(ENV, "").lower() in ("0", "off", "no", "false"):
        return None, f"{ENV}={os.environ[ENV]}"
    return native.load(SOURCES, bind, home)


def bind(lib: ctypes.CDLL, path: Path) -> Library:
    """The kernels' functions in a loaded build of SOURCES."""
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    mm = [i32, ptr, i64, i64, ptr, i32, i64, ptr, i32, ptr, i32]
    for name, restype, argtypes in (
        ("tr_gguf_matmul", i32, mm),
        ("tr_gguf_matmul_packed", i32, mm),
        ("tr_gguf_packed_bytes", i64, [i32, i64, i64]),
        ("tr_gguf_repack", i32, [i32, ptr, i64, i64, ptr, i32]),
        ("tr_level", i32, []),
        ("tr_gguf_linears", i32, [i32, ptr, ptr, ptr, ptr, i64, ptr, i64, ptr, ctypes.c_float, ptr, i64, i32, i32]),
        ("tr_rope", None, [ptr, i64, i64, i32, i32, ptr, ptr]),
        ("tr_gguf_rows", i32, [i32, ptr, i64, i64, ptr, i64, ptr]),
        (
            "tr_decoder_layers",
            i32,
            [
                *(ptr, i32, ptr, i64, ptr, ptr, ptr),  # layers, count, h, tokens, cos, sin, slots
                *(i32, i32, i32, ctypes.c_float, ptr),  # heads, KV heads, head dim, scale, attention
                *(i32, i64, ptr, ptr, ptr, i64, i64, i32),  # KV kind, cache blocks, token_row .. block size
                *(ptr, ptr, ptr, i32),  # the scratch rows (qkv, attention, MLP), threads
            ],
        ),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return Library(
        path,
        native.cpu.ALL_LEVELS[lib.tr_level()],
        lib.tr_gguf_matmul,
        lib.tr_gguf_packed_bytes,
        lib.tr_gguf_repack,
        lib.tr_gguf_matmul_packed,
        lib.tr_gguf_linears,
        lib.tr_rope,
        lib.tr_gguf_rows,
        lib.tr_decoder_layers,
    )


def repack(lib: Library, kind: str, blocks: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The group kernels' layout of a tensor's GGUF blocks (uint8, [rows, bytes a row]): 16 rows
    interleaved, a flat uint8 tensor, in huge pages where it spans one (native/huge_pages.py)."""
    n, k = shape
    size = lib.packed_bytes(TYPES[kind], n, k)
    if size <= 0:
        raise ValueError(f"the GGUF kernels cannot repack {kind} x {k}")
    out = native.huge_pages.empty_bytes(size)
    blocks = blocks.contiguous()
    if lib.repack(TYPES[kind], blocks.data_ptr(), n, k, out.data_ptr(), torch.get_num_threads()) != 0:
        raise RuntimeError(f"tr_gguf_repack({kind}, {n}x{k}) failed")
    return out


def rows(lib: Library, kind: str, blocks: np.ndarray, shape: tuple[int, int], ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a `shape` table in GGUF blocks (`blocks`: uint8 [rows, bytes a row],
    C-contiguous), dequantized as gguf-py's reference code does: float32 [len(ids), cols], the same
    bits. An id outside the table raises IndexError, as torch's embedding does."""
    n, k = shape
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    if ids.numel() == 0:
        return out
    if not blocks.flags.c_contiguous or blocks.nbytes != n * (k // BLOCKS[kind][0]) * BLOCKS[kind][1]:
        raise ValueError(f"blocks of {blocks.nbytes} bytes ({blocks.shape}) for a {kind} table of {n}x{k}")
    rc = lib.rows(TYPES[kind], blocks.ctypes.data, n, k, ids.data_ptr(), ids.numel(), out.data_ptr())
    if rc == -2:
        raise IndexError(f"token id out of range: the table has {n} rows, got ids {ids.min()}..{ids.max()}")
    if rc != 0:
        raise RuntimeError(f"tr_gguf_rows({kind}, {n}x{k}) failed with {rc}")
    return out


def matmul(
    lib: Library,
    kind: str,
    blocks: torch.Tensor,
    shape: tuple[int, int],
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """x [M, K] (float32 or bf16, contiguous) times the [N, K] weight whose GGUF blocks are
    `blocks` (uint8, contiguous), plus `bias` (float32); in x's dtype. `packed`: `blocks` is
    `repack`'s layout and the level's group kernels compute; else the plain-C path on the file's
    blocks (what the tests hold the group kernels to)."""
    n, k = shape
    m = x.shape[0]
    bf16 = x.dtype == torch.bfloat16
    y = torch.empty(m, n, dtype=x.dtype)
    if m == 0:  # a step with no row to compute here (the output head when no row samples)
        return y
    rc = (lib.matmul_packed if packed else lib.matmul)(
        TYPES[kind],
        blocks.data_ptr(),
        n,
        k,
        x.data_ptr(),
        int(bf16),
        m,
        y.data_ptr(),
        int(bf16),
        None if bias is None else bias.data_ptr(),
        torch.get_num_threads(),
    )
    if rc != 0:
        what = "tr_gguf_matmul_packed" if packed else "tr_gguf_matmul"
        raise RuntimeError(f"{what}({kind}, {n}x{k}, {m} rows) failed with {rc}")
    return y
