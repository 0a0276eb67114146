"""The blocking facade `LLM`: from a plain script (a subprocess that also forgets to close it), from
inside running asyncio and trio loops, from several threads at once; outputs in prompt order and
equal to Hugging Face's greedy ones; prompts submitted together are batched; bad input raises
the engine's errors, naming the field, in the caller's thread, and reaches no worker; closing
(twice, with a stream in flight, by garbage collection) ends cleanly."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest
import trio

from tests.helpers import hf_greedy, wait_all_free
from tokenrouter import (
    LLM,
    ConfigError,
    EngineNotRunningError,
    InvalidRequestError,
    ModelSpec,
    RStitch,
    SamplingParams,
)
from tokenrouter.testing import build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [40, 41]]
LENGTHS = [3, 7, 5]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def _spec(path, **kw) -> ModelSpec:
    return ModelSpec(path=path, dtype="float64", kv_cache_tokens=384, block_size=8, **kw)


@pytest.fixture(scope="module")
def llm(tiny_model):
    with LLM(models={"m": _spec(tiny_model)}, num_threads=1) as llm:
        yield llm


def _settled(llm) -> tuple[int, int]:
    """(steps, tokens processed) once the worker holds nothing."""
    anyio.run(wait_all_free, llm.engine)
    s = llm.engine.stats()["m"]
    return s.steps, s.tokens_processed


# ---- from a plain script ---------------------------------------------------------------------
SCRIPT = """
import json, sys
import torch
torch.set_num_threads(1)
from tokenrouter import LLM, ModelSpec, SamplingParams

