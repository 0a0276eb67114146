"""Tool calls: tools rendered by the chat template, calls parsed from the Hermes format (on real
Qwen2.5 answers recorded from the demo pair, and on hand-written edge cases), calls constrained
to the tools' schemas when the caller asks (routed, sampled, across hand-offs), bad tools and
choices named, and the demo pair end to end; the agent-loop example runs on the tiny pair."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel, ConfigDict

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import EveryK, wait_all_free
from tokenrouter import Engine, InvalidRequestError, ModelSpec, RStitch, SamplingParams, store
from tokenrouter.api import chat_ids
from tokenrouter.api.tool_calls import HermesToolCallParser, check_tool_choice, normalize_tools

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((Path(__file__).parents[1] / "data" / "qwen25_tool_calls.json").read_text())

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["unit"],
            },
        },
    },
]


class AddArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int
    b: int


class WeatherArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit: str
    days: int | None = None


ARGS = {"add": AddArgs, "weather": WeatherArgs}


@pytest.fixture(scope="module")
def tool_pair(tmp_path_factory, tokenizer):
    """The tiny pair with a context long enough for the tools' descriptions (the small test
    tokenizer spends many tokens on JSON) and a few turns of an agent loop."""
    import torch

    from tokenrouter.testing import build_tiny_model

    root = tmp_path_factory.mktemp("tool-pair")
    common = {"dtype": torch.float64, "tokenizer": tokenizer, "logit_scale": 3.0, "max_position_embeddings": 4096}
    return {
        "small": build_tiny_model(root / "small", "qwen2", seed=1, **common),
        "large": build_tiny_model(root / "large", "qwen2", seed=2, num_hidden_layers=3, hidden_size=96, **common),
    }


# ---- the parser -----------------------------------------------------------------------------
# What each recorded answer calls (read by hand from tests/data/qwen25_tool_calls.json): both
# models answer in a ```json fence or with bare JSON, not in <tool_call> blocks, and both invent
# a "say_hello" tool when told to use none (not offered: left as text).
PARIS = [("get_weather", {"city": "Paris", "unit": "celsius"})]
EXPECTED = {
    "What's the weather like in Paris, in celsius?": PARIS,
    "What is 1234 + 5678? Use the tool.": [("add", {"a": 1234, "b": 5678})],
    "What is the weather in Tokyo and in Lima?": [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
    "List the files in /tmp/project.": [("list_files", {"path": "/tmp/project"})],
    "Say hello in French. Do not use any tool.": [],
}


@pytest.mark.parametrize("rec", RECORDED["records"], ids=lambda r: f"{r['model']}:{r['prompt'][:24]}")
def test_the_parser_reads_recorded_qwen_answers(rec):
    content, calls = HermesToolCallParser([t["function"]["name"] for t in RECORDED["tools"]]).parse(rec["text"])
    assert [(c.name, c.arguments) for c in calls] == EXPECTED[rec["prompt"]], rec["text"]
    assert content == ("" if calls else rec["text"].strip())


def test_the_parser_on_edge_cases():
    p = HermesToolCallParser(["add"])
    text = (
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
    )
    content, calls = p.parse(text)
    assert content == "Let me add." and [(c.name, c.arguments) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 3, "b": 4}),
    ]
    assert len({c.id for c in calls}) == 2
    broken = 'x <tool_call>{"name": "add", "arguments": {"a": </tool_call> y'
    assert p.parse(broken) == (broken.strip(), [])  # an unreadable block stays in the text
    assert p.parse("<tool_call>[1, 2]</tool_call>")[1] == []
    assert p.parse('<tool_call>{"name": "add"}</tool_call>')[1][0].arguments == {}
    assert p.parse("no calls here") == ("no calls here", [])
    assert p.parse('<tool_call>{"name": "add", "arguments": {}}')[1] == []  # cut off before its end
    fenced = '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```'  # as Qwen2.5-Coder often answers
    content, calls = p.parse(fenced)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert p.parse('{"name": "add", "arguments": {"a": 5}}')[1][0].arguments == {"a": 5}
    other = '```json\n{"name": "mul", "arguments": {}}\n```'  # not an offered tool: text
    assert p.parse(other) == (other, [])


# ---- rendering and validation ---------------------------------------------------------------
def test_tools_are_rendered_by_the_chat_template(tokenizer):
    messages = [{"role": "user", "content": "add 2 and 3"}]
    tools = normalize_tools(TOOLS)
    ids = chat_ids(tokenizer, messages, tools)
    assert ids == tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text = tokenizer.decode(ids)
    assert '"name": "add"' in text and "<tool_call>" in text
    # a bare function dict means the same tool
    assert normalize_tools([TOOLS[0]["function"]]) == [tools[0]]


@pytest.mark.parametrize(
    "tools, field, fragment",
    [
        ("add", "tools", "must be a list"),
        ([], "tools", "is empty"),
        ([3], "tools[0]", "must be a dict"),
        ([{"type": "code", "function": {"name": "x"}}], "tools[0].type", "must be 'function'"),
        ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name", "1-64 letters"),
        ([{"name": "a"}, {"name": "a"}], "tools[1].name", "given twice"),
        ([{"name": "a", "parameters": "{}"}], "tools[0].parameters", "JSON Schema dict"),
        ([{"name": "a", "description": 5}], "tools[0].description", "must be a string"),
        ([{"name": "a", "args": {}}], "tools[0]", "unknown key"),
    ],
)
def test_bad_tools_are_named(tools, field, fragment):
    with pytest.raises(InvalidRequestError) as e:
        normalize_tools(tools)
    assert e.value.field == field and fragment in str(e.value)


@pytest.mark.parametrize(
    "choice, tools, fragment",
    [
        ("sometimes", TOOLS, "must be one of"),
        ("required", None, "needs tools"),
        ({"type": "function", "function": {"name": "nope"}}, TOOLS, "not among the tools"),
        ({"function": {"name": "add"}}, TOOLS, "named choice"),
        (3, TOOLS, "string or a dict"),
    ],
)
def test_bad_tool_choices_are_named(choice, tools, fragment):
    with pytest.raises(InvalidRequestError) as e:
        check_tool_choice(choice, normalize_tools(tools) if tools else None)
    assert e.value.field == "tool_choice" and fragment in str(e.value)


def test_tools_need_chat_messages_and_a_template_that_renders_them(tool_pair):
    async def main():
        async with Engine(models={"m": tool_pair["small"]}) as e:
            with pytest.raises(InvalidRequestError) as info:
                await e.generate("plain text", tools=TOOLS)
            assert info.value.field == "tools"
            with pytest.raises(InvalidRequestError) as info:
                await e.chat([{"role": "user", "content": "x"}], tools=TOOLS, parallel_tool_calls="no")
            assert info.value.field == "parallel_tool_calls", str(info.value)
            assert e.stats()["m"].steps == 0

    anyio.run(main)


# ---- constrained calls on the routed tiny pair ----------------------------------------------
def _serve(pair, policy, messages, params, **kw):
    async def main():
        async with Engine(models={m: ModelSpec(path=p) for m, p in pair.items()}, policy=policy) as e:
            outs = [None] * len(params)

            async def one(i):
                outs[i] = await e.chat(messages, params[i], tools=TOOLS, **kw)

            async with anyio.create_task_group() as tg:
                for i in range(len(params)):
                    tg.start_soon(one, i)
            await wait_all_free(e)
            return outs

    return anyio.run(main)


@pytest.mark.parametrize("policy", [EveryK(3), RStitch(tau=TINY_PAIR_TAU)], ids=["every3", "rstitch"])
def test_required_tool_calls_always_follow_the_schemas(tool_pair, policy):
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=160) for i in range(50)]
    outs = _serve(tool_pair, policy, [{"role": "user", "content": "Use a tool."}], params, tool_choice="required")
    for out in outs:  # a random model may go on calling until max_tokens: every complete call counts
        assert out.finish_reason in ("stop", "length") and out.tool_calls, out.text
        assert out.text.startswith("<tool_call>")  # calls only, no text before them
        for call in out.tool_calls:
            ARGS[call.name].model_validate(call.arguments)
        msg = out.message()
        assert msg["role"] == "assistant" and len(msg["tool_calls"]) == len(out.tool_calls)
    assert sum(o.num_handoffs for o in outs) > 0
    assert {c.name for o in outs for c in o.tool_calls} == {"add", "weather"}  # sampled: both tools occur


def test_a_named_choice_calls_that_tool(tool_pair):
    choice = {"type": "function", "function": {"name": "weather"}}
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=120) for i in range(20)]
    outs = _serve(tool_pair, EveryK(2), [{"role": "user", "content": "Weather?"}], params, tool_choice=choice)
    for out in outs:
        assert [c.name for c in out.tool_calls] == ["weather"], out.text
        WeatherArgs.model_validate(out.tool_calls[0].arguments)


def test_auto_and_none_are_not_constrained(tool_pair):
    params = [SamplingParams(temperature=1.0, seed=5, max_tokens=16)]
    free = _serve(tool_pair, RStitch(tau=TINY_PAIR_TAU), [{"role": "user", "content": "Hi"}], params)[0]
    auto = _serve(
        tool_pair, RStitch(tau=TINY_PAIR_TAU), [{"role": "user", "content": "Hi"}], params, tool_choice="auto"
    )[0]
    none = _serve(
        tool_pair, RStitch(tau=TINY_PAIR_TAU), [{"role": "user", "content": "Hi"}], params, tool_choice="none"
    )[0]
    assert auto.token_ids == free.token_ids == none.token_ids  # the tools are rendered either way, nothing masked
    assert none.content is None and none.tool_calls == []
    assert auto.content is not None


def test_tools_with_a_response_format_give_calls_or_the_schema(tool_pair, tokenizer):
    """openai-agents sends its output type as response_format with the tools on every turn: under
    "auto" the grammar is one or more calls or a JSON value of the schema, nothing else; under
    "required" calls only; with parallel_tool_calls=False at most one call. The grammar is
    checked on strings; sampled outputs (this random pair starts with "{" far more often than
    "<") are each one of the branches."""
    import xgrammar as xgr

    from tokenrouter.structured import GrammarCompiler, format_of

    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    tools, parser = normalize_tools(TOOLS), HermesToolCallParser(["add", "weather"])
    fmt = SamplingParams(response_format=schema).response_format
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])

    def accepts(text: str, tool_choice="auto", parallel=True) -> bool:
        tag = parser.structural_tag(tools, tool_choice, parallel, format_of(fmt) if tool_choice == "auto" else None)
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(tag))
        return matcher.accept_string(text) and matcher.is_completed()

    assert accepts('{"answer":42}') and accepts(call) and accepts(call + "\n" + call)
    assert not accepts("hello") and not accepts('{"answer": "x"}') and not accepts('{"answer":4}' + call)
    assert not accepts('{"answer":42}', "required") and accepts(call, "required")
    assert accepts(call, "required", parallel=False) and not accepts(call + "\n" + call, "required", parallel=False)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=120, response_format=schema) for i in range(8)]
    for out in _serve(tool_pair, RStitch(tau=TINY_PAIR_TAU), [{"role": "user", "content": "Answer."}], params):
        if out.tool_calls:
            assert out.text.startswith("<tool_call>") and out.content == "", out.text
        elif out.finish_reason == "stop":
            assert isinstance(json.loads(out.text)["answer"], int), out.text
    messages = [{"role": "user", "content": "Use one tool."}]
    one = _serve(tool_pair, EveryK(2), messages, params[:6], tool_choice="required", parallel_tool_calls=False)
    assert all(len(o.tool_calls) == 1 and o.finish_reason == "stop" for o in one), [o.text for o in one]


def test_streamed_tool_calls_come_whole_and_never_as_text(tool_pair):
    """A stream's tool calls arrive in `delta.tool_calls`, each whole, in the delta where its block
    closed; the deltas' text is the answer without them, and the final output holds the same
    calls (the same ids)."""
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=160)

    async def main():
        specs = {m: ModelSpec(path=p) for m, p in tool_pair.items()}
        async with Engine(models=specs, policy=RStitch(tau=TINY_PAIR_TAU)) as e:
            deltas = [
                d
                async for d in e.stream(
                    [{"role": "user", "content": "Use a tool."}], params, tools=TOOLS, tool_choice="required"
                )
            ]
            await wait_all_free(e)
            return deltas

    deltas = anyio.run(main)
    final = deltas[-1].output
    streamed = [c for d in deltas for c in d.tool_calls]
    assert streamed and [c.id for c in streamed] == [c.id for c in final.tool_calls]
    assert "<tool_call>" not in "".join(d.text for d in deltas)
    assert "".join(d.text for d in deltas).strip() == final.content


def test_the_tool_call_stream_holds_back_what_may_open_a_call():
    from tokenrouter.api.tool_calls import ToolCallStream

    stream = ToolCallStream(HermesToolCallParser(["add"]))
    pieces = [
        "Let me add. <to",
        "ol_c",
        'all>\n{"name": "add", "arguments": {"a": 1, "b"',
        ": 2}}\n</tool_call>",
        " Done <",
    ]
    got = [stream.feed(p) for p in pieces] + [stream.feed("", final=True)]
    assert [text for text, _ in got] == ["Let me add. ", "", "", "", " Done ", "<"]
    assert [c.arguments for _, calls in got for c in calls] == [{"a": 1, "b": 2}]
    bad = ToolCallStream(HermesToolCallParser(["add"]))  # a block that is no call stays text
    assert bad.feed("<tool_call>not json</tool_call>x", final=True) == ("<tool_call>not json</tool_call>x", [])


def test_a_deadline_ends_the_request_and_frees_its_kv(tool_pair):
    async def main():
        async with Engine(models={"m": tool_pair["small"]}) as e:
            out = await e.generate("x", SamplingParams(max_tokens=4000, ignore_eos=True), deadline_s=0.3)
            await wait_all_free(e)
            assert out.finish_reason == "abort" and "deadline_s=0.3" in out.error
            assert 0 < len(out.token_ids) < 4000 and e.metrics().requests["abort"] == 1
            with pytest.raises(InvalidRequestError, match="deadline_s"):
                await e.generate("x", deadline_s=0)

    anyio.run(main)


def test_content_parts_and_json_string_arguments_reach_the_template_as_objects(tokenizer):
    from tokenrouter.api import chat_ids

    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    as_object = {**call, "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    parts = [{"type": "text", "text": "Add "}, {"type": "text", "text": "them."}]
    given = [{"role": "user", "content": parts}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    plain = [
        {"role": "user", "content": "Add them."},
        {"role": "assistant", "content": None, "tool_calls": [as_object]},
    ]
    assert chat_ids(tokenizer, given, TOOLS) == chat_ids(tokenizer, plain, TOOLS)
    text = tokenizer.decode(chat_ids(tokenizer, given, TOOLS))
    assert '"arguments": {"a": 1, "b": 2}' in text and '\\"a\\"' not in text  # once encoded, not twice


# ---- the agent loop -------------------------------------------------------------------------
def test_the_agent_loop_example_runs_on_the_tiny_pair(tool_pair):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import agent_loop
    finally:
        sys.path.pop(0)
    scratch = agent_loop.make_scratch()
    lines: list[str] = []

    def show(*a, end="\n", flush=False):
        lines.append(" ".join(map(str, a)) + end)

    async def main():
        specs = {m: ModelSpec(path=p) for m, p in tool_pair.items()}
        async with Engine(models=specs, policy=RStitch(tau=TINY_PAIR_TAU)) as e:
            params = SamplingParams(temperature=1.0, seed=3, max_tokens=96)
            choice = {"type": "function", "function": {"name": "list_files"}}  # no arguments: the random model ends it
            conv = await agent_loop.run_agent(
                e, "List the files.", scratch, tool_choice=choice, max_turns=3, params=params, show=show
            )
            await wait_all_free(e)
            return conv

    conv = anyio.run(main)
    calls = conv[2].get("tool_calls")
    assert conv[2]["role"] == "assistant" and calls, conv[2]  # turn 1 was constrained to a call
    assert conv[3]["role"] == "tool" and json.loads(conv[3]["content"]) == {"files": ["notes.md", "prices.txt"]}
    assert len(conv) >= 5 and conv[4]["role"] == "assistant"  # and the model answered again
    text = "".join(lines)
    assert "--- turn 2" in text
    cached = [int(line.split(" of ")[0].rsplit(", ", 1)[1]) for line in text.splitlines() if "prefix cache" in line]
    assert len(cached) >= 2 and cached[1] > 0  # turn 2 reused turn 1's prompt blocks from the prefix cache


def test_calculator_evaluates_arithmetic_only():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import agent_loop
    finally:
        sys.path.pop(0)
    assert agent_loop.calculate("2 * (3 + 4) ** 2 / 7") == 14
    with pytest.raises(ValueError):
        agent_loop.calculate("__import__('os').system('true')")


# ---- the demo pair end to end ---------------------------------------------------------------
@pytest.mark.real_model
@pytest.mark.slow  # loads the 1.5B and 0.5B models (~12 GB, a minute here): run with -m slow
@pytest.mark.skipif(
    not all(store.is_pulled(m) for m in store.GROUPS["demo"]),
    reason=f"the demo pair is not in the store ({store.home_dir()}); run `{store.pull_command('demo')}`",
)
def test_tool_calls_on_the_demo_pair():
    tools = RECORDED["tools"]

    async def main():
        async with Engine(num_threads=2) as e:  # the demo pair under RStitch(0.03)
            ask = [{"role": "user", "content": "What's the weather like in Paris, in celsius?"}]
            free = await e.chat(ask, SamplingParams(temperature=0, max_tokens=80), tools=tools)
            forced = await e.chat(
                [{"role": "user", "content": "I need 17 plus 25."}],
                SamplingParams(temperature=0, max_tokens=80),
                tools=tools,
                tool_choice={"type": "function", "function": {"name": "add"}},
            )
            await wait_all_free(e)
            return free, forced

    free, forced = anyio.run(main)
    assert [c.name for c in free.tool_calls] == ["get_weather"], free.text
    assert free.tool_calls[0].arguments.get("city") == "Paris"
    assert [c.name for c in forced.tool_calls] == ["add"], forced.text
    assert forced.tool_calls[0].arguments == {"a": 17, "b": 25}
