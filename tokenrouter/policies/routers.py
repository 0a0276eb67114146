"""The router networks of the learned policies: small MLPs over the small model's step features.

Their published weights cannot be had here (nor would they fit our models), so the project
trains them itself (`tokenrouter label`, then `tokenrouter train-router`). A router is saved as a
directory: `router.safetensors` (the weights) and `router.json` (a `RouterConfig`: the kind, the
input sizes, the decision threshold picked at training, the model pair it was trained for and
its held-out metrics). Loading checks all of it, so a corrupt or foreign router fails when the
policy is built or the engine starts, never mid-request.

- CITER: confidence that the small model's token is right, from its last hidden state.
- R2R: probability that the small model's token diverges from the large model's, from the last
  hidden state, the sampled token's embedding and the top-100 log-probabilities.
- CoLLM: deferral probability from the small (base) model's last hidden state.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from ..errors import ConfigError
from ..files import atomic_path, write_text_atomic

RouterKind = Literal["citer", "r2r", "collm"]
R2R_TOP_K = 100
CONFIG_FILE = "router.json"
WEIGHTS_FILE = "router.safetensors"


class ModelIdentity(BaseModel):
    """Enough of a model to tell whether a router was trained for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    fingerprint: str = Field(min_length=16, max_length=64)  # hash of its first embedding rows


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: RouterKind
    hidden_size: int = Field(ge=1)
    top_k: int = Field(R2R_TOP_K, ge=1)
    width: int = Field(256, ge=1)
    projection: int = Field(8, ge=1)  # each hidden-size input is projected to this many features
    dropout: float = Field(0.5, ge=0.0, lt=1.0)  # on the projected features, while training
    threshold: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    small: ModelIdentity
    large: ModelIdentity
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def input_size(self) -> int:
        return 2 * self.hidden_size + self.top_k if self.kind == "r2r" else self.hidden_size


def model_identity(model: torch.nn.Module) -> ModelIdentity:
    """Hidden size, vocabulary and a fingerprint of a model's weights (its first 16 embedding rows,
    as float32), so that a router trained on another model of the same shape is caught too."""
    emb = model.get_input_embeddings().weight
    rows = emb[:16].detach().to("cpu", torch.float32).contiguous()
    digest = hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]
    return ModelIdentity(
        hidden_size=emb.shape[1], vocab_size=model.get_output_embeddings().weight.shape[0], fingerprint=digest
    )


def router_features(
    kind: str, hidden: torch.Tensor, token_embedding: torch.Tensor | None, logits: torch.Tensor | None, top_k: int
) -> torch.Tensor:
    """The router's input rows, [B, input_size], from a batch's step features (any float dtype)."""
    hidden = hidden.float()
    if kind != "r2r":
        return hidden
    assert token_embedding is not None and logits is not None
    top = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1).values  # sorted, most likely first
    return torch.cat([hidden, token_embedding.float(), top], dim=-1)


class RouterNet(nn.Module):
    """The router: one logit per row (its sigmoid is the router's probability).

    Each hidden-size input (the hidden state; for R2R also the token embedding) is layer-normed
    and projected to a few features, with dropout while training. A labelled set of ~20k tokens
    cannot fit 896- or 1536-wide inputs without overfitting: unprojected, held-out AUC on the demo
    pair fell from 0.98 (train) to 0.80. R2R's top-k log-probabilities go in as they are (clamped
    at -30, scaled by 1/10), since their absolute values say how sure the model is. Then a
    two-layer MLP."""

    def __init__(self, config: RouterConfig):
        super().__init__()
        self.config = config
        h, d = config.hidden_size, config.projection
        self.num_wide = 2 if config.kind == "r2r" else 1
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(self.num_wide))
        self.projections = nn.ModuleList(nn.Linear(h, d) for _ in range(self.num_wide))
        self.dropout = nn.Dropout(config.dropout)
        inputs = self.num_wide * d + (config.top_k if config.kind == "r2r" else 0)
        self.mlp = nn.Sequential(
            nn.Linear(inputs, config.width),
            nn.GELU(),
            nn.Linear(config.width, config.width),
            nn.GELU(),
            nn.Linear(config.width, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h = self.config.hidden_size
        wide = features[..., : self.num_wide * h].split(h, dim=-1)
        parts = [self.dropout(proj(norm(x))) for norm, proj, x in zip(self.norms, self.projections, wide)]
        if self.config.kind == "r2r":
            parts.append(features[..., self.num_wide * h :].clamp(min=-30.0) / 10.0)
        return self.mlp(torch.cat(parts, dim=-1)).squeeze(-1)

    @torch.no_grad()
    def probability(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.forward(features.to(next(self.parameters()).dtype)))


def save_router(net: RouterNet, directory: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(directory)
    state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    with atomic_path(out / WEIGHTS_FILE) as tmp:
        save_file(state, tmp, metadata={"format": "pt", "kind": net.config.kind})
    write_text_atomic(out / CONFIG_FILE, net.config.model_dump_json(indent=2) + "\n")
    return out


def read_saved(directory: str | Path, what: str, meta_file: str, tensors_file: str, meta_model, hint: str):
    """(validated metadata, tensors, metadata path, tensors path) of a directory holding a JSON
    metadata file and a safetensors file (a router, or labels); every problem is a ConfigError
    that names the file. `hint` says which command writes such a directory."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"{what}: {path} is not a directory (expected {meta_file} and {tensors_file})")
    meta_path, tensors_path = path / meta_file, path / tensors_file
    if not meta_path.is_file():
        raise ConfigError(f"{what}: {meta_path} is missing; was it written by `{hint}`?")
    try:
        meta = meta_model.model_validate(json.loads(meta_path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as e:
        raise ConfigError(f"{what}: {meta_path} is not a valid {what} file: {_one_line(e)}") from None
    if not tensors_path.is_file():
        raise ConfigError(f"{what}: {tensors_path} is missing")
    try:
        tensors = load_file(tensors_path)
    except (SafetensorError, OSError, ValueError) as e:
        raise ConfigError(f"{what}: {tensors_path} is corrupt: {_one_line(e)}") from None
    return meta, tensors, meta_path, tensors_path


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def load_router(directory: str | Path, kind: RouterKind) -> RouterNet:
    """Load and check a saved router; every problem is a ConfigError naming the file."""
    config, state, config_path, weights_path = read_saved(
        directory, "router", CONFIG_FILE, WEIGHTS_FILE, RouterConfig, "tokenrouter train-router"
    )
    if config.kind != kind:
        raise ConfigError(f"router: {Path(directory)} holds a {config.kind!r} router, not a {kind!r} one")
    net = RouterNet(config)
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(f"router: {weights_path} does not match {config_path}: {_one_line(e)}") from None
    return net.eval()


def check_pair(net: RouterNet, small: torch.nn.Module, large: torch.nn.Module, names: tuple[str, str]) -> None:
    """The router must have been trained for exactly these two models."""
    for role, model, want in (("small", small, net.config.small), ("large", large, net.config.large)):
        have = model_identity(model)
        if have != want:
            raise ConfigError(
                f"router: trained for a {role} model with hidden size {want.hidden_size}, vocabulary "
                f"{want.vocab_size} and fingerprint {want.fingerprint}, but {names[role == 'large']!r} has "
                f"{have.hidden_size}, {have.vocab_size} and {have.fingerprint}; train a router for this pair"
            )
