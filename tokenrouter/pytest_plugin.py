"""A pytest plugin for testing applications that embed tokenrouter: an engine on a tiny random
model pair, started once per test session, usable from any test under any event loop.

Enable it in your conftest.py with `pytest_plugins = ["tokenrouter.pytest_plugin"]`, then:

    @pytest.mark.asyncio                 # pytest-asyncio; or @pytest.mark.anyio (asyncio and trio)
    async def test_my_agent(tokenrouter_engine):
        out = await tokenrouter_engine.generate("hi", SamplingParams(max_tokens=8))

    def test_my_script(tokenrouter_llm):  # the blocking facade, same engine
        [out] = tokenrouter_llm.generate("hi")

Why one engine serves every loop: it runs in an event loop of its own (`LLM`'s thread), and each
request binds to the loop of the task that awaits it. The models are random, so the text is
noise, but the engine, the routing (`RStitch` between "small" and "large", both of which write
tokens) and the API are the real ones. Override `tokenrouter_llm` in your conftest.py to serve
other models or another policy; `tokenrouter_models` gives the pair's directories.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .api import Engine
from .config import ModelSpec
from .llm import LLM
from .policies import RStitch
from .testing import build_tiny_pair

# With logit_scale=3 the pair's normalized entropies straddle 0.2: requests move both ways.
TINY_PAIR_TAU = 0.2


@pytest.fixture(scope="session")
def tokenrouter_models(tmp_path_factory) -> dict[str, Path]:
    """A random Qwen2 pair sharing one tokenizer, written once per session: {"small": dir, "large": dir}."""
    return build_tiny_pair(tmp_path_factory.mktemp("tokenrouter-models"))


@pytest.fixture(scope="session")
def tokenrouter_llm(tokenrouter_models) -> Iterator[LLM]:
    """The session's engine behind blocking calls; closed when the session ends. In float64, so
    a greedy output does not depend on what was cached or batched with it (tests compare them)."""
    specs = {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=4096) for n, p in tokenrouter_models.items()}
    with LLM(models=specs, policy=RStitch(tau=TINY_PAIR_TAU), num_threads=1) as llm:
        yield llm


@pytest.fixture(scope="session")
def tokenrouter_engine(tokenrouter_llm) -> Engine:
    """The session's `Engine`: await its methods from a test under any event loop."""
    return tokenrouter_llm.engine
