"""Sampling, in torch only: the logits processor (penalties, a grammar's mask), the batched
sampler and the logprob records."""

from .greedy import argmax
from .logits_processor import LogitsRow, process_logits
from .logprobs import token_logprobs
from .penalties import penalize_rows
from .sampler import Sampler, SamplingTensors, uniform_from

__all__ = ["LogitsRow", "Sampler", "SamplingTensors", "penalize_rows", "process_logits", "token_logprobs"]
__all__ += ["argmax", "uniform_from"]
