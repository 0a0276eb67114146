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
    """Two random Qwen2 models sharing one tokenizer: {"small": dir, "large": dir}."""
    import torch

    from ..testing import build_tiny_model, build_tokenizer

    root = Path(root)
    tok = build_tokenizer()
    small = build_tiny_model(
        root / "small",
        "qwen2",
        dtype=torch.float32,
        seed=1,
        tokenizer=tok,
        logit_scale=3.0,
        max_position_embeddings=4096,
    )
    large = build_tiny_model(
        root / "large", "qwen2", dtype=torch.float32, seed=2, tokenizer=tok, logit_scale=3.0,
        num_hidden_layers=3, hidden_size=96, max_position_embeddings=4096,
    )  # fmt: skip
    return {"small": small, "large": large}
