"""langchain-tests' standard integration suite for `ChatTokenRouter` on the real demo pair
(Qwen2.5-Coder 0.5B and 1.5B under `RStitch(0.03)`, `LLM()` with no arguments), greedy.

Runs when the pair is in the store (`tokenrouter pull demo`), skipped otherwise. Skipped by the
suite itself, as the engine reads text only: image, PDF and audio inputs, Anthropic-style
inputs, and the VCR timing test (no HTTP to record).
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests

from tokenrouter import LLM, store
from tokenrouter.langchain import ChatTokenRouter

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.slow,
    pytest.mark.anyio,  # runs the suite's async tests (on asyncio, which LangChain needs); the sync ones as they are
    pytest.mark.skipif(
        not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
        reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
    ),
]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"  # LangChain's async code (its executors, its stream timeouts) is asyncio's


@pytest.fixture(scope="module")
def demo_llm():
    with LLM(num_threads=2) as llm:
        yield llm


class TestChatTokenRouterIntegration(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def served_by(self, demo_llm):
        """The module's engine, for `chat_model_params` (a property, which takes no fixture)."""
        self.llm = demo_llm

    @property
    def chat_model_class(self) -> type[ChatTokenRouter]:
        return ChatTokenRouter

    @property
    def chat_model_params(self) -> dict:
        return {"engine": self.llm, "max_tokens": 128, "temperature": 0}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "large"  # the entry model is "small"; the request is routed all the same

    @property
    def supported_usage_metadata_details(self) -> dict:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """The same prompt twice: the second finds it in the entry model's prefix cache."""
        model = ChatTokenRouter(**{**self.chat_model_params, "max_tokens": 8})
        prompt = "Name three sorting algorithms. " * 8
        model.invoke(prompt)
        if not stream:
            reply = model.invoke(prompt)
        else:
            reply = None
            for chunk in model.stream(prompt):
                reply = chunk if reply is None else reply + chunk
        assert reply.usage_metadata["input_token_details"]["cache_read"] > 0
        return reply
