"""RStitch on the real demo pair (Qwen2.5-Coder 0.5B and 1.5B): `Engine()` with no arguments
serves it from the store, and both models write tokens of a coherent answer.

Runs when the pair is in the store (README's main-job command puts it there; or
`tokenrouter pull demo`), and is skipped otherwise: fetching and converting it takes minutes.
"""

from __future__ import annotations

import anyio
import pytest

from tests.helpers import wait_all_free
from tokenrouter import Engine, SamplingParams, store

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
        reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
    ),
]


def test_rstitch_on_the_demo_pair_uses_both_models():
    async def main():
        async with Engine(num_threads=2) as engine:
            question = [{"role": "user", "content": "Write a Python function that returns the factorial of n."}]
            out = await engine.generate(question, SamplingParams(temperature=0, max_tokens=40))
            await wait_all_free(engine)
            return out, engine.stats()

    out, stats = anyio.run(main)
    assert out.finish_reason in ("stop", "length") and out.error is None
    counts = out.tokens_per_model()
    assert counts.get("small", 0) > 0 and counts.get("large", 0) > 0, counts
    assert out.num_handoffs >= 1
    assert "def " in out.text and "factorial" in out.text  # a coherent answer, not noise
    assert stats["large"].handoffs_received >= 1
