"""Weights in huge pages: the block kernels stream a model's weights once a decode step, and on 4 KiB
pages that stream misses the TLB every 4 KiB.

Measured interleaved on a 2-core AMD EPYC VM (benchmarks/kernels/bench_huge_pages.py, docs/benchmarks.md):
the gate layer of the demo 1.5B (8960x1536 Q4_K, ten copies cycled) 1.02-1.11x faster, depending
on the minute, and a whole decode 1.02x, inside that machine's noise; it adds no memory, and
where the host backs the VM's memory with huge pages too, each read's page walk is shorter.
Linux backs anonymous memory with huge pages where the process asks (`transparent_hugepage` in
its usual "madvise" mode), but only memory not yet touched: a buffer glibc reuses from its heap
keeps the small pages it has. So a weight of at least one huge page gets a fresh mapping of its own, 2 MiB aligned,
marked MADV_HUGEPAGE before anything writes it; freed with the tensor. Elsewhere (another OS, a
smaller tensor, THP off) it is plain `torch.empty`, and `TOKENROUTER_HUGE_PAGES=off` makes it so
everywhere (benchmarks/kernels/bench_huge_pages.py runs both).
"""

from __future__ import annotations

import mmap
import os

import torch

HUGE_PAGE = 2 << 20
ENV = "TOKENROUTER_HUGE_PAGES"  # "off": weights on the allocator's own pages


def supported() -> bool:
    """Whether this platform can ask for huge pages (Linux's MADV_HUGEPAGE) and may."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap.mmap, "madvise") and os.environ.get(ENV) != "off"


def empty_bytes(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of `nbytes`, in huge pages where it spans one and the
    platform can (its start then 2 MiB aligned)."""
    if nbytes < HUGE_PAGE or not supported():
        return torch.empty(nbytes, dtype=torch.uint8)
    # A private anonymous mapping, untouched: the slack for alignment is never written, so it
    # takes address space, not memory. Only whole huge pages are marked: a partly used last one
    # would hold up to 2 MiB nobody reads.
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds `region`: unmapped with the last view
    skip = -whole.data_ptr() % HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, skip, nbytes // HUGE_PAGE * HUGE_PAGE)
    except OSError:  # a kernel built without THP: small pages, as torch.empty would give
        pass
    return whole[skip : skip + nbytes]
