"""A smolagents ToolCallingAgent on token-level routing: the demo pair under RStitch, a tool, its
steps streamed, through an `openai` client the engine answers in this process (no server).

    pip install 'tokenrouter[agents]'
    python examples/smolagents_agent.py ["What is the weather in Lima?"]

smolagents is synchronous, so the engine runs behind an `LLM` (its own event loop and thread) and
the agent gets `tokenrouter.openai.client(llm)`. smolagents forces a tool call at every step (its
final answer is a tool too): the engine constrains each call to the tools' schemas.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from tokenrouter import LLM, RStitch
from tokenrouter.openai import client


@tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: the city's name
    """
    return f"Sunny, 21 C, light wind in {city}."


def main(question: str) -> None:
    with LLM(policy=RStitch(tau=0.03), num_threads=2) as llm:
        model = OpenAIServerModel(model_id="large", client=client(llm))
        agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=4, verbosity_level=0)
        for step in agent.run(question, stream=True):
            print(f"[{type(step).__name__}] {str(step)[:160]}")
        print(llm.metrics().tokens_generated)  # tokens per model over the whole run


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "What is the weather in Lima?")
