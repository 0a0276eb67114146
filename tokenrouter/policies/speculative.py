"""Speculative decoding as a verifying policy: the draft model writes k tokens, the target's
catch-up step over them (which it computes anyway) verifies them, and the target writes the next
token itself. Lossless: the output is the target's alone.

Greedy: a draft is accepted while it is the target's argmax. Sampling (Leviathan et al. 2023;
Chen et al. 2023): draft x, drawn from the draft's distribution q, is accepted with probability
min(1, p(x) / q(x)) under the target's p; the first rejected position is redrawn from the
normalised max(0, p - q), and after k accepted drafts the target draws one more from p. The
output is then distributed as the target's. Every draw is seeded by the request's seed and the
position, so a seeded request is reproducible.

`k="auto"` picks the draft length from the acceptance rate seen lately and the two models'
step-latency profiles: a cycle of k drafts yields (1 - a^(k+1)) / (1 - a) tokens for k draft
steps and one verify step of k + 1 tokens per request, against one token per target step
alone; k = 0 (the target writes alone) wins when the batch is large enough that verifying costs
what it would cost the target to write the tokens itself. The batch it plans for is every
request in flight, wherever it is: a request drafting on the small model comes back to the
target's batch, so the target's step alone undercounts it. The engine tells it that count
(`use_in_flight`); without an engine, the sum of each model's latest step size stands in.
The plan sets the pace, and each request's draft stops where its own next draft stops paying:
the draft's probability that its tokens so far are all accepted, times the acceptance rate,
against the cost of one more draft step and one more token checked (`AutoDraftLength.extends`).

`lookup=True` (or a `PromptLookup`) drafts for free where the text repeats: after each token the
target writes, the request's latest tokens are looked for earlier in its prompt and output
(policies/lookup.py); where they occur, the tokens that followed are proposed on the target's own
step (`Route.proposals`) and its next step checks them, with no draft-model step; elsewhere the
draft model drafts as before. A proposal is a point mass, q(x) = 1, so speculative sampling
accepts it with probability p(x) and redraws a rejection from p without x. That is exactly "draw
from p, as the target alone would, and accept where the draw is the proposal": done so, with the
target's own seeded draw at each position, a seeded request writes the target alone's tokens
through every lookup draft, accepted or not.

With lookup, requests start on the target, and a draft model must take a request's whole
sequence in before it first drafts for it; with `k="auto"` it does so only where that pays: the
catch-up's cost, from the draft's latency profile, against what drafting saves over the tokens
the request has left to write. So a draft model that lookups leave idle never takes the prompt
in (on an agentic-edit run on the demo pair, the 0.5B's prefills of prompts it then never
drafted for had taken a fifth of the time). Without lookup the rule stays off: requests start
on the draft model where drafting pays, and held back at a dip of the acceptance estimate (which
learns only from drafts) they stopped drafting for good (30 drafted tokens of 256 where 154 paid).
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch

from ..errors import ConfigError
from ..sampling import Sampler, SamplingTensors, argmax, uniform_from
from .base import PeerMessage, Policy, Route, StepResult, Verdict, VerifyResult
from .fields import HISTORY, VERIFY
from .lookup import PromptLookup, TokenHistory

_ACCEPT_SALT = 0x5EC5A1E  # acceptance draws: independent of the sampler's own draws
_RESIDUAL_SALT = 0x2E51D0A1
_HISTORY = "lookup_history"  # the verifier's TokenHistory of a request: stays there, never sent
_DRAFT_HOLDS = "draft_holds"  # the draft model has taken the request in (it stepped on it)
_CHAIN = "draft_chain"  # k="auto": the draft's own probability that the drafts so far are all its picks
UNKNOWN_REMAINING = 256  # tokens left to a request with no max_tokens, for the catch-up's worth


class Speculative(Policy):
    requires = frozenset({VERIFY})

    def __init__(
        self,
        k: int | str = 4,
        draft: str = "small",
        target: str = "large",
        max_k: int = 8,
        lookup: bool | PromptLookup = False,
    ):
        if draft == target:
            raise ConfigError("Speculative: draft and target must be different models")
        if k == "auto":
            if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= 64:
                raise ConfigError(f"Speculative: max_k must be an int in [1, 64], got {max_k!r}")
            self.max_draft = max_k
        elif isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise ConfigError(f"Speculative: k must be an int in [1, 64] or 'auto', got {k!r}")
        else:
            self.max_draft = k
        self.k = k
        if lookup is True:
            lookup = PromptLookup()
        elif lookup is not False and not isinstance(lookup, PromptLookup):
            raise ConfigError(f"Speculative: lookup must be True, False or a PromptLookup, got {lookup!r}")
        self.lookup = lookup or None
        if self.lookup is not None:
            self.requires = frozenset({VERIFY, HISTORY})
            self.max_draft = max(self.max_draft, self.lookup.tokens or 0)
        self.draft, self.target = draft, target
        self._sampler = Sampler()
        self.auto = AutoDraftLength(self.max_draft) if k == "auto" else None
        self._last_batch: dict[str, tuple[int, float]] = {}  # per model: (rows, when) of its latest step
        self.engine_in_flight = None  # the engine's count of requests in flight (use_in_flight)

    @property
    def models(self) -> list[str]:
        return [self.draft, self.target]

    def send(self, msg: PeerMessage, state: dict) -> PeerMessage:
        msg.fields.update({key: value for key, value in state.items() if key != _HISTORY})
        return msg

    def receive(self, msg, state: dict) -> None:
        super().receive(msg, state)
        if msg.target == self.draft:  # back from the target: its drafts were all judged
            state.pop("q", None)
            state.pop(_CHAIN, None)

    @property
    def wants_profiles(self) -> bool:
        return self.auto is not None

    def use_profiles(self, profiles: dict) -> None:
        if self.auto is not None:
            draft, target = profiles[self.draft].table, profiles[self.target].table
            self.auto.use_profiles(lambda b: float(draft(b)), lambda n: float(target(n)), profiles[self.target].checks)

    def draft_length(self, batch: int) -> int:
        return self.auto.choose(batch) if self.auto is not None else self.k

    def start_model(self) -> str:
        """The target with lookup (the target writes first, and its tokens are what lookups
        search; the draft model takes the prompt in only if a miss sends the request to it), and
        when k="auto" plans no drafts at the load now: a request started on the draft model would
        have its prompt taken in there only to write one tentative token and move on (the demo
        pair at C = 16 ran at 0.92x the large model alone so)."""
        if self.lookup is not None:
            return self.target
        if self.auto is None:
            return self.draft
        return self.target if self.auto.best(self.in_flight()) == 0 else self.draft

    STALE_S = 2.0  # a model that has not stepped for this long holds no request

    def use_in_flight(self, count) -> None:
        self.engine_in_flight = count

    def __getstate__(self) -> dict:
        """The count is bound to one engine in one process (a closure over it, with its locks):
        a copy sent to a Ray actor leaves it behind, and the actor binds its own."""
        return {**self.__dict__, "engine_in_flight": None}

    def in_flight(self, model: str | None = None, rows: int = 1) -> int:
        """Requests in flight on every model: the engine's count when it gave one, else the sum
        of each model's latest step (`model`, stepping now, reports `rows`; None: a request being
        submitted, `rows` more; a model idle for STALE_S counts none). The latest steps
        undercount (a request in transit, or waiting for its turn, is in neither), which makes
        drafting look cheaper than it is at high load."""
        if self.engine_in_flight is not None:
            return max(rows, self.engine_in_flight())
        now = time.monotonic()
        if model is not None:
            self._last_batch[model] = (rows, now)
        latest = sum(n for n, t in self._last_batch.values() if now - t < self.STALE_S)
        return latest if model is not None else latest + rows

    def route(self, result: StepResult) -> Route:
        n = len(result)
        if result.model == self.draft:  # keep every draft; the k-th goes to the target
            for state, p, seed, token, row in zip(
                result.states, result.params, result.seeds, result.tokens, result.logits
            ):
                if p.temperature > 0:  # the draft's distribution, for the acceptance test
                    st = SamplingTensors.build([p], [seed], [0], row.device)
                    state.setdefault("q", []).append(self._sampler.probs(row[None], st)[0])
            if self.lookup is not None and self.auto is not None:  # what the catch-up rule reads
                for state in result.states:
                    state[_DRAFT_HOLDS] = True
            if self.auto is not None:
                due = self._draft_done(result, self.in_flight(result.model, n))
            else:
                due = result.tentative >= self.k
            # The whole step goes to the target once any of its rows is due, those with shorter
            # drafts too: so the target checks every request in one step, as vLLM's and SGLang's
            # lock-step drafting does. Rows handed to the drafter at different times (prompts
            # taken in over several steps, k changing with the load) would otherwise stay out of
            # phase for good, and each model step only part of the batch: on the demo pair at
            # 16 in flight the target stepped on 11.6 rows on average, for 0.91x its speed alone.
            move = due | (due.any() & (result.tentative >= 1))
            return Route(keep=torch.ones(n, dtype=torch.bool), next_model=move.long())
        batch = self.in_flight(result.model, n)
        k = self.draft_length(batch)  # the target's token is kept; k = 0: it goes on alone
        next_model = torch.full((n,), 0 if k else 1, dtype=torch.long)
        if k and self.auto is not None and self.lookup is not None and result.history is not None and result.params:
            # a draft model that never took the request in: drafting must repay taking in the
            # whole sequence (unknown without the history, as where a caller steps the policy
            # itself: then it drafts)
            speed = self.auto.plan(batch)[1]
            for i, (state, history, p, done) in enumerate(
                zip(result.states, result.history, result.params, result.num_generated.tolist())
            ):
                if state.get(_DRAFT_HOLDS):
                    continue
                left = (p.max_tokens if p.max_tokens is not None else UNKNOWN_REMAINING) - done - 1
                if not self.auto.catch_up_pays(len(history) + 1, left, batch, speed):
                    next_model[i] = 1
        if self.lookup is None or not k:
            return Route(keep=torch.ones(n, dtype=torch.bool), next_model=next_model)
        length = self.lookup.tokens or k
        proposals = [
            self.lookup.propose(state.setdefault(_HISTORY, TokenHistory()), history, token, length)
            for state, history, token in zip(result.states, result.history, result.tokens.tolist())
        ]
        found = torch.tensor([bool(p) for p in proposals], dtype=torch.bool)
        next_model[found] = 1  # a match: the target checks it next, no draft
        return Route(keep=torch.ones(n, dtype=torch.bool), next_model=next_model, proposals=proposals)

    def _draft_done(self, result: StepResult, batch: int) -> torch.Tensor:
        """k="auto", on a draft step: the rows whose drafting ends here. Each row's chain, the
        draft's probability of every token it drafted this cycle multiplied together, is how
        likely the target is to accept them all (greedy: the draft's softmax at its argmax; the
        demo 0.5B's is calibrated within a few points on coding answers). One more draft pays
        while it adds tokens faster than the cycle's planned speed (`AutoDraftLength.extends`):
        drafts run on while the draft is sure and stop at its first doubt, up to max_k."""
        speed = self.auto.plan(batch)[1]
        tokens = result.tokens.to(result.logits.device)
        sure = torch.softmax(result.logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0].tolist()
        done = []
        for i, (state, p, drafted) in enumerate(zip(result.states, result.params, result.tentative.tolist())):
            if p.temperature > 0:  # the distribution it drew from
                q = state["q"][-1]
                sure[i] = float(q[tokens[i]] / q.sum())
            state[_CHAIN] = chain = state.get(_CHAIN, 1.0) * sure[i]
            done.append(drafted >= self.max_draft or not self.auto.extends(chain, drafted, batch, speed))
        return torch.tensor(done, dtype=torch.bool)

    def verify(self, result: VerifyResult) -> Verdict:
        """Greedy rows compare on the drafts' device (on the host as the engine gives them: one
        read of the target's argmax); sampled rows decide on the logits' device, each with one
        read of its answer."""
        k = result.drafts.shape[1]
        here = result.drafts.device
        sampled = [p.temperature > 0 for p in result.params]
        looked_up = [source == self.target for source in result.sources]  # proposed by `lookup`
        qs = [state.pop("q", []) for state in result.states]
        accept = None
        if not all(sampled):  # greedy: accepted while the target's argmax agrees
            num_drafts = result.num_drafts.to(here)
            valid = torch.arange(k, device=here)[None, :] < num_drafts[:, None]
            target = argmax(result.logits[:, :k]).to(here)
            agree = (target == result.drafts) | ~valid
            accept = torch.where(agree.all(dim=1), num_drafts, (~agree).long().argmax(dim=1))
            if not any(sampled) and self.auto is None:
                return Verdict(accept=accept, tokens=torch.full((len(result),), -1, dtype=torch.long, device=here))
        counts, given = result.num_drafts.tolist(), [-1] * len(result)
        accepted = accept.tolist() if accept is not None else [0] * len(result)
        drafts = result.drafts.to(result.logits.device, non_blocking=True) if any(sampled) else None
        for i, n in enumerate(counts):
            if sampled[i] and looked_up[i]:
                accepted[i] = self._lookup_accept(result, i, drafts[i, :n], result.logits[i, : n + 1])
            elif sampled[i]:  # one request at a time: each has its own seed stream
                logits = result.logits[i, : n + 1]
                accepted[i], given[i] = self._sample_accept(result, i, drafts[i, :n], logits, qs[i][-n:])
            if self.auto is not None and not looked_up[i]:  # drafts after the first rejection were never judged
                self.auto.observe(accepted[i], min(n, accepted[i] + 1))
        return Verdict(accept=torch.tensor(accepted), tokens=torch.tensor(given))

    def _sample_accept(self, result: VerifyResult, i: int, drafts, logits, q: list[torch.Tensor]) -> tuple[int, int]:
        """Speculative sampling for one request: (drafts accepted, the token at the first rejection
        or -1 when all are accepted and the engine draws the next one from p). Decided on the
        logits' device; one read brings both numbers to the host."""
        n = len(drafts)
        device = logits.device
        params, seed = result.params[i], result.seeds[i]
        first = int(result.num_generated[i])
        steps = list(range(first, first + n + 1))
        st = SamplingTensors.build([params] * (n + 1), [seed] * (n + 1), steps, device)
        p = self._sampler.probs(logits, st)
        p = p / p.sum(dim=-1, keepdim=True)
        q = torch.stack([(qj / qj.sum()).to(device) for qj in q])
        x = drafts[:, None]
        u = uniform_from(st.seeds[:n] ^ _ACCEPT_SALT, st.steps[:n])
        # draft j is accepted with probability min(1, p/q), compared in float64 as p(x) and q(x) are
        accepted = u * q.gather(1, x).squeeze(1).double() < p[:n].gather(1, x).squeeze(1).double()
        rejected = ~accepted
        j = torch.where(rejected.any(), rejected.long().argmax(), n)  # the first rejection, or n
        at = j.clamp(max=n - 1)[None]  # where to redraw (ignored when every draft is accepted); a
        # 1-d index: a 0-d one would be read to the host as a Python int
        residual = torch.clamp(p[at] - q[at].to(p.dtype), min=0)  # [1, V]
        residual = torch.where(residual.sum() <= 0, p[at], residual)  # p = q here: any draw of p will do
        cdf = (residual / residual.sum()).double().cumsum(-1)
        r = uniform_from(st.seeds[at] ^ _RESIDUAL_SALT, st.steps[at])
        token = torch.searchsorted(cdf, (r * cdf[:, -1])[:, None], right=True).clamp_(max=cdf.shape[-1] - 1)[0, 0]
        accepted_count, drawn = torch.stack([j, torch.where(j < n, token, -1)]).tolist()
        return accepted_count, drawn

    def _lookup_accept(self, result: VerifyResult, i: int, drafts, logits) -> int:
        """Speculative sampling of a lookup draft, a point mass: the target's own draw at each
        position (its sampler, the request's seed, the position), accepted while it is the draft.
        Draft x is then accepted with probability p(x), and a rejection is a draw of p given that
        it is not x: the normalised max(0, p - q) for q one-hot at x. The engine redraws the
        rejected position from p with the same seed and position, so it writes that very draw."""
        n = len(drafts)
        first = int(result.num_generated[i])
        steps = list(range(first, first + n))
        st = SamplingTensors.build([result.params[i]] * n, [result.seeds[i]] * n, steps, logits.device)
        differ = self._sampler(logits[:n], st) != drafts
        return int(torch.where(differ.any(), differ.long().argmax(), n))

    def __repr__(self) -> str:
        lookup = f", lookup={self.lookup!r}" if self.lookup is not None else ""
        return f"Speculative(k={self.k!r}, draft={self.draft!r}, target={self.target!r}{lookup})"


class AutoDraftLength:
    """k for `Speculative(k="auto")`: the length that maximises tokens per unit of time, from the
    acceptance rate seen lately and the cost of a draft step and of a verify step relative to a
    target step at the current batch size (from the models' latency profiles, once the engine
    has them; until then a draft step costs a third of a target step and a verify step one)."""

    HALF_LIFE = 64  # drafts: the acceptance rate follows the recent traffic
    RETRY_HALF_LIFE = 32  # steps without drafts: the estimate drifts back to the prior
    PRIOR = (4.0, 5.0)  # accepted, judged: 0.8 (the demo pair's greedy agreement)

    def __init__(self, max_k: int):
        self.max_k = max_k
        self.accepted, self.judged = self.PRIOR
        self.draft_cost = lambda b: 1 / 3  # seconds of a draft step over a target step, for b rows
        self.verify_cost = lambda b, k: 1.0  # a target step over b rows of k + 1 tokens, over one of b rows
        # c more tokens in a draft step of b rows (a catch-up), over a target step of b rows: a
        # prompt token costs the demo 0.5B about a thirteenth of the 1.5B's decode step
        self.catch_up_cost = lambda b, c: c / 16

    def use_profiles(self, draft_latency, target_latency, check_latency=None) -> None:
        """Step latencies (seconds against tokens in the step) of the draft and target models, and
        the target's for b rows of t tokens checked (`VerifyLatency`; without it, the target's
        step of b * t tokens, which undercounts a check). The costs are kept per argument: the
        profiles are fixed once given, and reading them (interpolation in Python) for every k of
        every step cost about 0.9 ms a step, 3% of a demo-pair cycle at one request in flight."""
        if check_latency is None:
            check_latency = lambda b, t: target_latency(b * t)  # noqa: E731
        self.draft_cost = lru_cache(maxsize=4096)(lambda b: draft_latency(b) / target_latency(b))
        self.verify_cost = lru_cache(maxsize=4096)(lambda b, k: check_latency(b, k + 1) / target_latency(b))
        self.catch_up_cost = lru_cache(maxsize=4096)(
            lambda b, c: (draft_latency(b + c) - draft_latency(b)) / target_latency(b)
        )

    def observe(self, accepted: int, judged: int) -> None:
        """One verified draft: `accepted` drafts kept of the `judged` ones compared with the
        target, the accepted ones and the first rejection. The acceptance rate the cycle formula
        needs is per judged position, accepted / judged; drafts after a rejection count for
        nothing (counting every draft would make a = 0.85 at k = 4 look like 0.68, and the
        lower estimate would pick a shorter k, which lowers it less: a = 0.85 at k = 2 looks
        like 0.79)."""
        decay = 0.5 ** (judged / self.HALF_LIFE)
        self.accepted = self.accepted * decay + accepted
        self.judged = self.judged * decay + judged

    @property
    def rate(self) -> float:
        return min(0.99, max(0.0, self.accepted / self.judged))

    def plan(self, batch: int) -> tuple[int, float]:
        """The draft length with the most tokens per unit of time at this batch, and those tokens
        per target step (1.0 at k = 0, the target alone). No side effect."""
        a = self.rate
        best_k, best = 0, 1.0  # k = 0: the target alone, one token per target step
        for k in range(1, self.max_k + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a)
            speed = tokens / (k * self.draft_cost(batch) + self.verify_cost(batch, k))
            if speed > best * 1.02:  # a clear gain, not noise in the profiles
                best_k, best = k, speed
        return best_k, best

    def best(self, batch: int) -> int:
        """`plan`'s draft length."""
        return self.plan(batch)[0]

    def extends(self, chain: float, drafted: int, batch: int, speed: float) -> bool:
        """Whether a draft model that has drafted `drafted` tokens, all accepted with probability
        `chain`, should draft one more: its expected token (chain times the acceptance rate)
        against its cost (a draft step, and one more token in the check), at no less than the
        planned `speed` (tokens per target step). The marginal rule of dynamic draft lengths
        (transformers' assistant_confidence_threshold, Mamou et al. 2024), from measured costs."""
        cost = self.draft_cost(batch) + self.verify_cost(batch, drafted + 1) - self.verify_cost(batch, drafted)
        return chain * self.rate >= cost * speed

    def catch_up_pays(self, lag: int, left: int, batch: int, speed: float | None = None) -> bool:
        """Whether a request whose draft model is `lag` tokens behind should draft, with `left`
        tokens still to write: the catch-up (those tokens added to a draft step of the batch)
        against what drafting saves over them at the planned speed (`plan`'s, given once per
        step by a caller asking for every row), both in target steps. A whole prompt pays only
        where many tokens are left."""
        if speed is None:
            speed = self.plan(batch)[1]
        return self.catch_up_cost(batch, lag) < max(left, 0) * (1 - 1 / speed)

    def choose(self, batch: int) -> int:
        """`best`, for a step that acts on it."""
        best_k = self.best(batch)
        if best_k == 0:
            # No drafts, so no news of the acceptance rate: a few bad drafts (say, where the
            # answer starts) must not switch drafting off for good. Drift back to the prior, so
            # that a later step drafts again and measures.
            keep = 0.5 ** (1 / self.RETRY_HALF_LIFE)
            self.accepted = self.accepted * keep + self.PRIOR[0] * (1 - keep)
            self.judged = self.judged * keep + self.PRIOR[1] * (1 - keep)
        return best_k
