"""logprobs and prompt_logprobs: the log-softmax of the distribution each token was drawn from,
attributed to its writer, against Hugging Face (generate's scores, a plain forward) on the
float64 tiny models; prompt scoring across chunked prefill and beside a cached prefix."""

from __future__ import annotations

import random

import anyio
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import generate_all, hf_model, serve_all, wait_all_free
from tokenrouter import Engine, ModelSpec, RStitch, SamplingParams
from tokenrouter.testing import workers_of

TOL = 1e-9
FLOAT32_TOL = 2e-6  # generate's float32 scores: logits of a few units rounded to float32
PROMPTS = [[17, 40, 9, 101, 33], [250, 3, 77], [5, 6, 7, 8, 9, 10, 11, 12, 13], [300, 12]]


def _specs(paths: dict, **kw) -> dict:
    base = {"dtype": "float64", "kv_cache_tokens": 4096, "block_size": 8}
    return {n: ModelSpec(path=p, **{**base, **kw}) for n, p in paths.items()}


def _serve(specs, prompts, params, policy=None):
    return serve_all(specs, policy, prompts, params)


def _check(record, logprobs_row: torch.Tensor, token: int, n: int, model: str, tol: float = TOL) -> None:
    """A record against a reference row of log-probabilities: the token's value, and the top n
    (ids in order, values) of the row's finite entries."""
    assert record.token_id == token and record.model == model
    assert abs(record.logprob - float(logprobs_row[token])) < tol, (record.logprob, float(logprobs_row[token]))
    finite = int(torch.isfinite(logprobs_row).sum())
    values, ids = logprobs_row.topk(min(n, finite))
    assert [i for i, _ in record.top] == ids.tolist()
    assert all(abs(v - float(w)) < tol for (_, v), w in zip(record.top, values))


def _hf_scores(path, prompt, n, **kw) -> tuple[list[int], list[torch.Tensor]]:
    """generate(output_scores=True): the tokens and the log-softmax of each step's scores.
    transformers 5 casts the logits to float32 before its processors, even for a float64 model
    (generation/utils.py, `_sample`), so these are float32 values."""
    with torch.no_grad():
        out = hf_model(path, attention="sdpa").generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **kw,
        )
    assert out.scores[0].dtype == torch.float32
    return out.sequences[0, len(prompt) :].tolist(), [torch.log_softmax(s[0].double(), dim=-1) for s in out.scores]


def _scores64(path, ids: list[int], num_prompt: int, penalty: float | None) -> list[torch.Tensor]:
    """What generate's scores are before that cast: a float64 forward over the final sequence,
    each output position's logits through RepetitionPenaltyLogitsProcessor over the tokens
    before it, log-softmaxed."""
    with torch.no_grad():
        logits = hf_model(path, attention="sdpa")(torch.tensor([ids])).logits[0]
    rows = []
    for i in range(num_prompt - 1, len(ids) - 1):
        row = logits[i : i + 1]
        if penalty is not None:
            row = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([ids[: i + 1]]), row.clone())
        rows.append(torch.log_softmax(row[0], dim=-1))
    return rows


