"""`chat.completions.create` through the openai SDK's async client: every request field the
module reads, logprobs naming their writers, n samples, structured output and tool calls."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from tests.helpers import wait_all_free
from tests.openai.conftest import HI, POOL, TIME, WEATHER, run_async


def test_a_completion_carries_usage_and_the_routing_record(llm):
    async def test(client):
        out = await client.chat.completions.create(model="large", messages=HI, max_tokens=9, temperature=0)
        assert out.object == "chat.completion" and out.id.startswith("chatcmpl-") and out.model == "large"
        choice = out.choices[0]
        assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
        assert isinstance(choice.message.content, str) and choice.logprobs is None
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
        assert out.usage.prompt_tokens_details.cached_tokens >= 0
        record = out.tokenrouter  # the extension field, kept by the SDK
        assert sum(record["tokens_per_model"].values()) == out.usage.completion_tokens
        if out.usage.completion_tokens > 3:  # EveryK(3): the request moved
            assert set(record["tokens_per_model"]) == {"small", "large"} and record["num_handoffs"] >= 1
        assert set(record["tokens_processed"]) <= {"small", "large"}
        again = await client.chat.completions.create(model="large", messages=HI, max_tokens=9, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens > 0  # the prefix cache served the prompt
        assert again.choices[0].message.content == choice.message.content
        models = await client.models.list()
        assert [m.id for m in models.data] == ["small", "large"] and models.data[0].owned_by == "tokenrouter"
        assert (await client.models.retrieve("small")).id == "small"

    run_async(llm, test)


TERSE = [{"role": "system", "content": "You are terse."}, *HI]
EOS_OFF = {"ignore_eos": True}
SPECIAL_ON = {"skip_special_tokens": False}


def test_every_sampling_field_is_read(llm):
    async def test(client):
        common = {"model": "small", "messages": HI, "max_completion_tokens": 6, "temperature": 1.3, "seed": 7}
        common["top_p"] = 0.9
        extra = {"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1, "ignore_eos": True}
        a = await client.chat.completions.create(
            **common, presence_penalty=0.5, frequency_penalty=0.3, extra_body=extra
        )
        b = await client.chat.completions.create(
            **common, presence_penalty=0.5, frequency_penalty=0.3, extra_body=extra
        )
        assert a.choices[0].message.content == b.choices[0].message.content  # the seed
        assert a.usage.completion_tokens == 6 and a.choices[0].finish_reason == "length"  # ignore_eos, the cap
        # a stop string: the answer ends before it
        greedy = {"model": "small", "messages": TERSE, "max_tokens": 12, "temperature": 0, "extra_body": EOS_OFF}
        first = (await client.chat.completions.create(**greedy)).choices[0].message.content
        assert len(first) >= 4
        cut = await client.chat.completions.create(**greedy, stop=[first[2:4]])
        assert cut.choices[0].message.content == first[: first.index(first[2:4])]
        assert cut.choices[0].finish_reason == "stop"
        ignored = {
            "store": True,
            "metadata": {"k": "v"},
            "user": "u",
            "reasoning_effort": "low",
            "service_tier": "auto",
            "prompt_cache_key": "k",
            "safety_identifier": "s",
            "verbosity": "low",
            "modalities": ["text"],
        }
        out = await client.chat.completions.create(model="small", messages=HI, max_tokens=2, **ignored)
        assert out.usage.completion_tokens <= 2

    run_async(llm, test)


def test_stop_token_ids_end_the_answer(llm):
    async def test(client):
        plain = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        first_text = plain.choices[0].message.content
        ids = llm.engine.info().tokenizer.encode(first_text, add_special_tokens=False)
        out = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=4, temperature=0, extra_body={"stop_token_ids": ids[:1]}
        )
        assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 1

    run_async(llm, test)


def test_logprobs_name_the_model_that_wrote_each_token(llm, tokenizer):
    special = {added.content for added in tokenizer.added_tokens_decoder.values() if added.special}

    def joined(content, skip_special):
        """The entries' bytes as text; the message leaves special tokens out (sampling writes them
        too, with ignore_eos), and a character split across tokens shows as U+FFFD either way."""
        kept = [entry for entry in content if not (skip_special and entry.token in special)]
        return bytes(b for entry in kept for b in entry.bytes).decode("utf-8", errors="replace").replace("\ufffd", "")

    async def test(client):
        out = await client.chat.completions.create(
            model="large", messages=HI, max_tokens=7, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True}
        )
        content = out.choices[0].logprobs.content
        assert len(content) == 7
        writers = [entry.model for entry in content]  # the extension key, kept by the SDK
        assert writers == ["small"] * 3 + ["large"] * 3 + ["small"]  # EveryK(3), entry model first
        for entry in content:
            assert isinstance(entry.token, str) and entry.logprob <= 0 and isinstance(entry.bytes, list)
            assert 1 <= len(entry.top_logprobs) <= 2
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert joined(content, skip_special=True) == out.choices[0].message.content.replace("\ufffd", "")
        for _ in range(20):  # sampled text: special tokens come up in about one request in ten
            raw = await client.chat.completions.create(
                model="large", messages=HI, max_tokens=7, logprobs=True, extra_body=EOS_OFF | SPECIAL_ON
            )
            text = raw.choices[0].message.content.replace("\ufffd", "")
            assert joined(raw.choices[0].logprobs.content, skip_special=False) == text
            sampled = await client.chat.completions.create(
                model="large", messages=HI, max_tokens=7, logprobs=True, extra_body=EOS_OFF
            )
            text = sampled.choices[0].message.content.replace("\ufffd", "")
            assert joined(sampled.choices[0].logprobs.content, skip_special=True) == text
        none = await client.chat.completions.create(model="large", messages=HI, max_tokens=2, logprobs=True)
        assert all(entry.top_logprobs == [] for entry in none.choices[0].logprobs.content)

    run_async(llm, test)


def test_n_samples_are_choices(llm):
    async def test(client):
        out = await client.chat.completions.create(
            model="small", messages=HI, n=2, max_tokens=5, seed=3, extra_body={"ignore_eos": True}
        )
        assert [c.index for c in out.choices] == [0, 1]
        assert out.usage.completion_tokens == 10
        assert sum(out.tokenrouter["tokens_per_model"].values()) == 10
        await wait_all_free(llm.engine)

    run_async(llm, test)


RESPONSES_SHAPE = {"type": "function", "name": "get_weather"}  # how the Responses API names a tool


class Verdict(BaseModel):
    ok: bool


def test_structured_output(llm):
    async def test(client):
        parsed = await client.chat.completions.parse(model="large", messages=HI, response_format=Verdict, max_tokens=32)
        assert isinstance(parsed.choices[0].message.parsed, Verdict)
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "v", "schema": schema, "strict": True}}
        out = await client.chat.completions.create(model="small", messages=HI, response_format=fmt, max_tokens=32)
        assert isinstance(json.loads(out.choices[0].message.content)["ok"], bool)
        guided = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=32, extra_body={"guided_json": json.dumps(schema)}
        )
        assert isinstance(json.loads(guided.choices[0].message.content)["ok"], bool)
        for field in ("guided_regex", "regex"):
            out = await client.chat.completions.create(
                model="small", messages=HI, max_tokens=8, extra_body={field: "(yes|no)"}
            )
            assert out.choices[0].message.content in ("yes", "no")
        for field in ("guided_grammar", "grammar"):
            out = await client.chat.completions.create(
                model="small", messages=HI, max_tokens=8, extra_body={field: 'root ::= "a" | "bb"'}
            )
            assert out.choices[0].message.content in ("a", "bb")
        any_object = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=24, response_format={"type": "json_object"}
        )
        if any_object.choices[0].finish_reason == "stop":  # else cut at max_tokens, a random model's right
            assert isinstance(json.loads(any_object.choices[0].message.content), dict)
        text = await client.chat.completions.create(
            model="small", messages=HI, max_tokens=3, response_format={"type": "text"}
        )
        assert text.choices[0].finish_reason in ("stop", "length")

    run_async(llm, test)


@pytest.mark.parametrize(
    "choice, called",
    [
        ("required", "get_weather"),
        ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [TIME]}}, "get_time"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [RESPONSES_SHAPE]}}, "get_weather"),
    ],
    ids=["required", "named", "allowed_tools", "allowed_tools-responses-shape"],
)
def test_forced_tool_calls(llm, choice, called):
    async def test(client):
        tools = [WEATHER] if choice == "required" else [WEATHER, TIME]
        out = await client.chat.completions.create(
            model="large", messages=HI, tools=tools, tool_choice=choice, parallel_tool_calls=False, max_tokens=128
        )
        message = out.choices[0].message
        assert out.choices[0].finish_reason == "tool_calls"
        assert len(message.tool_calls) == 1 and message.content is None
        call = message.tool_calls[0]
        assert call.type == "function" and call.function.name == called and call.id
        assert isinstance(json.loads(call.function.arguments), dict)
        # the next turn: the call (arguments as the JSON string the SDK gives), its result, content parts
        messages = [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "weather "}, {"type": "text", "text": "please"}]},
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        after = await client.chat.completions.create(
            model="large", messages=messages, tools=tools, tool_choice="none", max_tokens=4
        )
        assert after.choices[0].message.tool_calls is None

    run_async(llm, test)


def test_tools_offered_unforced(llm):
    async def test(client):
        bare = await client.chat.completions.create(model="large", messages=HI, max_tokens=3)
        for choice in ("auto", "none"):
            out = await client.chat.completions.create(
                model="large", messages=HI, tools=[WEATHER], tool_choice=choice, max_tokens=3
            )
            assert out.usage.prompt_tokens > bare.usage.prompt_tokens  # the template lists the tools
            assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
        default = await client.chat.completions.create(model="large", messages=HI, tools=[WEATHER], max_tokens=3)
        assert default.usage.prompt_tokens == out.usage.prompt_tokens

    run_async(llm, test)


def test_max_tokens_defaults_to_the_room_left(llm):
    """As OpenAI (and vLLM) default it: up to the context, here the smaller KV pool."""

    async def test(client):
        messages = [{"role": "user", "content": "hello " * 180}]
        out = await client.chat.completions.create(model="small", messages=messages, extra_body={"ignore_eos": True})
        assert out.usage.prompt_tokens > 800  # a short answer, then
        assert out.usage.total_tokens == POOL and out.choices[0].finish_reason == "length"

    run_async(llm, test)
