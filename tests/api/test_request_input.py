"""Bad requests to a running engine, table-driven: prompts (empty, too long, outside the vocabulary,
invalid Unicode, unknown chat roles), parameters and request ids; none reaches a worker, and the
engine goes on serving (tests/bad_input.py)."""

from __future__ import annotations

import time
from functools import partial

import anyio
import anyio.from_thread
import pytest

from tokenrouter import (
    ContextLengthExceededError,
    Engine,
    InvalidRequestError,
    ModelSpec,
    SamplingParams,
    TokenRouterError,
)
from tokenrouter.testing import live_sequences, requests_in_flight, workers_of

# ---- requests on a running engine --------------------------------------------------------------
MAX_MODEL_LEN = 64
GOOD = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


def _msg(role="user", content="hi"):
    return {"role": role, "content": content}


# (id, prompt or prompt(V) with V the vocabulary size, the field named, a fragment of the message)
PROMPT_REJECTED = [
    # text
    ("empty-str", "", "prompt", "is empty"),
    ("bytes", b"hello", "prompt", "not bytes"),
    ("bytes-invalid-utf8", b"\xff\xfe\xfd", "prompt", "not bytes"),
    ("bytearray", bytearray(b"hi"), "prompt", "not bytes"),
    ("memoryview", memoryview(b"hi"), "prompt", "not bytes"),
    ("lone-surrogate", "bad \ud800 text", "prompt", "lone surrogate"),
    ("split-surrogate-pair", "\ud83d\ude00", "prompt", "lone surrogate"),
    ("nul", "a\x00b", "prompt", "NUL"),
    ("only-nul", "\x00", "prompt", "NUL"),
    ("too-long-text", "x " * 200, "prompt", f"context holds {MAX_MODEL_LEN}"),
    # not a prompt at all
    ("none", None, "prompt", "got NoneType"),
    ("int", 42, "prompt", "got int"),
    ("float", 1.5, "prompt", "got float"),
    ("set", {1, 2}, "prompt", "got set"),
    ("bare-message", _msg(), "prompt", "got dict"),
    # token ids
    ("empty-list", [], "prompt", "is empty"),
    ("empty-tuple", (), "prompt", "is empty"),
    ("id-negative", [1, -1], "prompt", "token id -1 is outside the vocabulary"),
    ("id-vocab-size", lambda V: [1, V], "prompt", "outside the vocabulary"),
    ("id-huge", [10**20], "prompt", "outside the vocabulary"),
    ("id-bool", [True], "prompt", "item 0 is bool"),
    ("id-bool-mixed", [1, False], "prompt", "item 1 is bool"),
    ("id-str", [1, "2"], "prompt", "item 1 is str"),
    ("id-float", [1, 2.0], "prompt", "item 1 is float"),
    ("id-none", [1, None], "prompt", "item 1 is NoneType"),
    ("id-then-message", [1, _msg()], "prompt", "item 1 is dict"),
    ("nested-ids", [[1, 2]], "prompt", "item 0 is list"),
    ("nested-messages", [[_msg()]], "prompt", "item 0 is list"),
    ("too-long-ids", [1] * MAX_MODEL_LEN, "prompt", f"is {MAX_MODEL_LEN} tokens"),
    # chat messages
    ("role-unknown", [_msg("wizard")], "prompt[0].role", "unknown role 'wizard'"),
    ("role-case", [_msg("User")], "prompt[0].role", "unknown role"),
    ("role-missing", [{"content": "hi"}], "prompt[0].role", "unknown role None"),
    ("role-not-str", [_msg(["user"])], "prompt[0].role", "unknown role"),
    ("role-second", [_msg(), _msg("bot")], "prompt[1].role", "unknown role 'bot'"),
    ("content-missing", [{"role": "user"}], "prompt[0].content", "must be a string"),
    ("content-none-user", [_msg(content=None)], "prompt[0].content", "must be a string"),
    ("content-int", [_msg(content=3)], "prompt[0].content", "must be a string"),
    ("content-image", [_msg(content=[{"type": "image_url", "image_url": {}}])], "prompt[0].content[0]", "text part"),
    ("content-part-str", [_msg(content=["hi"])], "prompt[0].content[0]", "must be a text part"),
    ("content-surrogate", [_msg(content="\udfff")], "prompt[0].content", "lone surrogate"),
    ("content-nul", [_msg(content="a\x00")], "prompt[0].content", "NUL"),
    ("message-str", [_msg(), "hi"], "prompt[1]", "must be a dict, got str"),
    ("message-ids", [_msg(), 5], "prompt[1]", "must be a dict, got int"),
    ("too-long-chat", [_msg(content="x " * 200)], "prompt", f"context holds {MAX_MODEL_LEN}"),
]

