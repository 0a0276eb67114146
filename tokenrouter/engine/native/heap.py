"""Giving freed memory back to the system after a load.

Loading makes many short-lived buffers (a GGUF's parsed metadata, each tensor's bytes and its
float32 dequantization while it is requantized). glibc keeps what they freed in its heap, so the
process's resident size stays at the load's peak although the memory is free. `trim` asks glibc
to return it, so a model's steady footprint is what it holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)  # glibc only: absent on musl and macOS


def trim_heap(collect: bool = True) -> None:
    """Give free heap pages back to the system, where the C library can (after collecting
    garbage, unless `collect` is False: a loop that frees what it made needs no collection)."""
    if collect:
        gc.collect()
    trim_fn = _malloc_trim()
    if trim_fn is not None:
        trim_fn(0)
