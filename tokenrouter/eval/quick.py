"""`tokenrouter eval --quick`: the whole pipeline in seconds, on a tiny random model pair.

The pair is built here (tokenrouter.testing), shares one small tokenizer, and writes noise, so
pass@1 is about 0: the point is that prompting, generation, routing, the sandbox, the results
file and the report all run. Its entropies straddle 0.2, so `rstitch:0.2` routes both ways.
"""

from __future__ import annotations

from pathlib import Path

QUICK_SYSTEMS = ["small", "large", "rstitch:0.2"]
QUICK_PROBLEMS = 3
QUICK_MAX_TOKENS = 24


def build_tiny_pair(root: str | Path) -> dict[str, Path]:
    """The tiny random pair in float32, with room for the instruct prompt (4096 positions)."""
    import torch

    from ..testing import build_tiny_pair as tiny_pair

    return tiny_pair(root, dtype=torch.float32, max_position_embeddings=4096)