# (id, params or params(V), request_id, field, fragment)
OTHER_REJECTED = [
    ("params-dict", {"max_tokens": 3}, None, "params", "must be SamplingParams, got dict"),
    ("params-str", "greedy", None, "params", "got str"),
    ("params-class", SamplingParams, None, "params", "got "),
    ("stop-id-vocab-size", lambda V: SamplingParams(stop_token_ids=[V]), None, "stop_token_ids", "outside"),
    ("stop-id-huge", SamplingParams(stop_token_ids=[1, 10**12]), None, "stop_token_ids", "outside"),
    ("request-id-empty", GOOD, "", "request_id", "non-empty string"),
    ("request-id-int", GOOD, 7, "request_id", "non-empty string"),
    ("request-id-bytes", GOOD, b"r1", "request_id", "non-empty string"),
]

PROMPT_ACCEPTED = [
    ("ansi-escape", "\x1b[31mred\x1b[0m text"),
    ("tab-newline-cr", "a\tb\nc\r\nd"),
    ("other-controls", "bell\x07 backspace\x08 form-feed\x0c del\x7f"),
    ("unicode", "Ünïcödé 🙂 你好"),
    ("one-char", "a"),
    ("id-zero", [0]),
    ("id-last", lambda V: [V - 1]),
    ("ids-tuple", (1, 2, 3)),
    ("longest-ids", [1] * (MAX_MODEL_LEN - 1)),
    ("chat-every-role", [_msg(r) for r in ("system", "developer", "user", "assistant", "tool")]),
    ("chat-assistant-none", [_msg(), _msg("assistant", None), _msg()]),
    ("chat-extra-keys", [{"role": "user", "content": "hi", "name": "bob"}]),
    ("chat-controls", [_msg(content="\x1b[1mbold\x1b[0m\tand\nlines")]),
]


@pytest.fixture(scope="module")
def running(tiny_model, tokenizer):
    """One engine for the whole module, on an event loop in a background thread."""
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=1024, max_model_len=MAX_MODEL_LEN)
    engine = Engine(models={"m": spec})
    with anyio.from_thread.start_blocking_portal() as portal, portal.wrap_async_context_manager(engine):
        yield engine, portal, len(tokenizer)


class _Spy:
    """Counts what is submitted to a worker (and passes it on); `before`: its stats when it began."""

    def __init__(self, worker, before):
        self.worker, self.before, self.real, self.submitted = worker, before, worker.submit, []

    def __call__(self, req):
        self.submitted.append(req.request_id)
        return self.real(req)


def _settle(worker, timeout: float = 10.0):
    """Wait until the worker holds nothing and its step count no longer moves."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        s = worker.stats()
        if s.running == s.waiting == s.pending == 0 and s.kv_blocks_free == s.kv_blocks_total and s.steps == last:
            return s
        assert time.monotonic() < deadline, f"worker did not settle: {s}"
        last = s.steps
        time.sleep(0.005)


@pytest.fixture
def spy(running, monkeypatch):
    """What is submitted to the module's worker from now on, once it has settled."""
    worker = workers_of(running[0])["m"]
    counting = _Spy(worker, _settle(worker))
    monkeypatch.setattr(worker, "submit", counting)
    return counting


async def _consume(engine, how, prompt, params, request_id):
    kwargs = {} if request_id is None else {"request_id": request_id}
    if how == "generate":
        return await engine.generate(prompt, params, **kwargs)
    async for _ in engine.stream(prompt, params, **kwargs):
        pass


