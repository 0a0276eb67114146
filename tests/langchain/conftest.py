"""One engine per test module: the tiny pair under `EveryK(3)` (both models write, the request
moves every third token), in an `LLM`, which a sync model uses as it is and an async one through
`llm.engine`. Its context is 2048: the tiny tokenizer spends 400 tokens on the tool preamble alone.

Nothing here may reach a network: every test runs with sockets blocked but the unix ones, which
an asyncio loop makes to wake itself."""

from __future__ import annotations

import pytest
from pytest_socket import disable_socket, enable_socket

from tests.helpers import EveryK
from tokenrouter import LLM, ModelSpec
from tokenrouter.testing import build_tiny_pair


@pytest.fixture(autouse=True)
def no_network():
    disable_socket(allow_unix_socket=True)
    yield
    enable_socket()


@pytest.fixture(scope="session")
def tool_pair(tmp_path_factory, tokenizer):
    return build_tiny_pair(tmp_path_factory.mktemp("langchain-pair"), tokenizer=tokenizer, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def llm(tool_pair):
    specs = {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=2048, block_size=8) for n, p in tool_pair.items()}
    with LLM(models=specs, policy=EveryK(3), num_threads=1) as llm:
        yield llm
