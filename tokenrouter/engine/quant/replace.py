"""Swap a model's CPU `nn.Linear` layers for faster kernels (`onednn.py`, `int8.py`).

One layer at a time, holding no reference to the layers already replaced: each dense weight is
freed as soon as its replacement exists, so the swap costs one layer's weight at the peak, not a
second copy of the model. A weight another module shares (a tied output head's embedding) is
handed to the replacement, which keeps it instead of dropping it."""

from __future__ import annotations

from collections.abc import Callable

import torch


def replace_linears(
    model: torch.nn.Module,
    build: Callable[[torch.nn.Linear, torch.Tensor | None], torch.nn.Module],
    skip: frozenset[str] = frozenset(),
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> int:
    """Replace every `nn.Linear` on CPU with its weight in one of `dtypes` and its leaf name not in
    `skip` with `build(linear, tied)`; returns how many."""
    shared = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Linear) for p in m.parameters(recurse=False)}
    names = [
        name
        for name, m in model.named_modules()
        if type(m) is torch.nn.Linear
        and m.weight.dtype in dtypes
        and m.weight.device.type == "cpu"
        and name.rpartition(".")[2] not in skip
    ]
    for name in names:
        owner, _, leaf = name.rpartition(".")
        parent = model.get_submodule(owner)
        child = parent.get_submodule(leaf)
        tied = child.weight if id(child.weight) in shared else None
        setattr(parent, leaf, build(child, tied))
        del child, tied
    return len(names)
