"""The engine's native code: what this CPU offers (`cpu.py`), the C kernel libraries built for its
level on first use and kept under the store (`build.py`; their sources in `gguf/` and
`paged_attention/`), giving a load's freed heap back to the system (`heap.py`), and weights in
huge pages (`huge_pages.py`)."""

from . import cpu, huge_pages
from .build import Sources, compiler, cpu_identity, flags, load, sources
from .cpu import current as cpu_level
from .cpu import current_flags as cpu_flags
from .cpu import torch_capability
from .heap import trim_heap

cpu.pin_torch()  # a pinned level reaches torch's own kernels too, where torch has not chosen them yet

__all__ = ["Sources", "cpu", "huge_pages", "compiler", "cpu_identity", "flags", "load", "sources", "trim_heap"]
__all__ += ["cpu_flags", "cpu_level", "torch_capability"]
