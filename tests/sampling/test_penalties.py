"""Penalties (sampling/penalties.py, applied in engine/step_logits.py's StepLogits.process): transformers'
RepetitionPenaltyLogitsProcessor and vLLM's presence/frequency formulas, row by row on the same
logits; rows that ask for none left bit for bit; greedy decoding under them equal to Hugging
Face generate, also across hand-offs and with neighbours in the batch."""

from __future__ import annotations

import random

import anyio
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import VllmPenalties, generate_all, hf_greedy_penalized, wait_all_free
from tokenrouter import Engine, ModelSpec, RStitch, SamplingParams
from tokenrouter.engine import Request, Sequence
from tokenrouter.engine.step_logits import StepLogits
from tokenrouter.sampling.penalties import apply_penalties

VOCAB = 40


def _reference(logits_row, context, num_prompt, params):
    """One row through transformers' processor, then vLLM's formula."""
    x = logits_row[None].clone()
    if params.repetition_penalty != 1.0 and context:
        x = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(torch.tensor([context]), x)
    return VllmPenalties(num_prompt, params.presence_penalty, params.frequency_penalty)(torch.tensor([context]), x)[0]


ROWS = [  # (prompt length, output length, params)
    (6, 9, SamplingParams(repetition_penalty=1.7)),
    (5, 0, SamplingParams(repetition_penalty=0.6)),  # < 1 favours repeats; no output yet
    (4, 12, SamplingParams(presence_penalty=1.5, frequency_penalty=-0.7)),
    (8, 7, SamplingParams()),  # no penalty: must come back bit for bit
    (3, 15, SamplingParams(repetition_penalty=1.3, presence_penalty=-2.0, frequency_penalty=2.0)),
    (7, 5, SamplingParams(temperature=0.0)),
    (1, 20, SamplingParams(frequency_penalty=0.25)),
]


def _contexts(seed=0):
    rng = random.Random(seed)  # few distinct tokens, so repeats are common
    return [[rng.randrange(VOCAB // 2) for _ in range(p + o)] for p, o, _ in ROWS]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_penalties_equal_the_references_row_by_row(dtype):
    torch.manual_seed(0)
    logits = torch.randn(len(ROWS), VOCAB, dtype=dtype) * 4
    contexts = _contexts()
    width = max(map(len, contexts)) + 3
    tokens = torch.tensor([c + [VOCAB - 1] * (width - len(c)) for c in contexts])  # padding must not count
    got = apply_penalties(
        logits,
        tokens,
        torch.tensor([p for p, _, _ in ROWS]),
        torch.tensor([len(c) for c in contexts]),
        torch.tensor([sp.repetition_penalty for *_, sp in ROWS], dtype=torch.float64),
        torch.tensor([sp.frequency_penalty for *_, sp in ROWS], dtype=torch.float64),
        torch.tensor([sp.presence_penalty for *_, sp in ROWS], dtype=torch.float64),
    )
    assert got.dtype == dtype
    for r, ((p, _, sp), ctx) in enumerate(zip(ROWS, contexts)):
        ref = _reference(logits[r], ctx, p, sp)
        if sp.presence_penalty == sp.frequency_penalty == 0.0:
            assert torch.equal(got[r], ref), r  # transformers' processor, bit for bit
        else:  # vLLM subtracts the two terms one after the other, the formula at once: rounding apart
            torch.testing.assert_close(got[r], ref, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5)
        assert not torch.equal(got[r], logits[r]) or not sp.penalized, r


def _step_logits() -> StepLogits:
    """What a core processes its step's logits with: it needs only the requests."""
    return StepLogits("m")


def _seq(prompt: list[int], output: list[int], params: SamplingParams) -> Sequence:
    req = Request("r", prompt, params, 0, frozenset(), 100)
    return Sequence(req, token_ids=prompt + output)


def test_process_logits_touches_only_the_rows_that_ask():
    """Mixed rows through the core's one processing step: penalized rows equal the references,
    the others are the very same bits, and a batch with no penalty gets its tensor back."""
    torch.manual_seed(1)
    logits = torch.randn(len(ROWS), VOCAB, dtype=torch.float64) * 4
    contexts = _contexts(seed=3)
    seqs = [_seq(c[:p], c[p:], sp) for (p, _, sp), c in zip(ROWS, contexts)]
    step = _step_logits()
    before = logits.clone()
    got = step.process(seqs, logits)
    assert torch.equal(logits, before)  # the forward's logits are not written in place
    for r, ((p, _, sp), ctx) in enumerate(zip(ROWS, contexts)):
        if sp.penalized:
            torch.testing.assert_close(got[r], _reference(logits[r], ctx, p, sp), rtol=0, atol=1e-12)
        else:
            assert torch.equal(got[r], logits[r])
    plain = [s for s, (*_, sp) in zip(seqs, ROWS) if not sp.penalized]
    same = logits[: len(plain)]
    assert step.process(plain, same) is same


def test_a_checks_rows_count_only_the_tokens_before_each():
    """A verifier's span: row j is the position after the first verify_start + j tokens."""
    torch.manual_seed(2)
    params = SamplingParams(repetition_penalty=1.9, presence_penalty=0.5, frequency_penalty=0.3)
    prompt, output = [1, 2, 3, 2], [5, 5, 7, 1, 5, 9]
    seq = _seq(prompt, output, params)
    seq.verify_start = len(prompt) + 2  # drafts: [7, 1, 5, 9]
    span = torch.randn(5, VOCAB, dtype=torch.float64) * 4
    other = _seq([4, 4], [4], SamplingParams())
    other.verify_start = 2
    other_span = torch.randn(2, VOCAB, dtype=torch.float64)
    got, untouched = _step_logits().process_spans([seq, other], [span, other_span])
    tokens = prompt + output
    for j in range(5):
        context = tokens[: seq.verify_start + j]
        torch.testing.assert_close(got[j], _reference(span[j], context, len(prompt), params), rtol=0, atol=1e-12)
    assert torch.equal(untouched, other_span)


def _specs(paths: dict, **kw) -> dict:
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=4096, block_size=8, **kw) for n, p in paths.items()}


PROMPTS = [[17, 40, 9, 101, 33], [250, 3, 77], [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7], [300, 12, 300, 12]]


def test_greedy_with_penalties_equals_hugging_face(tiny_models):
    """Greedy, on the float64 tiny models: repetition_penalty against generate(repetition_penalty=...),
    presence/frequency against generate with vLLM's formula as a logits processor; all requests
    of a run at once, so penalized and plain rows share batches."""
    for arch in ("qwen2", "llama"):
        path = tiny_models[arch]
        kinds = [
            {"repetition_penalty": 1.8},
            {"repetition_penalty": 0.7},
            {"presence_penalty": 1.2, "frequency_penalty": 0.9},
            {},
        ]
        cases = []
        for prompt in PROMPTS:
            for kw in kinds:
                sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **kw)
                cases.append((prompt, kw, hf_greedy_penalized(path, prompt, 24, sp)))
        plain = {tuple(prompt): expected for prompt, kw, expected in cases if not kw}
        for kind in kinds[:-1]:  # each kind of penalty changes some output
            assert any(expected != plain[tuple(prompt)] for prompt, kw, expected in cases if kw == kind), kind
        params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **kw) for _, kw, _ in cases]

        async def main():
            async with Engine(models=_specs({"m": path})) as e:
                outs = await generate_all(e, [c[0] for c in cases], params)
                await wait_all_free(e)
                return outs

        for out, (prompt, kw, expected) in zip(anyio.run(main), cases):
            assert out.token_ids == expected, (arch, prompt, kw)


