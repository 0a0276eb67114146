"""The paged KV cache: its tensors (`cache.py`) and its block accounting, prefix cache and copy on
write included (`block_manager.py`)."""

from .block_manager import BlockManager, BlockStats
from .cache import KVCache, KVLayout

__all__ = ["BlockManager", "BlockStats", "KVCache", "KVLayout"]
