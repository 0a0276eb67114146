"""Shared test helpers: Hugging Face references and engine checks."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import lru_cache

import anyio
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor

from tokenrouter.bench import wait_free
from tokenrouter.policies import Policy, Route, StepResult
from tokenrouter.testing import live_sequences, requests_in_flight, workers_of


@lru_cache(maxsize=8)
def hf_model(path, dtype=torch.float64, attention="eager"):
    """A plain transformers model. Its eager attention takes the softmax in float32 whatever the
    dtype; attention="sdpa" keeps a float64 model float64 throughout (for values, not tokens)."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attention).eval()


class VllmPenalties(LogitsProcessor):
    """vLLM's documented presence/frequency formula the obvious way, as a transformers logits
    processor: over the tokens generated so far, `logit -= frequency_penalty * count +
    presence_penalty * (count > 0)`."""

    def __init__(self, num_prompt: int, presence: float, frequency: float):
        self.num_prompt, self.presence, self.frequency = num_prompt, presence, frequency

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for row, ids in enumerate(input_ids.tolist()):
            for token, count in Counter(ids[self.num_prompt :]).items():
                scores[row, token] -= self.frequency * count + self.presence * (count > 0)
        return scores


def hf_greedy(path, prompt_ids: list[int], max_new_tokens: int, dtype=torch.float64, eos=None) -> list[int]:
    """Hugging Face generate, batch 1, greedy; eos=None means never stop early."""
    model = hf_model(path, dtype)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0 if eos is not None else max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


def hf_greedy_penalized(path, prompt_ids: list[int], max_new_tokens: int, params, attention="eager") -> list[int]:
    """`hf_greedy` under a request's penalties: generate's own repetition_penalty, then vLLM's
    presence/frequency formula as a logits processor (transformers runs its own first)."""
    from transformers import LogitsProcessorList

    model = hf_model(path, torch.float64, attention)
    extra = []
    if params.presence_penalty or params.frequency_penalty:
        extra.append(VllmPenalties(len(prompt_ids), params.presence_penalty, params.frequency_penalty))
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            repetition_penalty=params.repetition_penalty,
            logits_processor=LogitsProcessorList(extra),
        )
    return out[0, len(prompt_ids) :].tolist()


def penalized_logits(path, ids: list[int], num_prompt: int, params) -> torch.Tensor:
    """Row i: a plain float64 forward's next-token logits after ids[: num_prompt + i], under the
    request's penalties (transformers' repetition processor, then vLLM's formula); one row per
    output position of `ids` and one for the position after it."""
    from transformers import RepetitionPenaltyLogitsProcessor

    with torch.no_grad():
        logits = hf_model(path, torch.float64, "sdpa")(torch.tensor([ids])).logits[0]
    rows = []
    for i in range(num_prompt - 1, len(ids)):
        context, row = torch.tensor([ids[: i + 1]]), logits[i : i + 1].clone()
        if params.repetition_penalty != 1.0:
            row = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(context, row)
        row = VllmPenalties(num_prompt, params.presence_penalty, params.frequency_penalty)(context, row)
        rows.append(row[0])
    return torch.stack(rows)


