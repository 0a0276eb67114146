"""An openai-agents agent on token-level routing: the demo pair under RStitch, a function tool and
a typed output, through an `openai` client the engine answers in this process (no server).

    pip install 'tokenrouter[agents]'
    python examples/openai_agents_agent.py ["What is the temperature in Paris?"]

openai-agents sends the tools and the output type (as `response_format`) on every call; the
engine compiles them as one grammar, "one or more tool calls, or a value of the schema", so each
turn is either a well-formed call or the final, typed answer. The first turn is made to call the
tool (openai-agents sets the choice back to auto after a call). At the end, the engine's metrics
say which model wrote how many tokens over the run, and how often a request changed hands.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from pydantic import BaseModel

from tokenrouter import Engine, RStitch
from tokenrouter.openai import async_client


class Report(BaseModel):
    city: str
    temperature_c: int
    summary: str


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"Sunny, 21 C, light wind in {city}."


async def main(question: str) -> None:
    set_tracing_disabled(True)  # openai-agents sends traces to OpenAI's servers otherwise
    async with Engine(policy=RStitch(tau=0.03), num_threads=2) as engine:
        model = OpenAIChatCompletionsModel(model="large", openai_client=async_client(engine))
        agent = Agent(
            name="weather",
            instructions="Find the weather with the tool, then report the city, its temperature and a summary.",
            model=model,
            tools=[get_weather],
            output_type=Report,
            model_settings=ModelSettings(tool_choice="required"),
        )
        result = Runner.run_streamed(agent, question, max_turns=4)
        async for event in result.stream_events():
            if event.type == "run_item_stream_event":
                print(f"[{event.item.type}] {str(getattr(event.item, 'raw_item', ''))[:120]}")
        print("\nfinal:", result.final_output)
        metrics = engine.metrics()
        print("tokens per model:", metrics.tokens_generated, "hand-offs:", metrics.handoffs)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "What is the temperature in Paris?")
