"""The engine's native code: its C sources, built for this CPU on first use and kept under the
store (`build.py`), and giving a load's freed heap back to the system (`heap.py`)."""

from .build import FLAGS, compiler, cpu_identity, load, source
from .heap import trim_heap

__all__ = ["FLAGS", "compiler", "cpu_identity", "load", "source", "trim_heap"]
