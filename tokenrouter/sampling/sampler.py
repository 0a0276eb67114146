"""Batched sampling: greedy, temperature, top-k, top-p, min-p, reproducible per request, and the
log-probabilities of the distribution each token was drawn from.

Each row draws one uniform number from a hash of (request seed, output position) and samples by
inverse CDF. The draw depends on nothing else, so a seeded request gives the same tokens whatever
else shares its batch, and no per-request generator object is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .greedy import argmax

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values < 2**32 (no int64 overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 16)


def uniform_from(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Deterministic uniforms in (0, 1) from int64 seeds and steps, float64."""
    lo = _mix32((seeds & _MASK32) ^ _mix32(steps & _MASK32))
    hi = _mix32(((seeds >> 32) & _MASK32) ^ _mix32(lo ^ 0x5BD1E995))
    bits = ((hi & 0x1FFFFF) << 32) | lo  # 53 random bits
    return (bits.to(torch.float64) + 0.5) / float(2**53)


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # [B] float32, 0 for greedy rows
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] float32
    min_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64
    steps: torch.Tensor  # [B] int64 index of the token being sampled in the output
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool

    @classmethod
    def build(cls, params: list, seeds: list[int], steps: list[int], device) -> SamplingTensors:
        """Two copies to the device, one of the float fields and one of the integer ones (each
        copy from the host waits for the device's queued work)."""
        temps = [p.temperature for p in params]
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        floats = torch.tensor([temps, top_p, min_p], dtype=torch.float32, device=device)
        ints = torch.tensor([top_k, seeds, steps], dtype=torch.long, device=device)
        return cls(
            temperature=floats[0],
            top_k=ints[0],
            top_p=floats[1],
            min_p=floats[2],
            seeds=ints[1],
            steps=ints[2],
            all_greedy=all(t == 0.0 for t in temps),
            any_top_k=any(k > 0 for k in top_k),
            any_top_p=any(p < 1.0 for p in top_p),
            any_min_p=any(p > 0.0 for p in min_p),
        )


class Sampler:
    def __call__(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        greedy_tokens = argmax(logits)
        if st.all_greedy:
            return greedy_tokens
        greedy = st.temperature == 0
        probs = self.probs(logits, st)
        cdf = probs.cumsum(dim=-1)
        u = uniform_from(st.seeds, st.steps).to(cdf.dtype) * cdf[:, -1]
        sampled = torch.searchsorted(cdf, u[:, None], right=True).squeeze(1)
        sampled = sampled.clamp_(max=logits.shape[-1] - 1)
        return torch.where(greedy, greedy_tokens, sampled)

    def probs(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        """The distribution each row samples from, float32, unnormalised after min-p (a greedy row's
        is its softmax at temperature 1: such rows take the argmax instead)."""
        greedy = st.temperature == 0
        x = logits.float() / torch.where(greedy, 1.0, st.temperature)[:, None]
        if st.any_top_k or st.any_top_p:
            x = self._top_k_top_p(x, st)
        probs = torch.softmax(x, dim=-1)
        if st.any_min_p:
            floor = probs.amax(dim=-1, keepdim=True) * st.min_p[:, None]
            probs = torch.where(probs < floor, 0.0, probs)
        return probs

    def logprobs(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        """Log-probabilities of the distribution each row's token is drawn from, in the logits'
        dtype (at least float32): a greedy row's log-softmax of its logits as they are (what
        Hugging Face's `output_scores` holds); a sampled row's log-softmax of its logits over
        the temperature, on the tokens `probs` leaves it (-inf for those top-k, top-p and min-p
        drop), so the values are those of the draw itself."""
        dtype = torch.promote_types(logits.dtype, torch.float32)
        x = logits.to(dtype)
        if st.all_greedy:
            return torch.log_softmax(x, dim=-1)
        greedy = st.temperature == 0
        x = x / torch.where(greedy, 1.0, st.temperature).to(dtype)[:, None]
        support = self.probs(logits, st) > 0
        x = torch.where(support | greedy[:, None], x, float("-inf"))
        return torch.log_softmax(x, dim=-1)

    @staticmethod
    def _top_k_top_p(x: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        sorted_x, order = x.sort(dim=-1, descending=True)
        vocab = x.shape[-1]
        rank = torch.arange(vocab, device=x.device)[None, :]
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        if st.any_top_k:
            k = torch.where(st.top_k > 0, st.top_k, vocab)[:, None]
            drop |= rank >= k
        if st.any_top_p:
            probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
            before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
            drop |= before >= st.top_p[:, None]
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        return torch.empty_like(x).scatter_(-1, order, sorted_x)
