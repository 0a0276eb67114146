"""Shared test helpers: Hugging Face references and engine checks."""

from __future__ import annotations

import time
from functools import lru_cache

import anyio
import torch
from transformers import AutoModelForCausalLM


@lru_cache(maxsize=8)
def hf_model(path, dtype=torch.float64):
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()


def hf_greedy(path, prompt_ids: list[int], max_new_tokens: int, dtype=torch.float64, eos=None) -> list[int]:
    """Hugging Face generate, batch 1, greedy; eos=None means never stop early."""
    model = hf_model(path, dtype)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0 if eos is not None else max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


async def wait_all_free(engine, timeout: float = 10.0) -> None:
    """Wait until no worker holds any request or KV block (workers free KV asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine.stats()
        if all(s.kv_blocks_free == s.kv_blocks_total and s.running == 0 and s.waiting == 0 for s in stats.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"KV not freed: {stats}")
        await anyio.sleep(0.01)