def _forward_logprobs(path, ids: list[int]) -> torch.Tensor:
    """log-softmax of a plain float64 forward over `ids`: row p is the distribution after ids[: p + 1]."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(path, attention="sdpa")(torch.tensor([ids])).logits[0], dim=-1)


def test_greedy_logprobs_equal_hugging_face_scores(tiny_models):
    """Greedy, with and without a repetition penalty (generate's scores are the processed
    logits), N = 5 and N = 0, every request of a run at once: the same tokens as generate, the
    values and top ids of its scores (to their float32 precision), and to 1e-9 those scores
    computed in float64."""
    for arch in ("qwen2", "llama"):
        path = tiny_models[arch]
        cases = [(p, {"logprobs": 5}) for p in PROMPTS] + [
            (p, {"logprobs": 5, "repetition_penalty": 1.7}) for p in PROMPTS
        ]
        cases += [(PROMPTS[0], {"logprobs": 0}), (PROMPTS[1], {})]
        params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **kw) for _, kw in cases]
        outs = _serve(_specs({"m": path}), [p for p, _ in cases], params)
        for (prompt, kw), out in zip(cases, outs):
            if "logprobs" not in kw:
                assert out.logprobs is None and out.prompt_logprobs is None
                continue
            penalty = kw.get("repetition_penalty")
            tokens, scores = _hf_scores(
                path, prompt, 16, **({} if penalty is None else {"repetition_penalty": penalty})
            )
            assert out.token_ids == tokens
            assert len(out.logprobs) == len(tokens)
            exact = _scores64(path, prompt + tokens, len(prompt), penalty)
            for record, token, row, row64 in zip(out.logprobs, tokens, scores, exact):
                _check(record, row, token, kw["logprobs"], "m", tol=FLOAT32_TOL)
                _check(record, row64, token, kw["logprobs"], "m")
                if kw["logprobs"] == 0:
                    assert record.top == []
                else:
                    assert record.top[0] == (token, record.logprob)  # greedy: the token is the most likely


def test_sampled_logprobs_are_those_of_the_distribution_drawn_from(tiny_model):
    """temperature 0.5 (exact in float32) and top_k 4: each value is the log-softmax of the
    logits over the temperature on the 4 tokens kept; asking for 6 alternatives gives those 4."""
    params = SamplingParams(temperature=0.5, top_k=4, max_tokens=12, ignore_eos=True, seed=7, logprobs=6)
    outs = _serve(_specs({"m": tiny_model}), PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        rows = _forward_logprobs(tiny_model, prompt + out.token_ids)  # log-softmax at temperature 1 ...
        for i, (record, token) in enumerate(zip(out.logprobs, out.token_ids)):
            x = rows[len(prompt) - 1 + i] / 0.5  # ... is the logits up to a constant per row
            kept = x.topk(4).indices
            ref = torch.full_like(x, float("-inf"))
            ref[kept] = torch.log_softmax(x[kept], dim=-1)
            _check(record, ref, token, 6, "m")
            assert len(record.top) == 4


def test_routed_logprobs_are_each_writers_own(tiny_pair, tokenizer):
    """RStitch on the tiny pair: each token's record names its writer, and its values are that
    model's own log-softmax at that position (a plain forward over the final sequence); the
    prompt is scored by the entry model."""
    rng = random.Random(4)
    prompts = [[rng.randrange(3, len(tokenizer)) for _ in range(rng.choice([3, 9, 17]))] for _ in range(6)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    outs = _serve(_specs(tiny_pair), prompts, params, policy=RStitch(tau=TINY_PAIR_TAU))
    for prompt, out in zip(prompts, outs):
        ids = prompt + out.token_ids
        rows = {m: _forward_logprobs(tiny_pair[m], ids) for m in ("small", "large")}
        assert [r.model for r in out.logprobs] == out.token_models
        for i, (record, token, model) in enumerate(zip(out.logprobs, out.token_ids, out.token_models)):
            _check(record, rows[model][len(prompt) - 1 + i], token, 3, model)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for j in range(1, len(prompt)):
            _check(out.prompt_logprobs[j], rows["small"][j - 1], prompt[j], 2, "small")
    assert {m for o in outs for m in o.token_models} == {"small", "large"}


def test_stream_deltas_carry_their_tokens_logprobs(tiny_pair):
    """Each delta holds one record per token it carries, by its writer; together they are the
    output's. A stop string that cuts the tokens cuts their records too. Not asked: None."""
    prompt = [17, 40, 9, 101, 33]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU)) as e:
            full = await e.generate(prompt, params)
            deltas = [d async for d in e.stream(prompt, params)]
            stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
            cut = await e.generate(prompt, params.model_copy(update={"stop": [stop]}))
            plain = [d async for d in e.stream(prompt, params.model_copy(update={"logprobs": None}))]
            await wait_all_free(e)
            return full, deltas, cut, plain

    full, deltas, cut, plain = anyio.run(main)
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    assert all(r.model == d.model for d in deltas for r in d.logprobs)
    assert [r for d in deltas for r in d.logprobs] == full.logprobs
    assert deltas[-1].output.logprobs == full.logprobs
    assert cut.finish_reason == "stop" and len(cut.token_ids) < len(full.token_ids)
    assert cut.logprobs == full.logprobs[: len(cut.token_ids)]
    assert all(d.logprobs is None for d in plain) and plain[-1].output.logprobs is None


