"""langchain-tests' standard unit suite for `ChatTokenRouter`: construction, standard parameters,
`bind_tools` and `with_structured_output`, on the tiny pair's engine (no request is made).

Skipped by the suite itself: `test_init_from_env` (nothing is read from the environment: the
model is made from an engine object) and `test_serdes` (not serializable: it holds an engine)."""

from __future__ import annotations

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests

from tokenrouter.langchain import ChatTokenRouter


class TestChatTokenRouterUnit(ChatModelUnitTests):
    @pytest.fixture(autouse=True)
    def served_by(self, llm):
        """The module's engine, for `chat_model_params` (a property, which takes no fixture)."""
        self.llm = llm

    @property
    def chat_model_class(self) -> type[ChatTokenRouter]:
        return ChatTokenRouter

    @property
    def chat_model_params(self) -> dict:
        return {"engine": self.llm}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "large"  # the entry model is "small"
