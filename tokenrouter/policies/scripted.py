"""ScriptedRouter: a seeded script of which model writes each token, for benchmarks on random weights.

With random weights a logit-based policy decides arbitrarily (issue 53: on the demo pair's shapes
RStitch handed off about a tenth of the tokens; with the real weights the large model writes 68%
of them), so a speed figure taken so measures another regime. This policy decides without looking at the
logits: a two-state Markov chain over the writer (small, large) whose stationary large share and
per-token switch rate are given, so that a routed run on random weights does the work the real
pair's routing does. It is not a routing algorithm; never serve it for quality.

It goes through RStitch's mechanics, so a hand-off costs what RStitch's does: the small model
writes; where the script says "large" its token is discarded and the large model writes that
position; the large model keeps every token and the script says who writes the next one.

The script of a request is a function of (seed, prompt tokens, position) only: not of request ids
(uuids in the benchmarks), request seeds, batches or timing. So a run is reproducible, and every
serving system of a benchmark (routed, lockstep, standard) routes each request alike. Two
requests with the same prompt (n > 1 samples too) get the same script.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from .base import PeerMessage, Policy, Route, StepResult
from .fields import HISTORY

# The demo pair (Qwen2.5-Coder-0.5B/1.5B-Instruct, Q4_K_M) under RStitch(tau=0.03) on
# benchmarks/engine/bench_routing.py's 16 coding questions, greedy, 64 tokens each, one at a time on
# CPU: the large model wrote 701 of the 1024 tokens, with 450 hand-offs (the bench's count:
# moves of a request). benchmarks/quality/calibrate_scripted_router.py measured it; the raw run is
# benchmarks/results/scripted-router/calibration.json.
DEMO_LARGE_SHARE = 701 / 1024
DEMO_HANDOFF_RATE = 450 / 1024

_PROMPT = "scripted_prompt"  # (key, prompt length): the request's identity, computed once
_RESUME = "scripted_resume"  # the position where the large model handed the request back

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's step
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def uniforms(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """u in [0, 1) per (key, position): the splitmix64 stream of `key`, at `position`."""
    with np.errstate(over="ignore"):
        z = _mix(keys.astype(np.uint64) + (positions.astype(np.uint64) + np.uint64(1)) * _GAMMA)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def prompt_key(seed: int, prompt: list[int]) -> int:
    """A request's 64-bit identity: the router's seed and the prompt's tokens, hashed."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(8, "little", signed=True))
    h.update(np.asarray(prompt, dtype="<i8").tobytes())
    return int.from_bytes(h.digest(), "little")


def transition_probabilities(large_share: float, handoff_rate: float) -> tuple[float, float]:
    """(P(small -> large), P(large -> small)) per token of the chain whose stationary large share
    is s and whose stationary switch rate is h: a = h / 2(1 - s), b = h / 2s (then the share is
    a / (a + b) = s and the rate (1 - s) a + s b = h). Both must be probabilities: h <= 2 min(s, 1 - s)."""
    s, h = large_share, handoff_rate
    for name, v in (("large_share", s), ("handoff_rate", h)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"ScriptedRouter: {name} must be a finite number, got {v!r}")
    if not 0.0 < s < 1.0:
        raise ValueError(f"ScriptedRouter: large_share must be in (0, 1) (use Single for one model), got {s}")
    limit = 2.0 * min(s, 1.0 - s)
    if not 0.0 < h <= limit + 1e-12:  # 2 * (1 - 0.9) is 0.19999999999999996
        raise ValueError(
            f"ScriptedRouter: handoff_rate must be in (0, 2 * min(large_share, 1 - large_share)] = (0, {limit:g}] "
            f"for large_share={s:g} (each run of one writer lasts at least a token), got {h}"
        )
    return min(1.0, h / (2.0 * (1.0 - s))), min(1.0, h / (2.0 * s))


