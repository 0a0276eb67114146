"""FLOPs per token of a model, for the relative cost of a routed system.

A forward pass costs about 2 FLOPs per weight that multiplies the token: 2 x (parameters - the
input embedding table). The embedding table is a lookup and costs nothing; the output head is a
matmul and counts, whether or not it is tied to the embedding. Attention over the context
(2 x layers x context x width) is left out: at HumanEval's lengths (a few hundred tokens) it is a
few percent of the total, and the ratio to the large model's cost hardly moves with it.

The parameters are counted from the checkpoint's own tensor shapes (safetensors headers, or the
GGUF's tensor table), read without loading a weight.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import ConfigError

EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "token_embd.weight")
HEAD_NAMES = ("lm_head.weight", "output.weight", "embed_out.weight")


def _shapes_safetensors(directory: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                shapes[key] = tuple(st.get_slice(key).get_shape())
    return shapes


def _shapes_gguf(path: Path) -> dict[str, tuple[int, ...]]:
    from ..engine import tensor_places

    return {name: t.shape for name, t in tensor_places(Path(path)).items()}


def parameter_counts(path: str | Path) -> dict[str, int]:
    """{"total", "embedding", "head"} of a Hugging Face directory or a .gguf file (tied heads: 0)."""
    from .. import store

    path = Path(path)
    if path.is_dir():
        shapes = _shapes_safetensors(path)
        gguf = sorted(path.glob("*.gguf")) or [g for g in [store.gguf_for(path)] if g is not None]
        if not shapes and gguf:
            shapes = _shapes_gguf(gguf[0])
    elif path.suffix == ".gguf":
        shapes = _shapes_gguf(path)
    else:
        raise ConfigError(f"{path}: not a model directory or a .gguf file")
    if not shapes:
        raise ConfigError(f"{path}: no safetensors or GGUF weights to count parameters from")
    total = sum(math.prod(s) for s in shapes.values())
    embedding = sum(math.prod(s) for k, s in shapes.items() if k.endswith(EMBEDDING_NAMES))
    head = sum(math.prod(s) for k, s in shapes.items() if k.endswith(HEAD_NAMES))
    if not embedding:
        raise ConfigError(f"{path}: cannot tell which tensor is the token embedding (looked for {EMBEDDING_NAMES})")
    return {"total": total, "embedding": embedding, "head": head}


def flops_per_token(path: str | Path) -> int:
    """2 x the parameters that multiply a token: everything but the input embedding, with the
    output head counted once (tied to the embedding or not)."""
    c = parameter_counts(path)
    matmul = c["total"] - c["embedding"] + (0 if c["head"] else c["embedding"])  # a tied head still multiplies
    return 2 * matmul


def describe(path: str | Path) -> str:
    """A short description of a model for the report: the store's words when it is a store model,
    else its config's architecture and size."""
    from .. import store

    path = Path(path)
    for name, source in store.MODELS.items():
        try:
            if path.resolve() == store.model_dir(name).resolve():
                return f"{source.description}; its GGUF (`{name}` in the store)"
        except OSError:
            continue
    config = path / "config.json" if path.is_dir() else None
    if config is not None and config.is_file():
        try:
            c = json.loads(config.read_text())
            return f"{path.name} ({c.get('model_type', '?')}, {c.get('num_hidden_layers', '?')} layers)"
        except (OSError, ValueError):
            pass
    return path.name
