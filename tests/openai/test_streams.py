"""Streams: OpenAI's chunk order and framing, tool calls as deltas, n samples, and the request's
end when the caller leaves (closing the stream, cancelling its task, the read timeout), through
the async client, the sync client, both HTTP libraries, and `ChatCompletions` without HTTP."""

from __future__ import annotations

import json
from typing import Literal

import anyio
import httpx
import httpx2
import openai
import pytest
from pydantic import BaseModel

from tests.helpers import wait_all_free, wait_until
from tests.openai.conftest import HI, LONG, TIME, WEATHER, aborts, run_async
from tokenrouter.openai import BASE_URL, ChatCompletions, async_client, client
from tokenrouter.openai.httpx2_transports import AsyncHttpx2Transport, Httpx2Transport
from tokenrouter.openai.httpx_transports import AsyncHttpxTransport, HttpxTransport


def check_order(chunks: list, n: int = 1) -> list:
    """OpenAI's order per choice (role, content, tool calls, finish); the choices' finish reasons."""
    reasons = []
    for i in range(n):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and mine[0].delta.content == ""
        assert all(c.delta.role is None for c in mine[1:])
        stage = [0 if c.delta.content is not None else 1 if c.delta.tool_calls else 2 for c in mine[1:]]
        assert stage == sorted(stage) and stage[-1] == 2 and stage.count(2) == 1
        reasons.append(mine[-1].finish_reason)
    return reasons


def test_a_stream_in_openais_order(llm):
    async def test(client):
        stream = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=7, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        assert check_order(chunks) == ["length"] or check_order(chunks) == ["stop"]
        assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
        last = chunks[-1]
        assert last.choices == [] and last.usage.completion_tokens <= 7
        assert sum(last.tokenrouter["tokens_per_model"].values()) == last.usage.completion_tokens
        assert all(c.usage is None for c in chunks[:-1])
        text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
        # the same request, not streamed, writes the same text (greedy)
        plain = await client.chat.completions.create(model="small", messages=HI, max_tokens=7, temperature=0)
        stream = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=7, temperature=0, stream=True, logprobs=True, top_logprobs=1
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == plain.choices[0].message.content
        entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert [e.model for e in entries] == ["small"] * 3 + ["large"] * 3 + ["small"]
        assert "tokenrouter" in chunks[-1].model_extra  # no usage chunk: the finish chunk carries it

    run_async(llm, test)


