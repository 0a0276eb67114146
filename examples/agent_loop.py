"""A multi-turn, tool-using agent loop on token-level routing (the demo pair under RStitch).

    python examples/agent_loop.py ["your task"] [--tool-choice auto|required] [--max-turns 4]

Three tools over a scratch directory: a calculator, a file lister and a file reader. Each turn
streams the answer as it is written; when the model calls tools, their results go back into the
conversation and the next turn starts. The chat template renders the tools; the model's
`<tool_call>` blocks come back parsed (`RequestOutput.tool_calls`). `--tool-choice required`
constrains the first turn to calls whose arguments follow the tools' JSON schemas (structured
output, across hand-offs between the two models). Every turn resends the conversation, and the
prefix cache serves what earlier turns computed: the summary shows the cached prompt tokens.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio

from tokenrouter import Engine, SamplingParams

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files in the scratch directory.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the scratch directory.",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        },
    },
]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> float:
    """Arithmetic only: the model's text is never executed as code."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    return ev(ast.parse(expression, mode="eval").body)


def run_tool(name: str, args: dict, scratch: Path) -> dict:
    """A tool's result as JSON-able data; an error is a result too (the model reads it and goes on)."""
    try:
        if name == "calculator":
            return {"result": calculate(str(args.get("expression", "")))}
        if name == "list_files":
            return {"files": sorted(p.name for p in scratch.iterdir())}
        if name == "read_file":
            path = (scratch / str(args.get("name", ""))).resolve()
            if path.parent != scratch.resolve() or not path.is_file():
                return {"error": f"no such file: {args.get('name')!r}"}
            return {"content": path.read_text()[:2000]}
        return {"error": f"unknown tool {name!r}"}
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


async def run_agent(
    engine: Engine,
    task: str,
    scratch: Path,
    *,
    tool_choice="auto",
    max_turns: int = 4,
    params: SamplingParams | None = None,
    show=print,
) -> list[dict]:
    """Turns until the model answers without a tool call (or `max_turns`); the conversation."""
    params = params or SamplingParams(temperature=0, max_tokens=256)
    messages = [
        {"role": "system", "content": "You are a careful assistant. Use the tools when they help."},
        {"role": "user", "content": task},
    ]
    for turn in range(max_turns):
        choice = tool_choice if turn == 0 else "auto"
        show(f"--- turn {turn + 1} (tool_choice={choice!r})")
        out = None
        async for delta in engine.stream(messages, params, tools=TOOLS, tool_choice=choice):
            show(delta.text, end="", flush=True)
            out = delta.output or out
        show()
        writers = out.tokens_per_model()
        show(
            f"    [{len(out.token_ids)} tokens {writers}, {out.num_handoffs} hand-offs, "
            f"{out.num_cached_prompt_tokens} of {len(out.prompt_token_ids)} prompt tokens from the prefix cache]"
        )
        messages.append(out.message())
        if not out.tool_calls:
            break
        for call in out.tool_calls:
            result = run_tool(call.name, call.arguments, scratch)
            show(f"    {call.name}({json.dumps(call.arguments)}) -> {json.dumps(result)}")
            messages.append({"role": "tool", "content": json.dumps(result), "tool_call_id": call.id})
    return messages


def make_scratch() -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="tokenrouter-agent-"))
    (scratch / "prices.txt").write_text("apples 3.20\npears 2.75\nplums 4.10\n")
    (scratch / "notes.md").write_text("Buy 3 kg of apples and 2 kg of plums.\n")
    return scratch


async def main(args) -> None:
    from tokenrouter import store

    store.pull("demo")  # a no-op once the pair is in the store
    scratch = make_scratch()
    async with Engine() as engine:  # the demo pair under RStitch(tau=0.03)
        await run_agent(engine, args.task, scratch, tool_choice=args.tool_choice, max_turns=args.max_turns)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", nargs="?", default="Read notes.md and prices.txt, then compute what the shopping costs.")
    p.add_argument("--tool-choice", default="auto", choices=["auto", "required"])
    p.add_argument("--max-turns", type=int, default=4)
    anyio.run(main, p.parse_args())
