"""What the caller keeps of a model that lives in a Ray actor.

The engine reads a few facts of each loaded model in the caller's process: the tokenizer
(prompts in, text out, grammars), the vocabulary size, EOS ids, the context length, dtype and
device; and a policy's `validate` may check that a learned router was trained for these models
(`policies/routers.py`: hidden size, vocabulary and a fingerprint of the first embedding rows).
The actor sends them once, when its model has loaded (`ModelFacts`); its weights stay there.
`ModelView` is the module `LoadedModel.model` holds for such a model: its config, its first
input-embedding rows (what a fingerprint reads), and its output embedding's shape on torch's
meta device. It cannot run: a forward raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelSpec
from ..engine import LoadedModel

FINGERPRINT_ROWS = 16


@dataclass(frozen=True)
class ModelFacts:
    """A loaded model's facts, sent by its actor (plain data and the tokenizer)."""

    name: str
    spec: ModelSpec  # as resolved on the actor's node
    tokenizer: object
    dtype: str  # "float32", ...
    device: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    linear_kernel: str
    config: object  # the model's transformers config
    embedding_rows: torch.Tensor  # the first FINGERPRINT_ROWS rows of its input embedding, on CPU
    output_shape: tuple[int, int]  # its output embedding's (vocabulary, hidden)
    capacity_tokens: int
    torch_threads: int | None
    host: str

    @classmethod
    def of(cls, loaded: LoadedModel, capacity_tokens: int, torch_threads: int | None, host: str) -> ModelFacts:
        model = loaded.model
        rows = model.get_input_embeddings().weight[:FINGERPRINT_ROWS].detach().to("cpu").clone()
        out = model.get_output_embeddings().weight
        return cls(
            name=loaded.name,
            spec=loaded.spec,
            tokenizer=loaded.tokenizer,
            dtype=str(loaded.dtype).removeprefix("torch."),
            device=str(loaded.device),
            vocab_size=loaded.vocab_size,
            max_model_len=loaded.max_model_len,
            eos_token_ids=frozenset(loaded.eos_token_ids),
            linear_kernel=loaded.linear_kernel,
            config=model.config,
            embedding_rows=rows,
            output_shape=(int(out.shape[0]), int(out.shape[1])),
            capacity_tokens=capacity_tokens,
            torch_threads=torch_threads,
            host=host,
        )

    def loaded(self, spec: ModelSpec) -> LoadedModel:
        """The caller's `LoadedModel` of it; `spec` is the engine's own (with its placement)."""
        return LoadedModel(
            name=self.name,
            spec=spec,
            model=ModelView(self),
            tokenizer=self.tokenizer,
            dtype=getattr(torch, self.dtype),
            device=torch.device(self.device),
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
            linear_kernel=self.linear_kernel,
        )


class _Weight(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)


class ModelView(nn.Module):
    """A model in a Ray actor, as far as the caller may look at it: config, the embedding rows a
    router's fingerprint reads, the output embedding's shape. It holds no other weight."""

    def __init__(self, facts: ModelFacts):
        super().__init__()
        self.name = facts.name
        self.config = facts.config
        self.input_rows = _Weight(facts.embedding_rows)
        self.output_meta = _Weight(torch.empty(facts.output_shape, device="meta", dtype=facts.embedding_rows.dtype))

    def get_input_embeddings(self) -> nn.Module:
        return self.input_rows

    def get_output_embeddings(self) -> nn.Module:
        return self.output_meta

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"model {self.name!r} runs in a Ray actor; its weights are not in this process")
