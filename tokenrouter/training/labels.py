"""The saved labels: a `Labels` object, one row per response token of the labelled examples
(labelling.py makes them), and its summary. A `Labels` object is saved as a directory
(`tokenrouter label --out DIR`):

- `labels.safetensors`: the tensors, one row per response token (N rows, M models, H the small
  model's hidden size, K = 100):
  `greedy` int64 [N, M], `entropy` float32 [N, M], `sufficient` int64 [N], `token` int64 [N] (the
  reference token), `hidden` float32 [N, H], `token_embedding` float32 [N, H], `top_logprobs`
  float32 [N, K], `example` int64 [N] (index of the example), `position` int64 [N] (index of the
  token in the example's response);
- `labels.json`: the models (name, path, `ModelIdentity`, number of parameters), the number of
  examples, the dtype, the source and `summary(labels)`.

Apart from the labelling because what reads labels (router training, benchmarks) loads no model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from ..files import atomic_path, write_text_atomic
from ..policies import ModelIdentity, read_saved

LABELS_FILE = "labels.safetensors"
META_FILE = "labels.json"
FORMAT = "tokenrouter-labels"
VERSION = 1
HARDEST_FRACTION = 0.1  # summary: the FLOPs share taken by the hardest 10% of tokens

# name -> (dtype, shape suffix: "M" models, "H" hidden size, "K" top-k)
_TENSORS = {
    "greedy": (torch.int64, ("M",)),
    "entropy": (torch.float32, ("M",)),
    "sufficient": (torch.int64, ()),
    "token": (torch.int64, ()),
    "hidden": (torch.float32, ("H",)),
    "token_embedding": (torch.float32, ("H",)),
    "top_logprobs": (torch.float32, ("K",)),
    "example": (torch.int64, ()),
    "position": (torch.int64, ()),
}


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    path: str
    identity: ModelIdentity
    num_parameters: int = Field(ge=1)


class LabelsMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["tokenrouter-labels"] = FORMAT
    version: int = VERSION
    models: list[ModelEntry] = Field(min_length=1)
    num_examples: int = Field(ge=0)
    top_k: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    dtype: str = "float32"
    max_tokens_per_example: int | None = None
    source: str = ""
    summary: dict = Field(default_factory=dict)


@dataclass
class Labels:
    """One row per response token of the labelled examples (see the module docstring)."""

    model_names: list[str]
    model_paths: list[str]
    identities: list[ModelIdentity]
    num_parameters: list[int]
    greedy: torch.Tensor  # [N, M] int64: each model's greedy token
    entropy: torch.Tensor  # [N, M] float32: each model's normalized entropy
    sufficient: torch.Tensor  # [N] int64: smallest model index whose greedy token is the largest's
    token: torch.Tensor  # [N] int64: the reference token at this position
    hidden: torch.Tensor  # [N, H] float32: the small model's last hidden state
    token_embedding: torch.Tensor  # [N, H] float32: the small model's input embedding of its greedy token
    top_logprobs: torch.Tensor  # [N, K] float32: the small model's top-K log-probabilities, descending
    example: torch.Tensor  # [N] int64: example index
    position: torch.Tensor  # [N] int64: index of the token in the example's response
    num_examples: int
    dtype: str = "float32"
    max_tokens_per_example: int | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self._check()

    def __len__(self) -> int:
        return int(self.sufficient.shape[0])

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def top_k(self) -> int:
        return int(self.top_logprobs.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.hidden.shape[1])

    @property
    def hard(self) -> torch.Tensor:
        """[N] bool: the smallest model does not suffice."""
        return self.sufficient > 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in _TENSORS}

    def _check(self) -> None:
        m = len(self.model_names)
        if not (m == len(self.model_paths) == len(self.identities) == len(self.num_parameters)) or m < 2:
            raise ConfigError("labels: need two or more models, each with a name, path, identity and parameter count")
        n = int(self.sufficient.shape[0]) if self.sufficient.dim() == 1 else -1
        h = int(self.hidden.shape[-1]) if self.hidden.dim() == 2 else -1
        k = int(self.top_logprobs.shape[-1]) if self.top_logprobs.dim() == 2 else -1
        sizes = {"M": m, "H": h, "K": k}
        for name, (dtype, suffix) in _TENSORS.items():
            t = getattr(self, name)
            want = (n, *(sizes[s] for s in suffix))
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != want:
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ConfigError(f"labels: tensor {name!r} should be {dtype} of shape {want}, got {got}")
        if n and (int(self.sufficient.min()) < 0 or int(self.sufficient.max()) >= m):
            raise ConfigError(f"labels: 'sufficient' must hold model indices in [0, {m})")
        if n and (int(self.example.min()) < 0 or int(self.example.max()) >= self.num_examples):
            raise ConfigError(f"labels: 'example' must hold example indices in [0, {self.num_examples})")

    # ---- files ---------------------------------------------------------------------------------------
    def meta(self) -> LabelsMeta:
        return LabelsMeta(
            models=[
                ModelEntry(name=n, path=p, identity=i, num_parameters=c)
                for n, p, i, c in zip(self.model_names, self.model_paths, self.identities, self.num_parameters)
            ],
            num_examples=self.num_examples,
            top_k=self.top_k,
            hidden_size=self.hidden_size,
            dtype=self.dtype,
            max_tokens_per_example=self.max_tokens_per_example,
            source=self.source,
            summary=summary(self),
        )

    def save(self, directory: str | Path) -> Path:
        """Write `labels.safetensors` and `labels.json` into `directory` (created if needed)."""
        from safetensors.torch import save_file

        out = Path(directory)
        with atomic_path(out / LABELS_FILE) as tmp:
            save_file({k: v.contiguous() for k, v in self.tensors().items()}, tmp, metadata={"format": FORMAT})
        write_text_atomic(out / META_FILE, self.meta().model_dump_json(indent=2) + "\n")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> Labels:
        """Read a directory written by `save`; every problem is a ConfigError naming the file."""
        path = Path(directory)
        meta, tensors, meta_path, tensors_path = read_saved(
            path, "labels", META_FILE, LABELS_FILE, LabelsMeta, "tokenrouter label"
        )
        if meta.version != VERSION:
            raise ConfigError(
                f"labels: {meta_path} has format version {meta.version}; this tokenrouter reads {VERSION}"
            )
        missing = sorted(set(_TENSORS) - set(tensors))
        if missing:
            raise ConfigError(f"labels: {tensors_path} lacks the tensors {missing}")
        try:
            labels = cls(
                model_names=[m.name for m in meta.models],
                model_paths=[m.path for m in meta.models],
                identities=[m.identity for m in meta.models],
                num_parameters=[m.num_parameters for m in meta.models],
                num_examples=meta.num_examples,
                dtype=meta.dtype,
                max_tokens_per_example=meta.max_tokens_per_example,
                source=meta.source,
                **{k: tensors[k] for k in _TENSORS},
            )
        except ConfigError as e:
            raise ConfigError(f"{e} (in {path})") from None
        if labels.top_k != meta.top_k or labels.hidden_size != meta.hidden_size:
            raise ConfigError(f"labels: {tensors_path} does not match {meta_path} (top-k or hidden size differ)")
        return labels


# ---- the summary -----------------------------------------------------------------------------------
def summary(labels: Labels) -> dict:
    """Examples and tokens; the share of tokens each model suffices for; and the share of the
    estimated FLOPs (2 x parameters per token, of the sufficient model) that the hardest 10% of
    tokens take (tokens sorted by sufficient model, largest first; ties in example, position
    order; ceil(10% of the tokens))."""
    n = len(labels)
    suff = labels.sufficient
    counts = torch.bincount(suff, minlength=labels.num_models).tolist() if n else [0] * labels.num_models
    flops = 2.0 * torch.tensor(labels.num_parameters, dtype=torch.float64)[suff] if n else torch.zeros(0)
    hardest = math.ceil(HARDEST_FRACTION * n)
    if n:
        # fixed order: sufficient descending, then example, then position (lexsort by stable sorts)
        order = torch.argsort(labels.position, stable=True)
        order = order[torch.argsort(labels.example[order], stable=True)]
        order = order[torch.argsort(suff[order], descending=True, stable=True)]
        share = float(flops[order[:hardest]].sum() / flops.sum())
    else:
        share = 0.0
    return {
        "examples": labels.num_examples,
        "tokens": n,
        "sufficient_share": {m: (c / n if n else 0.0) for m, c in zip(labels.model_names, counts)},
        "sufficient_tokens": dict(zip(labels.model_names, counts)),
        "hardest_fraction": HARDEST_FRACTION,
        "hardest_tokens": hardest,
        "hardest_flops_share": share,
        "flops_per_token": {m: 2 * p for m, p in zip(labels.model_names, labels.num_parameters)},
    }


__all__ = ["HARDEST_FRACTION", "LABELS_FILE", "META_FILE", "Labels", "LabelsMeta", "ModelEntry", "summary"]
