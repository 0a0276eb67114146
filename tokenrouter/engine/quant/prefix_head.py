"""An output head that scores only the first rows of the vocabulary: a cheaper draft model.

A drafter's output head is a large share of its step: the demo 0.5B's 151,936 x 896 head is
145 MB of the 392 MB a decode step reads. A byte-level BPE vocabulary is numbered in merge order,
which follows frequency, so its first ids are the common tokens (the first 32,768 of Qwen2's are
96% of HumanEval's prompts and solutions). Scoring only those, as FR-Spec does with measured
frequencies, makes every draft step cheaper; the other tokens get -inf, so the draft never
proposes them and the target, which verifies every draft, writes them itself. Lossless under a
verifying policy (the proposal distribution is what the draft's logits say); lossy for any other
use, like `quantization="int8"`.

On the GGUF block kernels' repacked layout (16 rows interleaved) the first rows of a head are a
prefix of its bytes, so the narrow head reads them in place: no copy.
"""

from __future__ import annotations

import logging

import torch

from . import gguf_native
from .gguf_blocks import GGUFBlockLinear

log = logging.getLogger(__name__)


class PrefixHead(torch.nn.Module):
    """`head` computing only its first `rows` outputs; the others are -inf."""

    def __init__(self, head: torch.nn.Module, rows: int):
        super().__init__()
        if not isinstance(head, GGUFBlockLinear) and type(head) is not torch.nn.Linear:
            raise TypeError(f"a {type(head).__name__} head cannot be narrowed (GGUF blocks or a dense Linear can)")
        vocab = head.out_features
        if not 1 <= rows < vocab:
            raise ValueError(f"draft_vocab must be in [1, {vocab - 1}] for a vocabulary of {vocab}, got {rows}")
        self.head, self.rows = head, rows
        self.in_features, self.out_features = head.in_features, vocab
        self.weight = head.weight  # its shape, for whoever reads it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if isinstance(self.head, GGUFBlockLinear):
            h = self.head
            bias = None if h.bias is None else h.bias[: self.rows]
            part = gguf_native.matmul(
                h.lib, h.kind, h.blocks, (self.rows, self.in_features), flat.contiguous(), bias, True
            )
        else:
            bias = None if self.head.bias is None else self.head.bias[: self.rows]
            part = torch.nn.functional.linear(flat, self.head.weight[: self.rows], bias)
        out = torch.full((flat.shape[0], self.out_features), float("-inf"), dtype=part.dtype)
        out[:, : self.rows] = part
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"first {self.rows} of {self.out_features} rows"


def narrow_head(model: torch.nn.Module, rows: int) -> str:
    """Replace `model`'s output head by its first `rows` rows; "" where done, else why not (the
    full head then serves)."""
    head = model.get_output_embeddings()
    try:
        narrow = PrefixHead(head, rows)
    except TypeError as e:
        log.warning("draft_vocab=%d not applied, the full head serves: %s", rows, e)
        return str(e)
    model.set_output_embeddings(narrow)
    return ""
