"""Streaming: incremental detokenization, stream == final text, leaving early and cancelling free KV."""

import anyio
import pytest

from tests.helpers import wait_all_free
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.api.detokenizer import IncrementalDetokenizer


def test_incremental_detokenizer_never_splits_characters(tokenizer):
    text = "Ünïcödé 🙂🚀 你好世界, def add(a, b): return a + b 🙂"
    ids = tokenizer.encode(text)
    prompt = tokenizer.encode("Say:")
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
    deltas = [detok.add([t]) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert sum(1 for d in deltas if d) > 10  # it really streamed, not all at the end


def _spec(path):
    return ModelSpec(path=path, dtype="float64", kv_cache_tokens=2048, block_size=8)


def test_stream_concatenation_equals_final_text(tiny_model, tokenizer):
    prompt = [{"role": "user", "content": "Write a haiku about the sea 🙂"}]

    async def main():
        async with Engine(models={"m": _spec(tiny_model)}) as engine:
            params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop=["zz"])
            final = await engine.generate(prompt, params)
            deltas = [d async for d in engine.stream(prompt, params)]
            assert deltas[-1].finish_reason == final.finish_reason
            assert all(d.finish_reason is None for d in deltas[:-1])
            assert "".join(d.text for d in deltas) == final.text
            assert [t for d in deltas for t in d.token_ids] == final.token_ids
            assert {d.model for d in deltas if d.token_ids} == {"m"}
            assert final.time_to_first_token is not None and 0 < final.time_to_first_token <= final.latency
            # Chat messages are rendered with the model's chat template.
            rendered = tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert final.prompt_token_ids == list(rendered)

    anyio.run(main)


def test_leaving_a_stream_early_aborts_and_frees(tiny_model):
    async def main():
        async with Engine(models={"m": _spec(tiny_model)}) as engine:
            params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
            n = 0
            async for _ in engine.stream([5, 6, 7], params):
                n += 1
                if n == 3:
                    break
            await wait_all_free(engine)
            # Others keep being served.
            out = await engine.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
            assert out.finish_reason == "length"

    anyio.run(main)


@pytest.mark.parametrize("where", ["waiting", "decoding"])
def test_task_cancellation_frees_kv(tiny_model, where):
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=2048, block_size=8, max_num_seqs=1)

    async def main():
        async with Engine(models={"m": spec}) as engine:
            params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
            if where == "waiting":
                async with anyio.create_task_group() as tg:
                    tg.start_soon(engine.generate, [9] * 20, params)  # holds the only batch slot
                    await anyio.sleep(0.05)
                    with anyio.move_on_after(0.05) as scope:
                        await engine.generate([8] * 30, params)  # waits behind it, then is cancelled
                    assert scope.cancelled_caught
                    assert engine.stats()["m"].waiting <= 1
                    tg.cancel_scope.cancel()
            else:
                with anyio.move_on_after(0.1) as scope:
                    await engine.generate([8] * 30, params)
                assert scope.cancelled_caught
            await wait_all_free(engine)
            out = await engine.generate([7, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            assert len(out.token_ids) == 4

    anyio.run(main)


def test_abort_by_request_id(tiny_model):
    async def main():
        async with Engine(models={"m": _spec(tiny_model)}) as engine:
            result = {}

            async def run():
                result["out"] = await engine.generate(
                    [1, 2, 3], SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True), request_id="x"
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.sleep(0.05)
                await engine.abort("x")
            assert result["out"].finish_reason == "abort"
            assert 0 < len(result["out"].token_ids) < 1000
            await wait_all_free(engine)

    anyio.run(main)


def test_close_with_requests_in_flight_ends_them(tiny_model):
    async def main():
        engine = Engine(models={"m": _spec(tiny_model)})
        await engine.start()
        result = {}

        async def run(i):
            result[i] = await engine.generate([1, 2, 3 + i], SamplingParams(max_tokens=2000, ignore_eos=True))

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(run, i)
            await anyio.sleep(0.05)
            await engine.close()
        assert all(r.finish_reason == "abort" for r in result.values())
        # The same engine object starts again.
        await engine.start()
        out = await engine.generate([1, 2], SamplingParams(max_tokens=3))
        assert len(out.token_ids) <= 3
        await engine.close()

    anyio.run(main)


def test_trio_backend(tiny_model):
    async def main():
        async with Engine(models={"m": _spec(tiny_model)}) as engine:
            out = await engine.generate([4, 5, 6], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
            deltas = [
                d async for d in engine.stream([4, 5, 6], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
            ]
            assert [t for d in deltas for t in d.token_ids] == out.token_ids

    anyio.run(main, backend="trio")
