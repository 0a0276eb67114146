"""The agentic workload's sessions: a coding agent's history (a shared system prompt, a task, tool
outputs) and the tool outputs of its later turns, all synthetic and sized in tokens.

The sessions of a run share their system prompt and each session's turns share a growing prefix:
the work where prefix caching and kept KV pay, so the comparison shows what they are worth.
"""

from __future__ import annotations

import random

from .questions import FUNCTIONS, NAMES
from .sessions import Session, Sizes, chat_tokens

TOOLS = [
    "read_file(path): print a file with line numbers",
    "list_dir(path): list a directory with sizes and dates",
    "grep(pattern, path): search files for a regular expression",
    "run_tests(pattern): run the test suite, or the tests matching a pattern",
    "edit_file(path, old, new): replace one exact snippet in a file",
    "run(command): run a shell command and print its output",
    "git_diff(): show the working tree's changes",
    "git_log(n): show the last n commits",
]
MODULES = [
    "parser",
    "lexer",
    "cache",
    "scheduler",
    "store",
    "server",
    "client",
    "config",
    "metrics",
    "auth",
    "router",
    "queue",
    "worker",
    "codec",
    "index",
    "report",
]
VERBS = ["Fix", "Speed up", "Refactor", "Add logging to", "Add tests for", "Document"]
LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR"]


def _system_lines(rng: random.Random, repo: str):
    """The shared system prompt, line by line: who the agent is, its tools, then repo conventions
    (as long as wanted)."""
    yield f"You are a coding agent in the repository {repo}."
    yield "The user pastes the output of each tool you call."
    yield "Tools:"
    yield from (f"- {t}" for t in TOOLS)
    yield "Repository conventions:"
    while True:
        m, p = rng.choice(MODULES), rng.choice(NAMES)
        yield f"- src/{repo}/{m}.py: owned by {p}; every change needs a test in tests/test_{m}.py."


def _listing(rng: random.Random, repo: str) -> list[str]:
    d = rng.choice(MODULES)
    lines = [f"$ ls -la src/{repo}/{d}"]
    for m in rng.sample(MODULES, rng.randint(4, 10)):
        lines.append(
            f"-rw-r--r-- 1 dev dev {rng.randint(200, 40000):6d} Mar {rng.randint(1, 28):2d} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {m}.py"
        )
    return lines


def _log(rng: random.Random, repo: str) -> list[str]:
    m = rng.choice(MODULES)
    lines = [f"$ pytest -q tests/test_{m}.py"]
    for _ in range(rng.randint(4, 12)):
        level, mod = rng.choice(LEVELS), rng.choice(MODULES)
        lines.append(
            f"{rng.randint(10, 23)}:{rng.randint(10, 59)}:{rng.randint(10, 59)} {level} {repo}.{mod}: "
            f"processed {rng.randint(1, 5000)} items in {rng.randint(1, 900)} ms"
        )
    lines.append(
        f"FAILED tests/test_{m}.py::test_{rng.choice(FUNCTIONS)} - AssertionError: {rng.randint(0, 99)} != "
        f"{rng.randint(0, 99)}"
    )
    return lines


def _code(rng: random.Random, repo: str) -> list[str]:
    m, f = rng.choice(MODULES), rng.choice(FUNCTIONS)
    lines = [f"$ cat src/{repo}/{m}.py", f"def {f}(items, limit={rng.randint(2, 64)}):", "    out = []"]
    for _ in range(rng.randint(2, 8)):
        a, b = rng.choice(["x", "item", "row"]), rng.randint(1, 9)
        lines.append(
            rng.choice(
                [
                    f"    for {a} in items[:limit]:",
                    f"        if {a} % {b} == 0:",
                    f"            out.append({a} * {b})",
                    f"    limit -= {b}",
                    f"    log.debug('{f}: %d left', limit)",
                ]
            )
        )
    lines.append("    return out")
    return lines


def _tool_output(rng: random.Random, repo: str) -> list[str]:
    return rng.choice([_listing, _log, _code])(rng, repo)


def _trim(lines: list[str], count, target: int) -> str:
    """The shortest cut of a text (whole lines, then words of its last line) that `count` still
    gives at least `target` tokens; the text is assumed to reach the target whole."""
    lines = list(lines)
    while len(lines) > 1 and count("\n".join(lines[:-1])) >= target:
        lines.pop()
    words = lines[-1].split(" ")
    while len(words) > 1 and count("\n".join([*lines[:-1], " ".join(words[:-1])])) >= target:
        words.pop()
    return "\n".join([*lines[:-1], " ".join(words)])


def _sized_output(tokenizer, rng: random.Random, repo: str, tokens: int) -> str:
    """A tool output of about `tokens` tokens (several outputs joined, the last one cut)."""

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    lines: list[str] = []
    while count("\n".join(lines)) < tokens:
        lines += _tool_output(rng, repo)
    return _trim(lines, count, tokens)


def agentic_sessions(tokenizer, n: int, sizes: Sizes, rng: random.Random) -> list[Session]:
    """`n` sessions sharing one system prompt (about a quarter of the history), each with its own
    task and tool outputs up to about `history_tokens`, then `turns - 1` follow-up tool outputs of
    about an eighth of the history each (at least 8 tokens)."""
    history = sizes.history_tokens or 0
    repo = rng.choice(["atlas", "beacon", "cobalt", "delta", "ember"])
    system_lines = _system_lines(rng, repo)
    system = next(system_lines)
    while chat_tokens(tokenizer, [{"role": "system", "content": system}]) < history // 4:
        system += "\n" + next(system_lines)
    followup_size = max(8, history // 8)
    sessions = []
    for _ in range(n):
        m = rng.choice(MODULES)
        task = f"{rng.choice(VERBS)} {m}.py: test_{m} fails."
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        count = chat_tokens(tokenizer, messages)
        while count < history:
            action = rng.choice(["Let me look.", "Checking.", "Next, the tests."])
            messages.append({"role": "assistant", "content": action})
            lines = _tool_output(rng, repo)
            messages.append({"role": "user", "content": "\n".join(lines)})
            count = chat_tokens(tokenizer, messages)
            if count > history:  # cut the last output so that the history ends just at the target

                def with_output(text: str, head=messages[:-1]) -> int:
                    return chat_tokens(tokenizer, [*head, {"role": "user", "content": text}])

                messages[-1] = {"role": "user", "content": _trim(lines, with_output, history)}
                count = chat_tokens(tokenizer, messages)
        followups = [_sized_output(tokenizer, rng, repo, followup_size) for _ in range(sizes.turns - 1)]
        sessions.append(
            Session(
                messages,
                [sizes.max_tokens] * sizes.turns,
                followups,
                prompt_tokens=count,
                followup_tokens=[len(tokenizer.encode(f, add_special_tokens=False)) for f in followups],
            )
        )
    return sessions
