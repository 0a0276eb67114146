"""The agentic-edit workload's sessions: a coding agent sends a file and a grep of it, as its tools
printed them, and asks for the whole file back with one function renamed (the "whole file" edit
format of coding agents); its next turn asks for the answer again with a comment added. An
answer quotes the prompt (and then its own earlier answer) nearly token for token: the work where
prompt-lookup drafts pay (`Speculative(lookup=True)`, docs/policies.md).

The file and the grep are in the user's message, not behind assistant turns that call tools:
with such turns in the history the demo 1.5B answered with one more tool call (12 tokens, then
its end of turn) instead of the file, and a run that ignores EOS measured what it wrote after.

The files are real code: this package's own modules, as installed, cut to whole top-level
functions. Nothing is downloaded; the same version of the package, seed, level and tokenizer give
the same prompts.
"""

from __future__ import annotations

import ast
import random
from functools import lru_cache
from pathlib import Path

from .sessions import Session, Sizes, chat_tokens

PACKAGE = Path(__file__).resolve().parent.parent
SYSTEM = (
    "You are a coding agent working in the repository of the Python package tokenrouter. "
    "When asked for a file, reply with the whole file in one Python code block and nothing else."
)
RENAMES = ("{}_v2", "new_{}", "{}_impl", "checked_{}")
MIN_FUNCTIONS = 3  # a module quoted must have this many top-level functions


@lru_cache(maxsize=1)
def modules() -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """Each module of the package with at least MIN_FUNCTIONS top-level functions: its path in
    the repository and its functions as (name, source), in file order; modules sorted by path."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        functions = []
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                functions.append((node.name, "\n".join(lines[first - 1 : node.end_lineno])))
        if len(functions) >= MIN_FUNCTIONS:
            found.append((path.relative_to(PACKAGE.parent).as_posix(), tuple(functions)))
    return tuple(found)


def _file(tokenizer, rng: random.Random, tokens: int) -> tuple[str, str, list[str]]:
    """A file of whole functions of at least `tokens` tokens (or a whole module's, when shorter):
    its path, its text, and the functions' names, from a module drawn by `rng`."""
    path, functions = rng.choice(modules())
    start = rng.randrange(len(functions))
    picked: list[tuple[str, str]] = []
    for i in range(len(functions)):
        picked.append(functions[(start + i) % len(functions)])
        text = "\n\n\n".join(src for _, src in picked) + "\n"
        if len(tokenizer.encode(text, add_special_tokens=False)) >= tokens:
            break
    return path, text, [name for name, _ in picked]


def _grep(path: str, text: str, name: str) -> str:
    hits = [f"{path}:{n}:{line}" for n, line in enumerate(text.splitlines(), 1) if name in line]
    return f"$ grep -n '{name}' {path}\n" + "\n".join(hits)


def edit_sessions(tokenizer, n: int, sizes: Sizes, rng: random.Random) -> list[Session]:
    """`n` sessions, each quoting a file of about `history_tokens` tokens (whole functions) and a
    grep of it, then asking for the whole file with a function renamed, in one user message;
    each later turn (of `turns`) asks for the whole file again with a comment added above a
    function."""
    sessions = []
    for _ in range(n):
        path, text, names = _file(tokenizer, rng, sizes.history_tokens or 0)
        used = [name for name in names if text.count(name) > 1]  # rather one called in the file too
        old = rng.choice(used or names)
        new = rng.choice(RENAMES).format(old)
        task = (
            f"$ cat {path}\n```python\n{text}```\n\n{_grep(path, text, old)}\n\n"
            f"In {path}, rename `{old}` to `{new}` and update every use of it. Reply with the whole edited file."
        )
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        followups = [
            f"$ pytest\n1 passed, 1 skipped: {path}: no test of `{other}` yet.\n\nAdd the comment "
            f"`# TODO: test {other}` on the line above `def {other}(`, and reply with the whole file again."
            for other in (rng.choice(names) for _ in range(sizes.turns - 1))
        ]
        sessions.append(
            Session(
                messages,
                [sizes.max_tokens] * sizes.turns,
                followups,
                prompt_tokens=chat_tokens(tokenizer, messages),
                followup_tokens=[len(tokenizer.encode(f, add_special_tokens=False)) for f in followups],
            )
        )
    return sessions
