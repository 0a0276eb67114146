"""The agent frameworks users already have, on the demo pair (Qwen2.5-Coder 0.5B/1.5B under
RStitch(0.03), whose chat template renders tools), through `tokenrouter.openai`'s clients: each
framework's own agent, with a tool and a structured output. Marked `real_model`: they run when the
pair is in the store and the framework is installed (`pip install 'tokenrouter[agents]'`).

What is asserted is what the framework and the engine guarantee, not the 1.5B's judgement: the
runs end with an output of the declared type, a forced tool call reaches the tool, streams end.
Every agent samples greedily (temperature 0), so a run writes the same tokens each time.
"""

from __future__ import annotations

import anyio
import pytest
from pydantic import BaseModel

from tests.helpers import wait_all_free
from tokenrouter import LLM, store

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
        reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
    ),
]


class Report(BaseModel):
    city: str
    temperature_c: int


CALLS: list[str] = []


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name
    """
    CALLS.append(city)
    return f"It is sunny and 21 C in {city}."


@pytest.fixture(scope="module")
def llm():
    with LLM(num_threads=2) as llm:  # the demo pair under RStitch(0.03)
        yield llm


def _free(llm) -> None:
    llm.run(wait_all_free, llm.engine)


def test_openai_agents_with_a_tool_and_an_output_type(llm):
    """openai-agents sends the tools and its output type (as response_format) on every call: the
    first turn is forced to call the tool, the next is free to call it again or answer in the
    schema, and the run ends with a `Report`. Then the same agent streamed."""
    agents = pytest.importorskip("agents")
    from tokenrouter.openai import async_client

    agents.set_tracing_disabled(True)
    CALLS.clear()

    async def main():
        model = agents.OpenAIChatCompletionsModel(model="large", openai_client=async_client(llm.engine))
        agent = agents.Agent(
            name="weather",
            instructions="Find the weather with the tool, then report the city and its temperature.",
            model=model,
            tools=[agents.function_tool(get_weather)],
            output_type=Report,
            model_settings=agents.ModelSettings(tool_choice="required", temperature=0),  # auto after the call
        )
        done = await agents.Runner.run(agent, "What is the temperature in Paris?", max_turns=4)
        streamed = agents.Runner.run_streamed(agent, "What is the temperature in Lima?", max_turns=4)
        events = [e async for e in streamed.stream_events()]
        return done, streamed, events

    done, streamed, events = anyio.run(main)
    assert isinstance(done.final_output, Report) and isinstance(streamed.final_output, Report)
    assert "Paris" in CALLS and "Lima" in CALLS  # each run's forced first turn called the tool
    assert any(e.type == "raw_response_event" for e in events)  # the model's stream, chunk by chunk
    _free(llm)


def test_smolagents_tool_calling_agent(llm):
    """smolagents' ToolCallingAgent (it forces a tool call each step; its final answer is a tool
    too), plain and streamed, through the sync client."""
    smolagents = pytest.importorskip("smolagents")
    from tokenrouter.openai import client

    CALLS.clear()
    model = smolagents.OpenAIServerModel(model_id="large", client=client(llm), temperature=0)
    tool = smolagents.tool(get_weather)
    agent = smolagents.ToolCallingAgent(tools=[tool], model=model, max_steps=4, verbosity_level=0)
    answer = agent.run("What is the weather in Paris? Use the tool, then give the final answer.")
    assert isinstance(answer, str) and answer
    steps = list(agent.run("What is the weather in Lima?", stream=True))
    assert type(steps[-1]).__name__ == "FinalAnswerStep" and steps[-1].output
    assert CALLS  # a step called the tool
    _free(llm)


def test_pydantic_ai_agent_with_an_output_type_and_a_tool(llm):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from tokenrouter.openai import async_client

    CALLS.clear()

    async def main():
        model = OpenAIChatModel("large", provider=OpenAIProvider(openai_client=async_client(llm.engine)))
        agent = Agent(
            model, output_type=Report, instructions="Use get_weather, then report.", model_settings={"temperature": 0}
        )
        agent.tool_plain(get_weather)
        return await agent.run("What is the temperature in Paris?")

    result = anyio.run(main)
    assert isinstance(result.output, Report)
    parts = [p for m in result.all_messages() for p in getattr(m, "parts", [])]
    assert any(isinstance(p, ToolCallPart) for p in parts)  # a tool turn (the output comes as a tool call too)
    _free(llm)


def test_litellm_completion_and_stream(llm):
    pytest.importorskip("litellm")
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list
    import litellm

    from tokenrouter.openai import client

    c = client(llm)
    kw = {"model": "openai/large", "client": c, "api_key": "unused", "base_url": str(c.base_url), "temperature": 0}
    messages = [{"role": "user", "content": "Count to 3."}]
    reply = litellm.completion(messages=messages, max_tokens=16, **kw)
    chunks = list(litellm.completion(messages=messages, max_tokens=16, stream=True, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert reply.choices[0].message.content == text and reply.usage.completion_tokens > 0
    _free(llm)
