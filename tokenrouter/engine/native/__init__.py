"""The engine's native code: its C sources, built for this CPU on first use and kept under the
store (`build.py`), giving a load's freed heap back to the system (`heap.py`), and weights in
huge pages (`huge_pages.py`)."""

from . import huge_pages
from .build import FLAGS, compiler, cpu_identity, load, source
from .heap import trim_heap

__all__ = ["FLAGS", "huge_pages", "compiler", "cpu_identity", "load", "source", "trim_heap"]
