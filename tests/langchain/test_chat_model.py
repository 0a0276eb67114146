"""`ChatTokenRouter` beyond the standard suite, on the tiny pair under `EveryK(3)`: the routing record
in `response_metadata` (invoke, the last streamed chunk, async), usage with cached prompt tokens,
forced tool calls and a conversation that answers them, structured output parsed, the model's
name and clients, and an Engine-only model refusing blocking calls."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, ValidationError

from tests.helpers import EveryK
from tokenrouter import Engine
from tokenrouter.langchain import ChatTokenRouter, SyncCallError

EOS_OFF = {"ignore_eos": True}  # random models end at random: these answers run to max_tokens


@tool
def get_weather(unit: Literal["c", "f"]) -> str:
    """The weather, in a unit."""
    return "sunny, 20 degrees"


@tool
def get_time(utc: bool) -> str:
    """The time of day."""
    return "noon"


class Verdict(BaseModel):
    ok: bool


def assert_routed(record: dict, output_tokens: int) -> None:
    """Who wrote each token, summed over both models; EveryK(3) moves the request every third token."""
    assert sum(record["tokens_per_model"].values()) == output_tokens
    assert set(record["tokens_per_model"]) == {"small", "large"} and record["num_handoffs"] >= 1
    assert set(record["tokens_processed"]) == {"small", "large"}


def test_invoke_carries_the_routing_record_and_usage(llm):
    model = ChatTokenRouter(engine=llm, max_tokens=9, temperature=0, extra_body=EOS_OFF)
    assert model.model_name == "small"  # the policy's entry model
    reply = model.invoke("hi")
    assert isinstance(reply, AIMessage) and reply.response_metadata["finish_reason"] == "length"
    assert reply.response_metadata["model_name"] == "small"
    assert_routed(reply.response_metadata["tokenrouter"], 9)
    usage = reply.usage_metadata
    assert usage["output_tokens"] == 9 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + 9
    again = model.invoke("hi")
    assert again.content == reply.content  # greedy
    assert 0 < again.usage_metadata["input_token_details"]["cache_read"] <= usage["input_tokens"]  # the prefix cache


def test_the_last_streamed_chunk_carries_the_record(llm):
    model = ChatTokenRouter(engine=llm, max_tokens=9, temperature=0, extra_body=EOS_OFF)
    chunks = list(model.stream("hi"))
    # the engine's last chunk brings usage and the record; LangChain then closes with an empty chunk
    [carrier] = [c for c in chunks if "tokenrouter" in c.response_metadata]
    assert carrier is chunks[-2] and carrier.usage_metadata["output_tokens"] == 9
    assert chunks[-1].chunk_position == "last"
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk
    assert full.content == model.invoke("hi").content
    assert_routed(full.response_metadata["tokenrouter"], 9)  # once: merging did not add it up twice
    assert full.usage_metadata["output_tokens"] == 9 and full.usage_metadata["input_tokens"] > 0
    assert full.response_metadata["model_name"] == "small"


def test_an_engine_answers_async_calls(llm):
    model = ChatTokenRouter(engine=llm.engine, model="large", max_tokens=9, temperature=0, extra_body=EOS_OFF)

    async def main():
        reply = await model.ainvoke("hi")
        full = None
        async for chunk in model.astream("hi"):
            full = chunk if full is None else full + chunk
        return reply, full, await model.abatch(["hi", "hello"])

    reply, full, batch = asyncio.run(main())
    assert reply.response_metadata["model_name"] == "large"
    assert_routed(reply.response_metadata["tokenrouter"], 9)
    assert full.content == reply.content and full.response_metadata["tokenrouter"]["tokens_per_model"]
    assert full.usage_metadata["output_tokens"] == 9
    assert [m.usage_metadata["output_tokens"] for m in batch] == [9, 9]


def test_an_engine_only_model_refuses_blocking_calls(llm):
    model = ChatTokenRouter(engine=llm.engine, max_tokens=4)
    before = sum(llm.metrics().requests.values())
    for call in (lambda: model.invoke("hi"), lambda: list(model.stream("hi")), lambda: model.batch(["hi"])):
        with pytest.raises(SyncCallError, match=r"async calls only .* give it an LLM: ChatTokenRouter\(engine=LLM"):
            call()
    with pytest.raises(SyncCallError):
        model.bind_tools([get_weather]).invoke("hi")
    assert sum(llm.metrics().requests.values()) == before  # nothing was sent anywhere


@pytest.mark.parametrize("choice, called", [("any", "get_weather"), ("get_time", "get_time")], ids=["any", "named"])
def test_bound_tools_are_called_when_forced(llm, choice, called):
    """Forced calls, constrained: "any" (OpenAI's "required") with one tool, a tool named among two."""
    model = ChatTokenRouter(engine=llm, max_tokens=128, temperature=0)
    tools = [get_weather] if choice == "any" else [get_weather, get_time]
    with_tools = model.bind_tools(tools, tool_choice=choice, parallel_tool_calls=False)
    question = HumanMessage("What is the weather?")
    reply = with_tools.invoke([question])
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    [call] = reply.tool_calls
    assert call["name"] == called and call["id"] and call["type"] == "tool_call"
    assert set(call["args"]) == ({"unit"} if called == "get_weather" else {"utc"})
    full = None
    for chunk in with_tools.stream([question]):
        full = chunk if full is None else full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [(call["name"], call["args"])]
    # the next turn: the call and its result go back in LangChain's messages
    result = {"get_weather": get_weather, "get_time": get_time}[called].invoke(call)
    assert isinstance(result, ToolMessage)
    after = model.bind_tools(tools, tool_choice="none").invoke([question, reply, result], max_tokens=4)
    assert after.tool_calls == [] and after.usage_metadata["input_tokens"] > reply.usage_metadata["input_tokens"]


# LangChain dumps openai's stream events, whose `parsed` field is typed None, and pydantic says so
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_is_parsed(llm, method):
    model = ChatTokenRouter(engine=llm, max_tokens=128, temperature=0)
    structured = model.with_structured_output(Verdict, method=method, include_raw=True)
    out = structured.invoke("Is the sky blue?")
    assert isinstance(out["parsed"], Verdict) and out["parsing_error"] is None
    assert out["raw"].response_metadata["tokenrouter"]["tokens_per_model"]

    async def streamed():
        return [chunk async for chunk in model.with_structured_output(Verdict, method=method).astream("Sky?")]

    assert isinstance(asyncio.run(streamed())[-1], Verdict)
    full = None
    for chunk in model.bind(response_format=Verdict).stream("Sky?"):  # the stream .parse() reads
        full = chunk if full is None else full + chunk
    assert (
        sum(full.response_metadata["tokenrouter"]["tokens_per_model"].values()) == full.usage_metadata["output_tokens"]
    )


def test_the_model_is_made_from_an_engine_only(llm, tool_pair):
    model = ChatTokenRouter(engine=llm)
    assert str(model.root_client.base_url).startswith("http://tokenrouter.invalid/")
    assert str(model.root_async_client.base_url).startswith("http://tokenrouter.invalid/")
    assert model.root_client.max_retries == 0  # a retry would run the request again
    assert ChatTokenRouter(engine=llm, max_retries=2, timeout=5).root_async_client.timeout == 5
    unstarted = Engine(models=tool_pair, policy=EveryK(3))  # made before the engine starts, as with `async with`
    assert ChatTokenRouter(engine=unstarted).model_name == "small"
    with pytest.raises(ValidationError, match="'huge' is not served by the engine"):
        ChatTokenRouter(engine=llm, model="huge")
    with pytest.raises(ValidationError, match="must be a tokenrouter Engine or LLM"):
        ChatTokenRouter(engine="http://localhost:8000")
    with pytest.raises(ValidationError, match="Chat Completions only"):
        ChatTokenRouter(engine=llm, use_responses_api=True)


def test_tokens_are_counted_with_the_engines_tokenizer(llm):
    model = ChatTokenRouter(engine=llm)
    text = "def add(a, b):"
    assert model.get_token_ids(text) == llm.engine.info().tokenizer.encode(text, add_special_tokens=False)
    assert model.get_num_tokens_from_messages([HumanMessage(text)]) >= model.get_num_tokens(text)