class ScriptedRouter(Policy):
    """Routes by a seeded two-state Markov chain, blind to the logits: for benchmarks on random
    weights, where entropy-based routing is arbitrary (module docstring).

    The chain starts where the engine starts a request, on the small model; per token it switches
    small -> large with probability a and large -> small with b (`transition_probabilities`).
    Here every hand-off (a move of the request, as `RequestOutput.num_handoffs` and the bench
    count them) is a change of writer, the entry included: over long requests the large model
    writes `large_share` of the tokens and there are `handoff_rate` hand-offs per token. So the
    small model steps once per token it keeps and once per move to the large model, the large
    model once per token, as under RStitch with the same counts. (RStitch also moves a request
    to the small model and straight back when the small model's token is unsure: a hand-off
    pair that changes no writer. The script has no such bounces; its runs are shorter instead.)
    """

    requires = frozenset({HISTORY})  # the prompt, once per request: the request's identity

    def __init__(
        self, large_share: float, handoff_rate: float, seed: int = 0, small: str = "small", large: str = "large"
    ):
        if small == large:
            raise ValueError("ScriptedRouter: small and large must be different models")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"ScriptedRouter: seed must be an int, got {seed!r}")
        self.to_large, self.to_small = transition_probabilities(large_share, handoff_rate)
        self.large_share = float(large_share)
        self.handoff_rate = float(handoff_rate)
        self.seed = seed
        self.small = small
        self.large = large

    @classmethod
    def demo_pair(cls, seed: int = 0, small: str = "small", large: str = "large") -> ScriptedRouter:
        """The demo pair's measured regime under RStitch(tau=0.03) (DEMO_LARGE_SHARE, DEMO_HANDOFF_RATE)."""
        return cls(DEMO_LARGE_SHARE, DEMO_HANDOFF_RATE, seed=seed, small=small, large=large)

    @property
    def models(self) -> list[str]:
        return [self.small, self.large]

    def _identities(self, result: StepResult, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's key, and the position the large model handed it back at (-1: none): two
        reads of its state per row (the decisions are vectorised). A request's key is hashed
        from its prompt on its first step, then travels in its state."""
        keys, resume = [], []
        for i, state in enumerate(result.states):
            ident = state.get(_PROMPT)
            if ident is None:
                history = result.history[i]
                length = len(history) - int(position[i])
                ident = state[_PROMPT] = (prompt_key(self.seed, history[:length]), length)
            keys.append(ident[0])
            resume.append(state.get(_RESUME, -1))
        return np.array(keys, dtype=np.uint64), np.array(resume, dtype=np.int64)

    def route(self, result: StepResult) -> Route:
        # Everything here is on the host already (num_generated, the states): no device read.
        position = result.num_generated.cpu().numpy().astype(np.int64)
        keys, resume = self._identities(result, position)
        if result.model_index == 0:  # small: its token's position p
            # Handed back here, the large model has drawn this position already (small); else the
            # chain leaves small with probability a.
            large = (uniforms(keys, position) < self.to_large) & (resume != position)
            keep = torch.from_numpy(~large)
            return Route(keep=keep, next_model=torch.from_numpy(large.astype(np.int64)))
        # large: it keeps its token; the chain at the next position leaves large with probability b
        back = uniforms(keys, position + 1) < self.to_small
        n = len(result)
        return Route(keep=torch.ones(n, dtype=torch.bool), next_model=torch.from_numpy((~back).astype(np.int64)))

    def send(self, msg: PeerMessage, state: dict) -> PeerMessage:
        """Carry the identity; from the large model, also the position the small one resumes at."""
        msg.fields.update(state)
        if msg.source == self.large and _PROMPT in state:
            msg.fields[_RESUME] = msg.start + len(msg.tokens) - state[_PROMPT][1]
        return msg

    def __repr__(self) -> str:
        return (
            f"ScriptedRouter(large_share={self.large_share:g}, handoff_rate={self.handoff_rate:g}, "
            f"seed={self.seed}, small={self.small!r}, large={self.large!r})"
        )
