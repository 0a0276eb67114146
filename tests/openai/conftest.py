"""One engine per test module: the tiny pair under `Knobs`, in an `LLM` (its own loop and thread),
which the sync client uses as it is and the async client through `llm.engine` (the engine takes
calls from any event loop)."""

from __future__ import annotations

import time

import anyio
import pytest

from tests.helpers import EveryK
from tokenrouter import LLM, ModelSpec
from tokenrouter.openai import async_client
from tokenrouter.testing import build_tiny_pair

POOL = 1024  # tokens each model's KV pool holds

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"]},
    },
}
HI = [{"role": "user", "content": "hi"}]
LONG = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}  # a request that runs a while


class Knobs(EveryK):
    """EveryK(3) (both models write, hand-offs every third token), with two knobs the fault tests
    turn: `fail` makes `route` raise (the step's requests fail), `delay_s` slows every step."""

    def __init__(self):
        super().__init__(3)
        self.fail = False
        self.delay_s = 0.0

    def route(self, result):
        if self.fail:
            raise RuntimeError("injected: the policy broke")
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().route(result)


@pytest.fixture(scope="session")
def long_pair(tmp_path_factory, tokenizer):
    """The tiny pair with a context of 2048: the tiny tokenizer spends 400 tokens on the template's
    tool preamble alone. Their KV pools hold 1024 tokens, less than the context."""
    return build_tiny_pair(tmp_path_factory.mktemp("long-pair"), tokenizer=tokenizer, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def llm(long_pair):
    specs = {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=POOL, block_size=8) for n, p in long_pair.items()}
    with LLM(models=specs, policy=Knobs(), num_threads=1) as llm:
        yield llm


def run_async(llm, test, *args):
    """`await test(client, *args)` with an async client of the module's engine, in a loop of its own."""

    async def main():
        async with async_client(llm.engine) as client:
            return await test(client, *args)

    return anyio.run(main)


def aborts(llm) -> int:
    return llm.metrics().requests.get("abort", 0)
