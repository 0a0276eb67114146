"""Weights in huge pages (engine/native/huge_pages.py): where they go, what the kernel is asked, and
that the block kernels compute the same on them."""

from __future__ import annotations

import gc
import re
import sys
from pathlib import Path

import pytest
import torch

from tokenrouter.engine.native import huge_pages
from tokenrouter.engine.quant import gguf_native

from .quant.test_gguf_blocks import random_blocks

MIB = 1 << 20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not huge_pages.supported(), reason="Linux THP")


def mapping_of(address: int) -> dict | None:
    """The /proc/self/smaps entry holding `address`: its range and VmFlags."""
    for entry in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        start, end = (int(v, 16) for v in entry.split()[0].split("-"))
        if start <= address < end:
            flags = re.search(r"^VmFlags:(.*)$", entry, re.M)
            return {"start": start, "end": end, "flags": flags.group(1).split() if flags else []}
    return None


def test_a_tensor_under_a_huge_page_is_plain_memory():
    t = huge_pages.empty_bytes(MIB)
    assert t.shape == (MIB,) and t.dtype == torch.uint8
    assert t.untyped_storage().nbytes() == MIB  # torch's own allocation, no slack


@linux_only
def test_a_large_tensor_starts_on_a_huge_page_and_only_whole_ones_are_marked():
    size = 5 * MIB + 12_345
    t = huge_pages.empty_bytes(size)
    assert t.shape == (size,) and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    t.fill_(3)
    assert int(t.sum()) == 3 * size
    head = mapping_of(t.data_ptr())
    assert "hg" in head["flags"]  # MADV_HUGEPAGE, asked before the first write
    assert head["end"] == t.data_ptr() + 4 * MIB  # two whole huge pages, the partial third left out
    assert "hg" not in mapping_of(t.data_ptr() + 4 * MIB)["flags"]


def test_off_in_the_environment_gives_plain_memory(monkeypatch):
    monkeypatch.setenv(huge_pages.ENV, "off")
    t = huge_pages.empty_bytes(4 * MIB)
    assert not huge_pages.supported() and t.untyped_storage().nbytes() == 4 * MIB


@linux_only
def test_the_mapping_goes_with_the_last_view():
    t = huge_pages.empty_bytes(4 * MIB)
    address = t.data_ptr()
    view = t[MIB:]
    del t
    gc.collect()
    assert mapping_of(address) is not None
    view.fill_(1)  # still mapped: the view holds it
    del view
    gc.collect()
    entry = mapping_of(address)
    assert entry is None or "hg" not in entry["flags"]  # unmapped (or the address reused by another)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_the_block_kernels_compute_the_same_on_huge_pages(kind):
    lib, why = gguf_native.load()
    if lib is None:
        pytest.skip(f"no GGUF block kernels here: {why}")
    n, k = 2304, 2048  # repacked: 2.7 MiB (Q4_K), 4.1 MiB (Q6_K), so in huge pages
    blocks = random_blocks(kind, n, k, seed=5)
    packed = gguf_native.repack(lib, kind, blocks, (n, k))
    assert packed.numel() >= huge_pages.HUGE_PAGE
    if huge_pages.supported():
        assert packed.data_ptr() % huge_pages.HUGE_PAGE == 0
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(6))
    plain = gguf_native.matmul(lib, kind, blocks, (n, k), x)
    fast = gguf_native.matmul(lib, kind, packed, (n, k), x, packed=True)
    assert (fast - plain).norm() <= 1e-5 * plain.norm()
