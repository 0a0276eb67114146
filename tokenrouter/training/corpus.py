"""The examples labels are made from: {"prompt", "response"} pairs, the prompt a string or chat
messages. `python_corpus(n)` builds an offline reference corpus (functions of this machine's Python
standard library), `read_jsonl(path)` reads one of your own, and `generate_responses` fills in
missing responses with a model's own answers. Apart from the labelling because none of it needs a
model loaded for teacher forcing: only the engine, and only to write responses.
"""

from __future__ import annotations

import ast
import functools
import os
import random
import sysconfig
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..jsonl import read_records

_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__"})


def _functions(body: list[ast.stmt]):
    """Function definitions among statements, in source order, nested ones (in classes, functions,
    if/try/with/for blocks) included; expressions are never visited."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        for attr in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, attr, None)
            if (
                isinstance(inner, list)
                and inner
                and isinstance(inner[0], (ast.stmt, ast.excepthandler, ast.match_case))
            ):
                if isinstance(inner[0], ast.stmt):
                    yield from _functions(inner)
                else:
                    for h in inner:
                        yield from _functions(h.body)


@functools.lru_cache(maxsize=1)
def _stdlib_functions() -> tuple[dict, ...]:
    """Every documented function of the standard library whose source is 200-2000 characters,
    in sorted file order, then source order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    out = []
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if rel.name.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts) or rel.stem
        lines = text.splitlines()
        for node in _functions(tree.body):
            doc = ast.get_docstring(node)
            if not doc or not doc.strip():
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            source = textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
            if not 200 <= len(source) <= 2000:
                continue
            line = doc.strip().splitlines()[0].strip()
            out.append(
                {"prompt": f"Write a Python function `{node.name}` (module {module}): {line}", "response": source}
            )
    return tuple(out)


def python_corpus(n: int, seed: int = 0) -> list[dict]:
    """`n` {"prompt", "response"} examples from this machine's Python standard library: functions
    with docstrings (tests, idlelib, lib2to3 and site-packages skipped; source of 200 to 2000
    characters); the prompt asks for the function by name, module and the docstring's first line,
    the response is its source. Deterministic for a given Python installation and seed."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"python_corpus: n must be a positive integer, got {n!r}")
    pool = list(_stdlib_functions())
    if n > len(pool):
        raise ConfigError(f"python_corpus: asked for {n} examples, the standard library here has {len(pool)}")
    random.Random(seed).shuffle(pool)
    return [dict(e) for e in pool[:n]]


def check_example(e, where: str, need_response: bool = True) -> dict:
    """`e` as a plain {"prompt", "response"} dict, or a ConfigError that starts with `where`."""
    if not isinstance(e, Mapping):
        raise ConfigError(f'{where}: expected an object with "prompt" and "response", got {type(e).__name__}')
    missing = [k for k in ("prompt", "response") if k not in e and (k == "prompt" or need_response)]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(repr(k) for k in missing)}")
    prompt, response = e["prompt"], e.get("response")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f'{where}: "prompt" is empty')
    elif isinstance(prompt, list):
        if not prompt:
            raise ConfigError(f'{where}: "prompt" is an empty list of messages')
        for i, m in enumerate(prompt):
            if (
                not isinstance(m, Mapping)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                raise ConfigError(f'{where}: "prompt"[{i}] must be a chat message {{"role": str, "content": str}}')
    else:
        raise ConfigError(f'{where}: "prompt" must be a string or a list of chat messages, got {type(prompt).__name__}')
    if response is None and not need_response:
        return {"prompt": prompt, "response": None}
    if not isinstance(response, str):
        raise ConfigError(f'{where}: "response" must be a string, got {type(response).__name__}')
    if not response:
        raise ConfigError(f'{where}: "response" is empty')
    return {"prompt": prompt, "response": response}


def read_jsonl(path: str | Path, need_response: bool = True) -> list[dict]:
    """Examples from a JSON Lines file, one {"prompt": str | [chat messages], "response": str} per
    line (blank lines skipped). With `need_response=False` a line may leave the response out
    (`generate_responses` fills it). A bad line is a ConfigError naming the file and line number."""
    examples = [check_example(record, where, need_response) for where, record in read_records(path)]
    if not examples:
        raise ConfigError(f"{path}: no examples (expected one JSON object per line)")
    return examples


def generate_responses(
    model: str | Path, examples: Sequence[Mapping], max_tokens: int, dtype: str = "auto", num_threads: int | None = None
) -> list[dict]:
    """Fill in the examples that have no response with `model`'s own greedy answer (served by the
    engine, all at once, through the chat template), so that labels can be made from prompts alone."""
    import anyio

    from ..api import Engine
    from ..config import ModelSpec, SamplingParams
    from ..policies import Single

    todo = [i for i, e in enumerate(examples) if e.get("response") is None]
    out = [dict(e) for e in examples]
    if not todo:
        return out
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    spec = ModelSpec(path=model, dtype=dtype)

    async def run():
        async with Engine(models={"writer": spec}, policy=Single("writer"), num_threads=num_threads) as engine:

            async def one(i):
                prompt = examples[i]["prompt"]
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                result = await engine.generate(messages, params)
                if result.finish_reason not in ("stop", "length") or not result.text:
                    raise ConfigError(
                        f"example {i}: the model wrote no response ({result.finish_reason}: {result.error})"
                    )
                out[i]["response"] = result.text

            async with anyio.create_task_group() as tg:
                for i in todo:
                    tg.start_soon(one, i)

    anyio.run(run)
    return out


__all__ = ["check_example", "generate_responses", "python_corpus", "read_jsonl"]
