"""Errors as OpenAI sends them, raised by the SDK as its own exceptions: a bad field is a 400
naming it (before any stream starts), a prompt past the context `context_length_exceeded`, an
unknown model 404, an engine that is not running 503, a failed request 500."""

from __future__ import annotations

import anyio
import httpx2
import openai
import pytest

from tests.helpers import wait_all_free
from tests.openai.conftest import HI, LONG, WEATHER, Knobs, run_async
from tokenrouter import Engine, EngineNotRunningError, ModelSpec
from tokenrouter.openai import BASE_URL, async_client, client
from tokenrouter.openai.httpx2_transports import AsyncHttpx2Transport

IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}
BAD = [
    # (the request's fields, the param the error names)
    ({"temperature": 5000}, "temperature"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"seed": -1}, "seed"),
    ({"n": 0}, "n"),
    ({"stop": [""]}, "stop"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [IMAGE]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "function", "name": "f", "content": "hi"}]}, "messages[0].role"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "any", "tools": []}}},
        "tool_choice.allowed_tools.mode",
    ),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}}, "guided_regex"),
    ({"extra_body": {"guided_grammar": "root ::= nothing_defined"}}, "guided_grammar"),
    ({"extra_body": {"regex": ""}}, "regex"),
    ({"extra_body": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
    ({"extra_body": {"top_k": -5}}, "top_k"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
    ({"extra_body": {"functions": [{"name": "f"}]}}, "functions"),
]


def test_a_bad_field_is_a_400_naming_it(llm):
    async def test(client):
        for fields, param in BAD:
            request = {"model": "small", "messages": HI, "max_tokens": 2, **fields}
            for stream in (False, True):  # a stream is refused before it starts
                if stream and "stream_options" in fields:
                    continue
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.chat.completions.create(**request, stream=stream)
                error = caught.value
                assert error.status_code == 400 and error.type == "invalid_request_error", fields
                assert error.param == param, (fields, error.message)
                assert error.body["message"].startswith(f"{param}: "), error.body
        await wait_all_free(llm.engine)

    run_async(llm, test)
    with pytest.raises(openai.BadRequestError) as caught:  # the sync client alike
        client(llm).chat.completions.create(model="small", messages=HI, temperature=-1)
    assert caught.value.param == "temperature"


def test_a_prompt_past_the_context(llm):
    async def test(client):
        messages = [{"role": "user", "content": "hello " * 500}]  # more than the 2048 tokens of context
        for extra in ({}, {"max_tokens": 4}, {"max_tokens": 4, "stream": True}):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="small", messages=messages, **extra)
            assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"

    run_async(llm, test)


def test_unknown_models_and_urls_are_404(llm):
    async def test(client):
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="gpt-5", messages=HI)
        assert caught.value.code == "model_not_found" and caught.value.param == "model"
        assert "small" in caught.value.message
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-5")
        with pytest.raises(openai.NotFoundError):
            await client.embeddings.create(model="small", input="hi")

    run_async(llm, test)

    async def raw():
        transport = AsyncHttpx2Transport(llm.engine)
        async with httpx2.AsyncClient(transport=transport, base_url=BASE_URL) as http:
            response = await http.post("/chat/completions", content=b"{not json")
            assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
            response = await http.get("/chat/completions")
            assert response.status_code == 405

    anyio.run(raw)


def test_an_engine_not_running_is_503(long_pair):
    specs = {n: ModelSpec(path=p, dtype="float64") for n, p in long_pair.items()}

    async def main():
        async with async_client(Engine(models=specs, policy=Knobs())) as c:  # never started
            for extra in ({}, {"max_tokens": 2}, {"stream": True}):
                with pytest.raises(openai.InternalServerError) as caught:
                    await c.chat.completions.create(model="small", messages=HI, **extra)
                assert caught.value.status_code == 503 and caught.value.code == "engine_not_running"
                assert caught.value.response.headers["x-should-retry"] == "false"

    anyio.run(main)

    class Closed:
        """An LLM after close(), as its `run` answers."""

        engine = Engine(models=specs, policy=Knobs())

        def run(self, fn, *args):
            raise EngineNotRunningError("the LLM is closed")

    with pytest.raises(openai.InternalServerError) as caught:
        client(Closed()).chat.completions.create(model="small", messages=HI)
    assert caught.value.status_code == 503 and "the LLM is closed" in caught.value.message


def test_a_failed_request_is_500(llm):
    policy = llm.engine.info().policy

    async def test(client):
        policy.fail = True
        try:
            for stream in (False, True):
                with pytest.raises(openai.InternalServerError) as caught:
                    await client.chat.completions.create(model="small", messages=HI, max_tokens=4, stream=stream)
                error = caught.value
                assert error.status_code == 500 and error.code == "request_failed"
                assert "injected: the policy broke" in error.message
                assert error.response.headers["x-should-retry"] == "false"
        finally:
            policy.fail = False
        # failing after the stream began: an error event, which the SDK raises
        stream = await client.chat.completions.create(model="small", messages=HI, stream=True, **LONG)
        await stream.__anext__()
        policy.fail = True
        try:
            with pytest.raises(openai.APIError, match="injected: the policy broke"):
                async for _ in stream:
                    pass
        finally:
            policy.fail = False
        await wait_all_free(llm.engine)

    run_async(llm, test)
