"""The `openai` SDK on the demo pair through `tokenrouter.openai`: every call an agent makes, with
the real Qwen2.5 chat template (tests/openai covers every field on the tiny pair). openai 3.x is
the installed one; 1.x (built on httpx rather than httpx2) runs the same script in a subprocess,
from a copy pip puts in a temporary directory (`slow`: it downloads it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import openai
import pytest

from tests.helpers import wait_all_free
from tokenrouter import LLM, store

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
        reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
    ),
]

# One script for both SDK versions: it prints "ok" when every call did what the API promises.
# Every call whose text is checked is greedy (temperature 0): what it writes is the same each run.
SCRIPT = textwrap.dedent(
    """
    import json
    import openai
    from pydantic import BaseModel
    from tests.helpers import wait_all_free
    from tokenrouter import LLM
    from tokenrouter.openai import client

    class City(BaseModel):
        name: str
        country: str

    ask = [{"role": "user", "content": "Name the capital of France."}]
    with LLM(num_threads=2) as llm:
        c = client(llm)
        reply = c.chat.completions.create(model="large", messages=ask, max_tokens=24, temperature=0)
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        record = reply.model_extra["tokenrouter"]
        assert sum(record["tokens_per_model"].values()) == reply.usage.completion_tokens
        chunks = list(c.chat.completions.create(model="large", messages=ask, max_tokens=24, temperature=0, stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == reply.choices[0].message.content and chunks[-1].choices[0].finish_reason
        greedy = {"max_tokens": 64, "temperature": 0}
        parsed = c.chat.completions.parse(model="large", messages=ask, response_format=City, **greedy)
        assert isinstance(parsed.choices[0].message.parsed, City)
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        called = c.chat.completions.create(
            model="large", messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[weather], tool_choice="required", **greedy)
        call = called.choices[0].message.tool_calls[0]
        assert called.choices[0].finish_reason == "tool_calls" and "city" in json.loads(call.function.arguments)
        two = c.chat.completions.create(model="large", messages=ask, n=2, max_tokens=8, seed=1)
        assert [ch.index for ch in two.choices] == [0, 1]
        lp = c.chat.completions.create(model="large", messages=ask, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
        entries = lp.choices[0].logprobs.content
        assert len(entries) == 4 and all(len(e.top_logprobs) == 2 for e in entries)
        assert all(e.model_extra["model"] in ("small", "large") for e in entries)
        try:
            c.chat.completions.create(model="large", messages=ask, temperature=-1)
            raise AssertionError("a temperature of -1 was taken")
        except openai.BadRequestError as e:
            assert e.param == "temperature", e.param
        stream = c.chat.completions.create(model="large", messages=ask, max_tokens=200, stream=True)
        next(iter(stream))
        stream.close()  # leaving early aborts the request and frees its KV
        llm.run(wait_all_free, llm.engine)
        assert llm.metrics().requests["abort"] == 1
    print("ok")
    """
)


def test_the_openai_3_sdk_makes_every_call_an_agent_makes():
    assert int(openai.__version__.split(".")[0]) >= 3
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.slow
def test_the_openai_1_sdk_makes_the_same_calls(tmp_path):
    """openai 1.x, the line most frameworks pinned for long, from its own copy (httpx, not httpx2)."""
    target = tmp_path / "openai1"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    got = subprocess.run([*pip, "openai==1.109.1", "jiter", "distro"], capture_output=True, text=True, timeout=600)
    if got.returncode != 0:
        pytest.skip(f"could not fetch openai 1.x: {got.stderr[-300:]}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT), *sys.path]))
    check = "import openai; assert openai.__version__.startswith('1.'); import httpx"
    assert subprocess.run([sys.executable, "-c", check], env=env).returncode == 0
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_an_early_closed_stream_frees_its_kv_at_once():
    from tokenrouter.openai import client

    with LLM(num_threads=2) as llm:
        c = client(llm)
        before = llm.metrics().requests["abort"]
        stream = c.chat.completions.create(
            model="large", messages=[{"role": "user", "content": "Write a long story."}], max_tokens=300, stream=True
        )
        next(iter(stream))
        stream.close()
        llm.run(wait_all_free, llm.engine)
        assert llm.metrics().requests["abort"] == before + 1
