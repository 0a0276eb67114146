"""The example an application's tests follow: tokenrouter.pytest_plugin's session engine (on a tiny
random pair) used from a test under pytest-asyncio, under anyio's plugin with the asyncio and trio
backends, and from a plain test through the blocking LLM. Each request binds to the loop of the
test that awaits it, so the one engine serves them all."""

import asyncio

import pytest
import sniffio

from tokenrouter import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPT = [{"role": "user", "content": "Plan the next step of the agent loop."}]


async def _check_routed_request(engine, llm):
    """What an application's test would check, plus that this loop's results equal the LLM's."""
    out = await engine.generate(PROMPT, GREEDY)
    assert out.finish_reason == "length" and len(out.token_ids) == GREEDY.max_tokens
    assert set(out.tokens_per_model()) == {"small", "large"} and out.num_handoffs > 0  # really routed
    deltas = [d async for d in engine.stream(PROMPT, GREEDY)]
    assert [t for d in deltas for t in d.token_ids] == out.token_ids
    assert deltas[-1].output.token_models == out.token_models
    # The blocking facade, called from inside this running loop, is served by the same engine.
    [same] = llm.chat(PROMPT, GREEDY)
    assert same.token_ids == out.token_ids


@pytest.mark.asyncio
async def test_under_pytest_asyncio(tokenrouter_engine, tokenrouter_llm):
    asyncio.get_running_loop()  # pytest-asyncio's loop
    await _check_routed_request(tokenrouter_engine, tokenrouter_llm)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_under_anyio(tokenrouter_engine, tokenrouter_llm, anyio_backend):
    assert sniffio.current_async_library() == anyio_backend
    await _check_routed_request(tokenrouter_engine, tokenrouter_llm)


def test_from_a_plain_test(tokenrouter_llm):
    outs = tokenrouter_llm.generate([[5, 6, 7], [8, 9]], GREEDY)
    assert [len(o.token_ids) for o in outs] == [GREEDY.max_tokens] * 2
    assert [o.prompt_token_ids for o in outs] == [[5, 6, 7], [8, 9]]


def test_pytest_asyncio_is_strict(pytestconfig):
    """pytest-asyncio runs only the tests marked asyncio: every other test runs as it did before."""
    assert pytestconfig.getini("asyncio_mode") == "strict"