def test_unpenalized_neighbours_are_bit_identical(tiny_model):
    """The same two requests, admitted together (B = 2) so every step has the same shape: the
    plain one's tokens and logprobs are the same bits whether its neighbour is penalized or not."""
    plain = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=3)
    penalized = plain.model_copy(update={"repetition_penalty": 2.0, "frequency_penalty": 1.0, "presence_penalty": 0.5})

    async def run(neighbour):
        async with Engine(models=_specs({"m": tiny_model}), delayed_batching=2, batch_wait_s=30.0) as e:
            return await generate_all(e, [PROMPTS[0], PROMPTS[2]], [plain, neighbour])

    a, b = anyio.run(run, plain)
    a2, b2 = anyio.run(run, penalized)
    assert b2.token_ids != b.token_ids  # the neighbour did change
    assert a2.token_ids == a.token_ids
    assert [(r.token_id, r.logprob, r.top) for r in a2.logprobs] == [(r.token_id, r.logprob, r.top) for r in a.logprobs]


def test_penalties_hold_across_hand_offs(tiny_pair, tokenizer):
    """RStitch on the tiny pair with penalties: tokens and writers equal the slow reference, which
    penalizes every step from the whole sequence; both models write, so hand-offs happen."""
    from tokenrouter.testing import load_reference_models, reference_generate

    rng = random.Random(3)
    work = [[rng.randrange(3, len(tokenizer)) for _ in range(rng.choice([3, 9, 17]))] for _ in range(8)]
    params = [
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, repetition_penalty=1.6),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, presence_penalty=1.0, frequency_penalty=0.8),
        SamplingParams(temperature=0.9, max_tokens=30, ignore_eos=True, repetition_penalty=1.3, seed=5),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
    ] * 2
    policy = RStitch(tau=TINY_PAIR_TAU)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=policy) as e:
            outs = await generate_all(e, work, params)
            await wait_all_free(e)
            return outs

    outs = anyio.run(main)
    models = load_reference_models(tiny_pair, dtype=torch.float64)
    for prompt, sp, out in zip(work, params, outs):
        ref = reference_generate(policy, models, prompt, sp)
        assert (out.token_ids, out.token_models) == (ref.token_ids, ref.token_models), (prompt, sp)
    assert sum(o.num_handoffs for o in outs) > 0
    written = {m for o in outs for m in o.token_models}
    assert written == {"small", "large"}
    # and the penalties mattered: without them the reference writes something else
    plain = [
        reference_generate(
            policy,
            models,
            p,
            sp.model_copy(update={"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}),
        ).token_ids
        for p, sp in zip(work, params)
        if sp.penalized
    ]
    assert plain != [o.token_ids for o, sp in zip(outs, params) if sp.penalized]