async def generate_all(engine, prompts, params, request_ids=None) -> list:
    """Every prompt at once, each in its own task; the outputs in prompt order. `params` is one
    SamplingParams for all, or a list of one per prompt; `request_ids`, one per prompt, names
    them (a test that injects a fault into one request by its id)."""
    import anyio

    outs = [None] * len(prompts)
    each = params if isinstance(params, list) else [params] * len(prompts)
    ids = request_ids or [None] * len(prompts)

    async def one(i):
        outs[i] = await engine.generate(prompts[i], each[i], request_id=ids[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return outs


def serve_all(specs, policy, prompts, params) -> list:
    """An engine on `specs` under `policy` (None: Single), every prompt at once, the outputs in
    prompt order once every KV block is free again."""
    from tokenrouter import Engine

    async def main():
        async with Engine(models=specs, policy=policy) as e:
            outs = await generate_all(e, prompts, params)
            await wait_all_free(e)
            return outs

    return anyio.run(main)


async def wait_all_free(engine, timeout: float = 60.0) -> None:
    """Wait until no worker holds any request or KV block (workers free KV asynchronously)."""
    if not await wait_free(engine, timeout):
        raise AssertionError(f"KV not freed: {engine.stats()}")


async def wait_until(predicate, timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll `predicate()` until it holds: for state a worker thread changes after the caller has
    seen a request end (a worker reports a step's events before it gives up its turn)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        await anyio.sleep(0.005)


def holds_nothing(engine) -> bool:
    """No worker holds a request, and the engine tracks no request."""
    return all(not live_sequences(w) for w in workers_of(engine).values()) and requests_in_flight(engine) == 0


class EveryK(Policy):
    """A custom policy: keep every token, and move to the other model after every k-th one.

    It carries its own field across hand-offs (how many times the request moved).
    """

    def __init__(self, k: int):
        self.k = k

    @property
    def models(self):
        return ["small", "large"]

    def route(self, result: StepResult) -> Route:
        move = (result.num_generated + 1) % self.k == 0
        other = 1 - result.model_index
        next_model = torch.where(move, other, result.model_index)
        for state, m in zip(result.states, move.tolist()):
            if m:
                state["moves"] = state.get("moves", 0) + 1
        return Route(keep=torch.ones_like(move), next_model=next_model)

    def send(self, msg, state):
        msg = super().send(msg, state)
        assert msg.tokens, "a hand-off always carries the tokens the peer has not seen"
        return msg


class StepGate:
    """Freezes a worker at the start of the first step where `predicate(worker)` holds, until opened.

    The predicate runs in the worker's thread right after it drained its inbox, so the state it
    sees is exactly the state the worker is frozen in: a test can then cancel a request in that
    state and open the gate.
    """

    def __init__(self, worker, predicate):
        self.hit = threading.Event()
        self.opened = threading.Event()
        real = worker.step

        def step():
            if not self.hit.is_set() and not self.opened.is_set() and predicate(worker):
                self.hit.set()
                self.opened.wait(30)
            real()

        worker.step = step

    async def wait_hit(self, timeout: float = 20.0) -> None:
        if not await anyio.to_thread.run_sync(self.hit.wait, timeout):
            raise AssertionError("the worker never reached the gated state")

    def open(self) -> None:
        self.opened.set()


# ---- workers in Ray actors ------------------------------------------------------------------------
class _GateState:
    """A gate inside an actor: the StepGate's events, and the tokens each request produced once
    counting began (the actor's own events, counted where they are made)."""

    def __init__(self, predicate):
        self.predicate = predicate
        self.hit = threading.Event()
        self.opened = threading.Event()
        self.counting = False
        self.late: Counter = Counter()


def _install_gate(predicate, worker) -> None:
    state = worker.test_gate = _GateState(predicate)
    real_step, real_sink = type(worker).step.__get__(worker), worker.sink

    def step():
        if predicate is not None and not state.hit.is_set() and not state.opened.is_set() and predicate(worker):
            state.hit.set()
            state.opened.wait(30)
        real_step()

    def sink(events):
        if state.counting:
            for ev in events:
                state.late[ev.request_id] += len(ev.token_ids)
        real_sink(events)

    worker.step, worker.sink = step, sink
    worker.test_gate_sink = real_sink


def _remove_gate(worker) -> None:
    del worker.step  # the class's again
    worker.sink = worker.test_gate_sink
    del worker.test_gate, worker.test_gate_sink


def _wait_hit(timeout, worker) -> bool:
    return worker.test_gate.hit.wait(timeout)


def _start_counting(worker) -> None:
    worker.test_gate.counting = True


def _open(worker) -> None:
    worker.test_gate.opened.set()


def _late(worker) -> Counter:
    return worker.test_gate.late


class RemoteStepGate:
    """`StepGate` for a worker in a Ray actor (`RemoteWorker.inspect` runs each part there), with
    the counting of `tests/test_cancellation.py`'s late tokens done in the actors too. `counted`:
    the workers whose events are counted once the gate opens (the gated one is always among them).
    A predicate of None only counts."""

    def __init__(self, worker, predicate, counted=()):
        from functools import partial

        self.partial = partial
        self.worker = worker
        self.others = [w for w in counted if w is not worker]
        worker.inspect(partial(_install_gate, predicate))
        for w in self.others:
            w.inspect(partial(_install_gate, None))
        self.opened = False

    async def wait_hit(self, timeout: float = 20.0) -> None:
        if not await anyio.to_thread.run_sync(self.worker.inspect, self.partial(_wait_hit, timeout)):
            raise AssertionError("the worker never reached the gated state")

    def open(self) -> None:
        for w in [self.worker, *self.others]:
            w.inspect(_start_counting)
        self.opened = True
        self.worker.inspect(_open)

    def late_tokens(self) -> Counter:
        total: Counter = Counter()
        for w in [self.worker, *self.others]:
            total += w.inspect(_late)
        return total

    def remove(self) -> None:
        for w in [self.worker, *self.others]:
            w.inspect(_remove_gate)


def actor_node(worker) -> str:
    """The Ray node a worker's actor runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


def holds_nothing_anywhere(engine) -> bool:
    """No worker, wherever it runs, holds a request, and the engine tracks none."""
    stats = engine.stats().values()
    return all(s.running == s.waiting == s.pending == 0 for s in stats) and requests_in_flight(engine) == 0


# What torch's oneDNN raises for a bf16 weight on a CPU without avx512bw/vl/dq or avx_ne_convert
# (an AVX2 CPU: AMD Zen 1-3, Intel client CPUs), word for word.
AVX2_BF16_ERROR = (
    "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
)


def bf16_raises_as_on_an_avx2_cpu(monkeypatch) -> None:
    """torch's oneDNN bf16 ops raise here as they raise on an AVX2 CPU, whatever this CPU offers
    (float32 packs as before)."""
    real = torch.ops.mkldnn._reorder_linear_weight

    def reorder(weight, *args, **kwargs):
        if weight.dtype == torch.bfloat16:
            raise RuntimeError(AVX2_BF16_ERROR)
        return real(weight, *args, **kwargs)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", reorder)


def torch_bf16_runs() -> bool:
    """Whether torch's oneDNN bf16 linear runs at this CPU level (TOKENROUTER_CPU_LEVEL may pin it off)."""
    from tokenrouter.engine import native

    return native.cpu.current().torch_bf16 is None


def token_signature(out) -> tuple[list[int], list[tuple[str, float]]]:
    """A finished request's tokens, and per token the model that wrote it and its logprob's exact
    value (the request must ask `logprobs`): a logit that moved by one bit shows."""
    return out.token_ids, [(record.model, record.logprob) for record in out.logprobs]


def moved_under_load(alone: list, loaded: list) -> list[int]:
    """The requests whose `token_signature`s differ: another token, or another logprob for a token
    the same model wrote in both runs. (Under `Speculative(k="auto")` how far the draft model
    drafts depends on the load, so an accepted draft, with the draft's logprob, in one run may be
    the target's own token, with its logprob, in the other: the same token.)"""

    def differ(a, b) -> bool:
        return a[0] != b[0] or any(x[0] == y[0] and x[1] != y[1] for x, y in zip(a[1], b[1]))

    return [i for i, (a, b) in enumerate(zip(alone, loaded)) if differ(a, b)]