def _rejected(running, spy, how, prompt, params, request_id, field, fragment):
    engine, portal, vocab = running
    prompt = prompt(vocab) if callable(prompt) else prompt
    params = params(vocab) if callable(params) and not isinstance(params, type) else params
    worker, before = spy.worker, spy.before
    with pytest.raises(TokenRouterError) as e:
        portal.call(_consume, engine, how, prompt, params, request_id)
    assert isinstance(e.value, InvalidRequestError), f"{type(e.value).__name__}: {e.value}"
    too_long = "context holds" in str(e.value)  # a kind a caller tells apart (context_length_exceeded)
    assert (type(e.value) is ContextLengthExceededError) is too_long, f"{type(e.value).__name__}: {e.value}"
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(f"{field}: ") and fragment in str(e.value), str(e.value)
    # none reaches a worker
    assert spy.submitted == []
    assert not worker.inbox and not live_sequences(worker) and requests_in_flight(engine) == 0
    after = worker.stats()
    assert (after.steps, after.tokens_processed) == (before.steps, before.tokens_processed)
    # and the engine goes on serving
    out = portal.call(engine.generate, [1, 2, 3], GOOD)
    assert out.finish_reason == "length" and len(out.token_ids) == 2
    assert len(spy.submitted) == 1


@pytest.mark.parametrize("how", ["generate", "stream"])
@pytest.mark.parametrize("prompt, field, fragment", [pytest.param(*r[1:], id=r[0]) for r in PROMPT_REJECTED])
def test_bad_prompt_is_rejected_before_any_worker(running, spy, how, prompt, field, fragment):
    _rejected(running, spy, how, prompt, GOOD, None, field, fragment)


@pytest.mark.parametrize("how", ["generate", "stream"])
@pytest.mark.parametrize("params, request_id, field, fragment", [pytest.param(*r[1:], id=r[0]) for r in OTHER_REJECTED])
def test_bad_params_or_request_id_is_rejected_before_any_worker(running, spy, how, params, request_id, field, fragment):
    _rejected(running, spy, how, [1, 2, 3], params, request_id, field, fragment)


@pytest.mark.parametrize("prompt", [pytest.param(r[1], id=r[0]) for r in PROMPT_ACCEPTED])
def test_unusual_but_valid_prompts_are_served(running, spy, prompt):
    engine, portal, vocab = running
    prompt = prompt(vocab) if callable(prompt) else prompt
    out = portal.call(engine.generate, prompt, GOOD)
    room = MAX_MODEL_LEN - len(out.prompt_token_ids)  # max_tokens is capped to what the context holds
    assert out.finish_reason == "length" and len(out.token_ids) == min(GOOD.max_tokens, room)
    assert len(spy.submitted) == 1


def test_duplicate_request_id_is_rejected_while_the_first_runs(running, spy):
    engine, portal, _ = running

    async def main():
        first = engine.stream([1, 2, 3], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), request_id="r1")
        try:
            await first.__anext__()  # r1 is in flight
            for how in ("generate", "stream"):
                with pytest.raises(InvalidRequestError) as e:
                    await _consume(engine, how, [4, 5], GOOD, "r1")
                assert e.value.field == "request_id" and "'r1' is already in use" in str(e.value)
        finally:
            await first.aclose()

    portal.call(main)
    assert spy.submitted == ["r1"]  # only the first
    _settle(spy.worker)
    # once it has ended, the id is free again
    assert portal.call(partial(engine.generate, [4, 5], GOOD, request_id="r1")).finish_reason == "length"


def test_max_tokens_none_writes_the_room_the_prompt_leaves(running):
    """`max_tokens=None` (OpenAI's default): up to the context, and never more than the smallest KV
    pool of the models the request may visit holds."""
    engine, portal, _ = running
    params = SamplingParams(max_tokens=None, ignore_eos=True, temperature=0)
    out = portal.call(engine.generate, [5, 6, 7], params)
    assert len(out.token_ids) == MAX_MODEL_LEN - 3 and out.finish_reason == "length"
