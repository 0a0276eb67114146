"""`reference_generate`: a policy run the slow, obvious way, one request at a time, to check the
engine (or your own policy) against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import SamplingParams
from ..policies import Policy


@dataclass
class ReferenceOutput:
    token_ids: list[int]
    token_models: list[str]
    num_handoffs: int
    finish_reason: str
    # per model, the sequence length at its last forward: what an engine that never recomputes
    # feeds that model for this request (prompt + every token it had not yet seen)
    context_at_last_step: dict[str, int]


def load_reference_models(paths: Mapping[str, str | Path], dtype: torch.dtype = torch.float32) -> dict:
    """Plain transformers models (eager attention, no engine involved) for `reference_generate`."""
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
        for name, path in paths.items()
    }


def _eos_of(model) -> frozenset[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


@torch.no_grad()
def reference_generate(
    policy: Policy,
    models: Mapping[str, torch.nn.Module],
    prompt_ids: list[int],
    params: SamplingParams,
    max_model_len: int | None = None,
) -> ReferenceOutput:
    """Run one request under a policy the slow, obvious way, to check an engine (or a policy) against.

    Every step recomputes the whole sequence with a plain transformers forward on the model that
    owns the request: no KV cache, no batching, no threads. The policy's `route`, `send` and
    `receive` are applied exactly as the engine applies them, and sampling uses the engine's
    sampler, so seeded sampling matches too. Penalties are applied to every position's logits
    from the tokens before it (sampling/penalties.py), before the policy sees them. EOS comes from
    each model's generation_config.

    A verifying policy (VERIFY) runs as policies/base.py describes it: the drafters' tokens are
    tentative (a drafter hands the request to the verifier where it would end, or after
    `max_draft`), and on the verifier's turn `verify` judges them from one forward's logits, the
    accepted ones count as their drafter's, the rest are dropped, and the verifier writes the
    next position. Tokens the verifier proposes itself (`Route.proposals`) follow its kept token
    as tentative ones, and its next turn judges them the same way.
    """
    from ..engine import MAX_STALLS, HiddenCapture
    from ..policies import (
        ENTROPY,
        HIDDEN,
        HISTORY,
        TOKEN_EMBEDDING,
        PeerMessage,
        StepResult,
        VerifyResult,
        normalized_entropy,
    )
    from ..sampling import Sampler, SamplingTensors, penalize_rows

    names = policy.models
    tokens = list(prompt_ids)
    written: list[str] = []
    states: dict[str, dict] = {name: {} for name in names}
    known: dict[tuple[str, str], int] = {}  # (holder, peer) -> tokens the peer knows
    current = policy.start_model()  # where the engine starts it too
    max_tokens = params.max_tokens
    if max_model_len is not None:
        room = max_model_len - len(prompt_ids)
        max_tokens = room if max_tokens is None else min(max_tokens, room)
    elif max_tokens is None:
        raise ValueError("max_tokens=None (the room left) needs max_model_len")
    seed = params.seed if params.seed is not None else 0
    sampler = Sampler()
    handoffs = stalls = 0
    last: dict[str, int] = {}

    def done(reason: str) -> ReferenceOutput:
        return ReferenceOutput(tokens[len(prompt_ids) :], written, handoffs, reason, last)

    verifier = policy.verifier
    confirmed = len(prompt_ids)  # tokens before this are confirmed; later ones are a drafter's, tentative
    drafter: str | None = None

    def sample(row: torch.Tensor, generated: int) -> torch.Tensor:
        if params.temperature == 0.0:
            return row.argmax(dim=-1)
        return sampler(row, SamplingTensors.build([params], [seed], [generated], row.device))

    def processed(rows: torch.Tensor, first: int) -> torch.Tensor:
        """Row j predicts the position after the first `first + j` tokens."""
        if not params.penalized:
            return rows
        lengths = [first + j for j in range(rows.shape[0])]
        n = len(lengths)
        return penalize_rows(rows, [tokens] * n, [len(prompt_ids)] * n, lengths, [params] * n)

    def ends_at(t: int, model) -> bool:
        return (t in _eos_of(model) and not params.ignore_eos) or t in params.stop_token_ids

    captures = {name: HiddenCapture(m) for name, m in models.items()} if HIDDEN in policy.requires else {}
    try:
        while True:
            model = models[current]
            last[current] = len(tokens)
            if current == verifier and len(tokens) > confirmed:  # a check: judge the drafts first
                span = processed(model(torch.tensor([tokens])).logits[0, confirmed - 1 :], confirmed)
                drafts = tokens[confirmed:]
                verdict = policy.verify(
                    VerifyResult(
                        model=current,
                        model_index=names.index(current),
                        request_ids=["reference"],
                        sources=[drafter],
                        start=torch.tensor([confirmed]),
                        num_drafts=torch.tensor([len(drafts)]),
                        drafts=torch.tensor([drafts]),
                        logits=span[None],
                        num_generated=torch.tensor([confirmed - len(prompt_ids)]),
                        states=[states[current]],
                        params=[params],
                        seeds=[seed],
                    )
                )
                accept = int(verdict.accept[0])
                for j, t in enumerate(drafts[:accept]):
                    written.append(drafter)
                    if ends_at(t, models[drafter]) or confirmed + j + 1 - len(prompt_ids) >= max_tokens:
                        del tokens[confirmed + j + 1 :]
                        return done("stop" if ends_at(t, models[drafter]) else "length")
                del tokens[confirmed + accept :]
                confirmed = len(tokens)
                logits = span[accept : accept + 1]
                given = -1 if verdict.tokens is None else int(verdict.tokens[0])
                token = torch.tensor([given]) if given >= 0 else sample(logits, len(tokens) - len(prompt_ids))
                hidden = None
            else:
                logits = processed(model(torch.tensor([tokens])).logits[0, -1:], len(tokens))
                hidden = captures[current].take()[0, -1:] if captures else None
                token = sample(logits, len(tokens) - len(prompt_ids))
            generated = len(tokens) - len(prompt_ids)
            keep, nxt, proposal = True, names.index(current), []
            drafting = verifier is not None and current != verifier
            if len(names) > 1:
                result = StepResult(
                    model=current,
                    model_index=names.index(current),
                    request_ids=["reference"],
                    tokens=token,
                    logits=logits,
                    num_generated=torch.tensor([generated]),
                    states=[states[current]],
                    entropy=normalized_entropy(logits) if ENTROPY in policy.requires else None,
                    hidden=hidden,
                    token_embedding=model.get_input_embeddings()(token) if TOKEN_EMBEDDING in policy.requires else None,
                    params=[params],
                    seeds=[seed],
                    tentative=torch.tensor([len(tokens) + 1 - confirmed]) if drafting else None,
                    history=[list(tokens)] if HISTORY in policy.requires else None,
                )
                decision = policy.route(result)
                keep, nxt = bool(decision.keep[0]), int(decision.next_model[0])
                proposal = decision.proposals[0] if decision.proposals else []
            if keep:
                t = int(token[0])
                tokens.append(t)
                stalls = 0
                if drafting:  # tentative: where it would end, or after max_draft, the verifier decides
                    drafter = current
                    full = len(tokens) - len(prompt_ids) >= max_tokens
                    if ends_at(t, model) or full or len(tokens) - confirmed >= policy.max_draft:
                        nxt = names.index(verifier)
                else:
                    written.append(current)
                    confirmed = len(tokens)
                    if ends_at(t, model):
                        return done("stop")
                    if len(tokens) - len(prompt_ids) >= max_tokens:
                        return done("length")
                    if proposal and nxt == names.index(current):  # the verifier's own drafts, checked next
                        tokens += [int(t) for t in proposal][: max_tokens - (len(tokens) - len(prompt_ids))]
                        drafter = current
            target = names[nxt]
            if target == current:
                if not keep:
                    raise RuntimeError("policy discarded a token without handing the request off")
                continue
            stalls += 0 if keep else 1
            if stalls > MAX_STALLS:
                raise RuntimeError("policy handed the request off repeatedly without a token")
            start = min(known.get((current, target), 0), len(tokens))
            msg = PeerMessage("reference", current, target, tokens[start:], start=start, confirmed=confirmed)
            msg = policy.send(msg, states[current])
            policy.receive(msg, states[target])
            known[(current, target)] = known[(target, current)] = len(tokens)
            handoffs += 1
            current = target
    finally:
        for capture in captures.values():  # leave the caller's models without our hooks
            capture.remove()