def test_the_raw_events_end_with_done(llm):
    async def test(client):
        async with client.chat.completions.with_streaming_response.create(
            model="large", messages=HI, max_tokens=3, stream=True
        ) as response:
            assert response.headers["content-type"] == "text/event-stream"
            lines = [line async for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]" and all(line.startswith("data: {") for line in lines[:-1])
        assert json.loads(lines[0][6:])["choices"][0]["delta"]["role"] == "assistant"

    run_async(llm, test)


def test_n_streams_interleave_by_index(llm):
    async def test(client):
        stream = await client.chat.completions.create(
            model="small", messages=HI, n=2, max_tokens=4, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = [chunk async for chunk in stream]
        assert check_order(chunks, n=2) == ["length", "length"]
        assert sum(chunks[-1].tokenrouter["tokens_per_model"].values()) == 8
        await wait_all_free(llm.engine)

    run_async(llm, test)


def test_tool_calls_stream_as_deltas(llm):
    async def test(client):
        stream = await client.chat.completions.create(
            model="large",
            messages=HI,
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=128,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
        assert check_order(chunks) == ["tool_calls"]
        assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks)
        calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
        assert len(calls) == 1 and calls[0].index == 0 and calls[0].id and calls[0].type == "function"
        assert calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments)["unit"] in ("c", "f")

    run_async(llm, test)


def test_closing_a_stream_early_aborts_it(llm):
    async def test(client):
        before = aborts(llm)
        stream = await client.chat.completions.create(model="small", messages=HI, stream=True, **LONG)
        await stream.__anext__()
        await stream.__anext__()
        await stream.close()
        assert aborts(llm) == before + 1
        await wait_all_free(llm.engine)
        # cancelling the task that waits for the next chunk: the same
        reading = anyio.Event()

        async def read():
            stream = await client.chat.completions.create(model="small", messages=HI, stream=True, **LONG)
            await stream.__anext__()
            llm.engine.info().policy.delay_s = 0.2  # the next chunks are slow to come
            reading.set()
            async for _ in stream:
                pass

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await reading.wait()
                await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
        finally:
            llm.engine.info().policy.delay_s = 0.0
        assert aborts(llm) == before + 2
        # a request that is not streamed, cancelled while it runs
        with anyio.move_on_after(0.05):
            await client.chat.completions.create(model="small", messages=HI, **LONG)
        await wait_until(lambda: aborts(llm) == before + 3, what="three aborts")
        await wait_all_free(llm.engine)

    run_async(llm, test)


def test_the_read_timeout_aborts_the_request(llm):
    async def test(client):
        before = aborts(llm)
        with pytest.raises(openai.APITimeoutError):  # not streamed: the whole answer within it
            await client.chat.completions.create(model="small", messages=HI, timeout=0.05, **LONG)
        stream = await client.chat.completions.create(model="small", messages=HI, stream=True, timeout=0.5, **LONG)
        await stream.__anext__()
        llm.engine.info().policy.delay_s = 1.0  # a step now takes longer than a read may wait
        try:
            with pytest.raises(openai.APITimeoutError):
                async for _ in stream:
                    pass
        finally:
            llm.engine.info().policy.delay_s = 0.0
        await wait_until(lambda: aborts(llm) == before + 2, what="two aborts")
        await wait_all_free(llm.engine)

    run_async(llm, test)


def test_the_sync_client(llm):
    sync = client(llm)
    out = sync.chat.completions.create(model="large", messages=HI, max_tokens=4, temperature=0)
    chunks = list(sync.chat.completions.create(model="large", messages=HI, max_tokens=4, temperature=0, stream=True))
    check_order(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content
    before = aborts(llm)
    stream = sync.chat.completions.create(model="small", messages=HI, stream=True, **LONG)
    next(stream)
    stream.close()  # read, then left
    sync.chat.completions.create(model="small", messages=HI, stream=True, **LONG).close()  # never read
    with pytest.raises(openai.APITimeoutError):
        sync.chat.completions.create(model="small", messages=HI, timeout=0.05, **LONG)
    anyio.run(wait_until, lambda: aborts(llm) == before + 3, 10.0, "three aborts")
    anyio.run(wait_all_free, llm.engine)
    assert [m.id for m in sync.models.list().data] == ["small", "large"]


@pytest.mark.parametrize("library", [httpx, httpx2])
def test_either_http_library_under_the_sdk(llm, library):
    """openai 3 takes an httpx client as well as an httpx2 one (async_client picks httpx2)."""
    transports = {httpx: (AsyncHttpxTransport, HttpxTransport), httpx2: (AsyncHttpx2Transport, Httpx2Transport)}
    async_transport, sync_transport = transports[library]

    async def main():
        http_client = library.AsyncClient(transport=async_transport(llm.engine))
        async with openai.AsyncOpenAI(base_url=BASE_URL, api_key="-", max_retries=0, http_client=http_client) as c:
            out = await c.chat.completions.create(model="small", messages=HI, max_tokens=3)
            assert out.usage.completion_tokens <= 3
            chunks = [chunk async for chunk in await c.chat.completions.create(**STREAM)]
            check_order(chunks)

    STREAM = {"model": "small", "messages": HI, "max_tokens": 3, "stream": True}
    anyio.run(main)
    http_client = library.Client(transport=sync_transport(llm))
    with openai.OpenAI(base_url=BASE_URL, api_key="-", max_retries=0, http_client=http_client) as c:
        check_order(list(c.chat.completions.create(**STREAM)))
    # and with no SDK: the library's own client, the events as they come
    with library.Client(transport=sync_transport(llm), base_url=BASE_URL) as raw:
        with raw.stream("POST", "/chat/completions", json=STREAM) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        with pytest.raises(library.ReadTimeout):  # the library's own timeout, as a socket's read raises it
            raw.post(
                "/chat/completions",
                json={**STREAM, "stream": False, **LONG["extra_body"], "max_tokens": 400},
                timeout=0.02,
            )


def test_chat_completions_without_http(llm):
    async def main():
        chat = ChatCompletions(llm.engine)
        out = await chat.create({"model": "small", "messages": HI, "max_tokens": 2})
        assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] <= 2
        before = aborts(llm)
        stream = await chat.create({"model": "small", "messages": HI, "stream": True, "max_tokens": 400})
        await stream.aclose()  # begun (its first delta came), never read: the request is aborted
        assert aborts(llm) == before + 1
        stream = await chat.create({"model": "small", "messages": HI, "stream": True, "max_tokens": 3})
        chunks = [chunk async for chunk in stream]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and "tokenrouter" in chunks[-1]
        await wait_all_free(llm.engine)

    anyio.run(main)


def test_under_trio(llm):
    async def main():
        async with async_client(llm.engine) as c:
            out = await c.chat.completions.create(model="small", messages=HI, max_tokens=3)
            assert out.usage.completion_tokens <= 3
            before = aborts(llm)
            stream = await c.chat.completions.create(model="small", messages=HI, stream=True, **LONG)
            await stream.__anext__()
            await stream.close()
            assert aborts(llm) == before + 1
            await wait_all_free(llm.engine)

    anyio.run(main, backend="trio")


class Verdict(BaseModel):
    ok: bool


class GetWeather(BaseModel):
    unit: Literal["c", "f"]


def test_the_sdks_stream_helper_parses(llm):
    """`chat.completions.stream` accumulates the chunks into a parsed completion, as frameworks use it."""

    async def test(client):
        async with client.chat.completions.stream(
            model="large", messages=HI, response_format=Verdict, max_tokens=32
        ) as stream:
            final = await stream.get_final_completion()
        assert isinstance(final.choices[0].message.parsed, Verdict)
        tool = openai.pydantic_function_tool(GetWeather)
        async with client.chat.completions.stream(
            model="large", messages=HI, tools=[tool], tool_choice="required", parallel_tool_calls=False, max_tokens=128
        ) as stream:
            events = [event.type async for event in stream]
            final = await stream.get_final_completion()
        assert "tool_calls.function.arguments.done" in events
        [call] = final.choices[0].message.tool_calls
        assert isinstance(call.function.parsed_arguments, GetWeather) and final.choices[0].finish_reason == "tool_calls"

    run_async(llm, test)