path, prompts, lengths = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
llm = LLM(models={"m": ModelSpec(path=path, dtype="float64", kv_cache_tokens=256)}, num_threads=1)
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
outs = llm.generate(prompts, params)
stream = llm.stream(prompts[0], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
first = next(stream)  # and leave it open: the request is still running at exit
print(json.dumps({"token_ids": [o.token_ids for o in outs], "prompts": [o.prompt_token_ids for o in outs],
                  "first": first.token_ids}))
# no llm.close(): the process must still exit
"""


def test_from_a_plain_script_that_forgets_to_close(tmp_path, tiny_model):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model), json.dumps(PROMPTS), json.dumps(LENGTHS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a hang guard only: it exits in seconds
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["prompts"] == PROMPTS  # in order
    assert got["token_ids"] == [hf_greedy(tiny_model, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    assert got["first"] == hf_greedy(tiny_model, PROMPTS[0], 1)


# ---- inside running event loops ---------------------------------------------------------------
def _check_calls(llm, tiny_model, tokenizer):
    outs = llm.generate(PROMPTS, [_greedy(n) for n in LENGTHS])
    assert [o.token_ids for o in outs] == [hf_greedy(tiny_model, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    [one] = llm.generate(PROMPTS[1], _greedy(4))  # one prompt: a list of one output
    assert one.token_ids == hf_greedy(tiny_model, PROMPTS[1], 4)
    deltas = list(llm.stream(PROMPTS[2], _greedy(6)))
    assert [t for d in deltas for t in d.token_ids] == hf_greedy(tiny_model, PROMPTS[2], 6)
    assert deltas[-1].finish_reason == "length" and deltas[-1].output.text == "".join(d.text for d in deltas)
    chat = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    [a, b] = llm.chat([chat, chat + [{"role": "assistant", "content": "yo"}, *chat]], _greedy(3))
    assert a.prompt_token_ids == list(rendered) and len(b.prompt_token_ids) > len(rendered)
    assert llm.chat(chat, _greedy(3))[0].token_ids == a.token_ids == hf_greedy(tiny_model, list(rendered), 3)


@pytest.mark.parametrize("run", [lambda f: asyncio.run(f()), trio.run], ids=["asyncio", "trio"])
def test_inside_a_running_event_loop(llm, tiny_model, tokenizer, run):
    async def cell():  # a Jupyter cell: blocking calls while the caller's loop runs
        _check_calls(llm, tiny_model, tokenizer)
        with LLM(models={"inner": _spec(tiny_model)}, num_threads=1) as inner:  # made inside the loop too
            [out] = inner.generate(PROMPTS[0], _greedy(5))
            assert out.token_ids == hf_greedy(tiny_model, PROMPTS[0], 5)

    run(cell)


def test_from_several_threads_at_once(llm, tiny_model):
    results, errors = {}, []

    def caller(i):
        try:
            results[i] = llm.generate([PROMPTS[i]] * 2, _greedy(LENGTHS[i]))
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS)):
        assert [o.token_ids for o in results[i]] == [hf_greedy(tiny_model, p, n)] * 2


def test_prompts_given_together_are_batched(llm):
    before = llm.engine.stats()["m"].batch_size_histogram.get(4, 0)
    outs = llm.generate([[1, 2, 3 + i] for i in range(4)], _greedy(200))
    assert [len(o.token_ids) for o in outs] == [200] * 4
    # One at a time would never step 4 rows; submitted together, nearly every step does.
    assert llm.engine.stats()["m"].batch_size_histogram.get(4, 0) > before


def test_empty_list_is_an_empty_batch(llm):
    assert llm.generate([]) == [] and llm.chat([]) == []


# ---- bad input --------------------------------------------------------------------------------
CHAT = [{"role": "user", "content": "hi"}]
# (id, method, first argument, params, the field named, a fragment of the message)
REJECTED = [
    ("empty-prompt", "generate", "", None, "prompt", "is empty"),
    ("bad-in-a-batch", "generate", ["ok", ""], None, "prompt", "is empty (request 1 of 2)"),
    ("bad-id-in-a-batch", "generate", [[1, 2], [1, -1]], None, "prompt", "token id -1 is outside"),
    ("not-a-prompt", "generate", 42, None, "prompt", "got int"),
    ("params-dict", "generate", "hi", {"max_tokens": 3}, "params", "must be SamplingParams, got dict"),
    ("params-count", "generate", ["a", "b"], [_greedy(2)], "params", "1 SamplingParams for 2 prompts"),
    ("params-item", "generate", ["a", "b"], [_greedy(2), "x"], "params", "got str (request 1 of 2)"),
    ("too-big-for-the-pool", "generate", [1, 2, 3], SamplingParams(max_tokens=10**6), "max_tokens", "pool holds 384"),
    ("stop-id", "generate", "hi", SamplingParams(stop_token_ids=[10**9]), "stop_token_ids", "outside the vocabulary"),
    ("chat-role", "chat", [{"role": "wizard", "content": "x"}], None, "prompt[0].role", "unknown role 'wizard'"),
    ("chat-text", "chat", "hi", None, "messages", "got str"),
    ("chat-not-a-conversation", "chat", [CHAT, "hi"], None, "messages[1]", "must be a conversation"),
    ("chat-bad-in-a-batch", "chat", [CHAT, [{"role": "user"}]], None, "prompt[0].content", "(request 1 of 2)"),
    ("stream-empty", "stream", [], None, "prompt", "is empty"),
]


@pytest.mark.parametrize("method, arg, params, field, fragment", [pytest.param(*r[1:], id=r[0]) for r in REJECTED])
def test_bad_input_raises_the_engines_error_and_reaches_no_worker(llm, method, arg, params, field, fragment):
    before = _settled(llm)
    with pytest.raises(InvalidRequestError) as e:
        result = getattr(llm, method)(arg, params)
        if method == "stream":
            next(result)  # a stream checks its request when first read, as Engine.stream does
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(f"{field}: ") and fragment in str(e.value), str(e.value)
    assert _settled(llm) == before  # nothing was submitted, not even the good prompts of a batch
    assert llm.generate([1, 2], _greedy(2))[0].finish_reason == "length"  # and it goes on serving


def _llm_threads() -> set[str]:
    return {
        t.name for t in threading.enumerate() if t.name == "tokenrouter-llm" or t.name.startswith("tokenrouter-worker-")
    }


def test_bad_arguments_raise_at_construction_and_leave_no_thread(tmp_path, tiny_model):
    before = _llm_threads()
    with pytest.raises(ConfigError, match="^models: give at least one model"):
        LLM(models={})
    with pytest.raises(ConfigError, match="^num_threads"):
        LLM(models={"m": tiny_model}, num_threads=0)
    # An error at start (here: two vocabularies) raises in the caller's thread, and stops everything.
    alien = build_tiny_model(tmp_path / "alien", "qwen2", tokenizer=build_tokenizer(vocab_size=300))
    with pytest.raises(ConfigError, match="different tokenizers"):
        LLM(models={"small": tiny_model, "large": alien}, policy=RStitch())
    deadline = time.monotonic() + 60
    while _llm_threads() != before:
        assert time.monotonic() < deadline, f"threads left behind: {_llm_threads() - before}"
        time.sleep(0.01)


# ---- closing ----------------------------------------------------------------------------------
def test_close_twice_and_use_after_close(tiny_model):
    llm = LLM(models={"closing": _spec(tiny_model)}, num_threads=1)
    with llm:
        assert llm.generate([3, 4], _greedy(2))[0].token_ids == hf_greedy(tiny_model, [3, 4], 2)
    assert llm.closed
    llm.close()  # again: nothing happens
    with pytest.raises(EngineNotRunningError):
        llm.generate([3, 4], _greedy(2))
    with pytest.raises(EngineNotRunningError):
        next(llm.stream([3, 4], _greedy(2)))
    assert not any(t.name == "tokenrouter-worker-closing" for t in threading.enumerate())


def test_leaving_a_stream_early_aborts_and_abort_by_id(llm):
    for delta in llm.stream([7, 8, 9], _greedy(240)):
        break  # leaving early aborts
    assert delta.token_ids
    stream = llm.stream([7, 8, 9], _greedy(240), request_id="s1")
    first = next(stream)
    llm.abort("s1")
    rest = list(stream)
    assert rest[-1].finish_reason == "abort" and rest[-1].output.error is None
    assert 0 < len(first.token_ids) + sum(len(d.token_ids) for d in rest) < 240
    anyio.run(wait_all_free, llm.engine)


def test_closing_with_a_stream_in_flight_ends_it(tiny_model):
    llm = LLM(models={"m": _spec(tiny_model)}, num_threads=1)
    seen, errors, started = [], [], threading.Event()

    def reader():
        try:
            for delta in llm.stream([1, 2, 3], _greedy(240)):
                seen.append(delta)
                started.set()
        except BaseException as e:
            errors.append(e)
        started.set()

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(60)
    llm.close()
    t.join(60)
    assert not t.is_alive() and not errors, errors
    assert seen[-1].finish_reason == "abort"  # the stream ended with its last delta, no error


def test_an_llm_dropped_without_close_is_closed(tiny_model):
    llm = LLM(models={"dropped": _spec(tiny_model)}, num_threads=1)
    assert llm.generate([5, 5], _greedy(2))[0].finish_reason == "length"
    del llm
    gc.collect()
    deadline = time.monotonic() + 60
    while any(t.name == "tokenrouter-worker-dropped" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the dropped LLM's worker is still running"
        time.sleep(0.01)