def test_prompt_logprobs_equal_a_forward_chunked_and_beside_a_cached_prefix(tiny_model):
    """A prompt of 30 tokens in steps of 8 (chunked prefill), block size 4: the records equal
    Hugging Face's forward. Served again after a plain request cached its blocks: the same
    records, and no cache hit for it (every position computed), while a plain one does hit."""
    prompt = [(7 * i + 3) % 300 + 3 for i in range(30)]
    short = [42]
    asks = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=4)
    plain = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    specs = _specs({"m": tiny_model}, block_size=4, max_num_batched_tokens=8)

    async def main():
        async with Engine(models=specs) as e:
            cold = await generate_all(e, [prompt, prompt[:13], short], [asks, plain, asks])
            warm = await e.generate(prompt, plain)  # the whole prompt is cached now
            again = await e.generate(prompt, asks)
            after = await e.generate(prompt, plain)
            await wait_all_free(e)
            return cold, warm, again, after

    (first, neighbour, one), warm, again, after = anyio.run(main)
    rows = _forward_logprobs(tiny_model, prompt)
    for out in (first, again):
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for j in range(1, len(prompt)):
            _check(out.prompt_logprobs[j], rows[j - 1], prompt[j], 4, "m")
        assert out.logprobs is None  # not asked
    assert warm.num_cached_prompt_tokens > 0 and after.num_cached_prompt_tokens > 0
    assert again.num_cached_prompt_tokens == 0
    assert again.token_ids == warm.token_ids == first.token_ids
    assert neighbour.prompt_logprobs is None and one.prompt_logprobs == [None]


def test_requests_that_ask_nothing_keep_only_the_logits_they_sample(tiny_model):
    """The fast path stays: with neither option (and with logprobs alone) every forward keeps
    exactly the logits of the rows it samples from, chunked prefills included; a request
    scoring its prompt adds its prompt positions' rows."""
    prompt = [(5 * i + 1) % 300 + 3 for i in range(21)]
    specs = _specs({"m": tiny_model}, max_num_batched_tokens=8)

    async def kept_rows(params):
        steps = []
        async with Engine(models=specs) as e:
            runner = workers_of(e)["m"].core.runner
            prepare, run_model = runner.prepare, runner.run_model

            def spy_prepare(batch, extra_rows=None):
                prepared = prepare(batch, extra_rows)
                steps.append([len(prepared.sample_rows)])  # rows sampled from
                return prepared

            def spy_run(*args):
                logits, hidden = run_model(*args)
                steps[-1].append(logits.shape[0])  # rows whose logits the forward kept
                return logits, hidden

            runner.prepare, runner.run_model = spy_prepare, spy_run
            await generate_all(e, [prompt, prompt[:5]], params)
        return steps

    base = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    for params in (SamplingParams(**base), SamplingParams(**base, logprobs=5)):
        steps = anyio.run(kept_rows, params)
        assert steps and all(sampled == kept for sampled, kept in steps), steps
    steps = anyio.run(kept_rows, [SamplingParams(**base, prompt_logprobs=1), SamplingParams(**base)])
    assert sum(kept - sampled for sampled, kept in steps) == len(prompt) - 1
