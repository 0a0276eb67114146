"""A step's index tensors reach the device in one copy.

The runner and the paged layout build a step's indices (token ids, positions, cache slots, block
tables, CSR offsets) on the host, from Python lists. On CPU they are used where they are. On an
accelerator they are packed into one host buffer, pinned on CUDA, and copied with one
non-blocking copy: one transfer a step instead of one per tensor, and no host sync (a copy from
pageable memory, or `torch.tensor(..., device="cuda")`, waits for the stream). The device tensors
are views of the one copy.

The pinned buffer comes from torch's caching host allocator, which records the copy on the
stream and does not hand the buffer out again before the copy has read it, so the next step may
pack at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(tensors: Sequence[torch.Tensor | None], device: torch.device | str) -> list[torch.Tensor | None]:
    """`tensors` (host tensors of one dtype, or None) on `device`: themselves on the CPU, else
    views of one copy of them packed together."""
    device = torch.device(device)
    present = [t for t in tensors if t is not None]
    if device.type == "cpu" or not present:
        return list(tensors)
    dtype = present[0].dtype
    assert all(t.dtype == dtype and t.device.type == "cpu" for t in present), "host tensors of one dtype"
    pin = device.type == "cuda"
    packed = torch.empty(sum(t.numel() for t in present), dtype=dtype, pin_memory=pin)
    torch.cat([t.reshape(-1) for t in present], out=packed)
    on_device = packed.to(device, non_blocking=pin)
    out: list[torch.Tensor | None] = []
    offset = 0
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        out.append(on_device[offset : offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out
