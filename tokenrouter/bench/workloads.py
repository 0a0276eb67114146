"""The benchmark's workloads: what every system is asked to do, generated from a seed.

Three built-in workloads, each with a `gpu` size (the real one) and a `cpu` size (scaled down so a
2-core box finishes in minutes), plus a JSONL file of your own prompts:

- `short`: short reasoning. Coding and maths questions built from templates with seeded numbers
  and names, 30-120 prompt tokens after the chat template; each request's output length is drawn
  from [max/4, max] (EOS makes real lengths differ; every system gets the same lengths).
- `long`: long reasoning. The same prompt style, a larger max.
- `agentic`: multi-turn sessions. A long history (a system prompt, shared by every session of a
  run, then synthetic tool outputs: file listings, logs, code) of about `history_tokens` tokens;
  each turn writes `max_tokens` tokens, then the next turn appends that answer and a new tool
  output, so a session's turns share a growing prefix (where prefix caching and kept KV pay).

Nothing is downloaded: prompts are built here, and sized in tokens with the served model's own
tokenizer (so "120 tokens" means 120 tokens of that model, chat template included). The same
seed, level and tokenizer give the same prompts. Requests are greedy with EOS ignored, so every
system does exactly the same work.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..api.prompts import CHAT_ROLES, chat_ids
from ..errors import ConfigError
from ..jsonl import read_records

BUILT_IN = ("short", "long", "agentic")
SIZE_NAMES = ("cpu", "gpu")
PROMPT_TOKENS = (30, 120)  # short and long prompts: tokens after the chat template (--quick: 30-50)


@dataclass(frozen=True)
class Sizes:
    """How much work one session is. short/long: one turn whose output length is drawn from
    [max_tokens/4, max_tokens], after a prompt of a length drawn from `prompt_tokens`; agentic:
    `turns` turns of exactly `max_tokens` each, after a history of about `history_tokens` tokens."""

    max_tokens: int
    history_tokens: int | None = None
    turns: int = 1
    prompt_tokens: tuple[int, int] = PROMPT_TOKENS


SIZES: dict[str, dict[str, Sizes]] = {
    # cpu: the gpu sizes / 128 (agentic / 64, and 2 turns): a 2-core box writes a few tokens/s
    "short": {"gpu": Sizes(2048), "cpu": Sizes(16), "tiny": Sizes(4, prompt_tokens=(30, 50))},
    "long": {"gpu": Sizes(8192), "cpu": Sizes(64), "tiny": Sizes(6, prompt_tokens=(30, 50))},
    "agentic": {"gpu": Sizes(1024, 8192, 4), "cpu": Sizes(16, 128, 2), "tiny": Sizes(4, 48, 2)},
}
#: `tokenrouter bench --quick` uses the "tiny" sizes: the smallest run that still exercises every
#: path, in minutes on the demo pair (prefilling the prompt on both models dominates there).


@dataclass
class Session:
    """One client's work. Turn 1 sends `messages`; after each answer but the last, the answer and
    the next `followups` message (a tool output, as the user) are appended and the next turn sent.
    A short or long request is a one-turn session."""

    messages: list[dict]
    max_tokens: list[int]  # output tokens of each turn
    followups: list[str] = field(default_factory=list)
    prompt_tokens: int = 0  # of turn 1, chat template included
    followup_tokens: list[int] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.max_tokens)

    def context_tokens(self) -> int:
        """An upper estimate of the last turn's prompt + output: what KV and context must hold."""
        per_message = 16  # chat-template tokens around a message, and re-tokenization slack
        return (
            self.prompt_tokens + sum(self.max_tokens) + sum(self.followup_tokens) + per_message * 2 * (self.turns - 1)
        )


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload before it is built for a tokenizer: a built-in one at a size, or a file's prompts."""

    name: str
    sizes: Sizes
    prompts: tuple[Session, ...] | None = None  # --prompts: the file's lines, in order
    source: str | None = None  # the file, for the report

    def describe(self) -> str:
        s = self.sizes
        if self.prompts is not None:
            return f"{len(self.prompts)} prompts from {self.source}"
        if self.name == "agentic":
            return (
                f"agentic sessions: ~{s.history_tokens}-token shared history, {s.turns} turns of "
                f"{s.max_tokens} output tokens"
            )
        kind = "short" if self.name == "short" else "long"
        return (
            f"{kind} reasoning: {s.prompt_tokens[0]}-{s.prompt_tokens[1]}-token prompts, "
            f"{max(1, s.max_tokens // 4)}-{s.max_tokens} output tokens"
        )

    def sizes_dict(self) -> dict:
        s = self.sizes
        if self.name == "agentic":
            return {"max_tokens": s.max_tokens, "history_tokens": s.history_tokens, "turns": s.turns}
        if self.prompts is not None:
            return {"max_tokens": s.max_tokens}
        return {"max_tokens": s.max_tokens, "prompt_tokens": list(s.prompt_tokens)}

    def build(self, tokenizer, sessions: int, *, seed: int = 0, level: int = 0) -> list[Session]:
        """`sessions` sessions for one concurrency level. Each level draws its own prompts (from
        seed, workload and level), so an engine reused across levels (`--quick`) never finds a
        level's prompts in its prefix cache. A prompts file is used from its first line, cycled."""
        if self.prompts is not None:
            picked = [self.prompts[i % len(self.prompts)] for i in range(sessions)]
            return [replace(s, prompt_tokens=_chat_tokens(tokenizer, s.messages)) for s in picked]
        rng = random.Random(f"{seed}/{self.name}/{level}")
        if self.name == "agentic":
            return agentic_sessions(tokenizer, sessions, self.sizes, rng)
        return [question_session(tokenizer, self.sizes, rng) for _ in range(sessions)]


def workload(name: str, size: str = "cpu", **overrides) -> WorkloadSpec:
    """A built-in workload at a size ("cpu", "gpu" or "tiny"), with any of max_tokens,
    history_tokens, turns overridden (None leaves the size's value)."""
    if name not in SIZES:
        raise ConfigError(f"workload: unknown {name!r}; the built-in ones are {', '.join(BUILT_IN)}")
    if size not in SIZES[name]:
        raise ConfigError(f"size: unknown {size!r}; expected one of {', '.join(SIZE_NAMES)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    if name != "agentic":
        for key in ("history_tokens", "turns"):
            if key in given:
                raise ConfigError(f"{key}: only the agentic workload has it, not {name!r}")
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}: must be an integer >= 1, got {value!r}")
    return WorkloadSpec(name, replace(SIZES[name][size], **given))


# ---- short and long: questions from templates ----------------------------------------------------
NAMES = [
    "Alice",
    "Bob",
    "Chen",
    "Dana",
    "Eve",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
]
FUNCTIONS = [
    "parse_log",
    "merge_intervals",
    "top_k",
    "flatten",
    "chunked",
    "dedupe",
    "rolling_mean",
    "count_words",
    "rotate",
    "median",
    "pairs_sum",
    "is_balanced",
]
CODING = [
    "Write a Python function {f}(xs) that returns the {k} largest of {n} integers.",
    "Implement binary search over {n} sorted integers; return the index of {a} or -1.",
    "Write a SQL query for the {k} latest of {n} orders per customer in table {t}.",
    "Fix {f}(xs): it should sum the even numbers, but gives {a} for [{b}, {c}, {k}].",
    "Write a Python class {C} of at most {n} items with push, pop and peek.",
    "Write a function that counts each word in {p}'s {n} notes and returns the top {k}.",
    "Write a function {f}(xs, k) that splits {n} items into chunks of {k}.",
    "Write a regular expression for dates like 2026-0{k}-1{k} in a {n}-line log.",
]
MATHS = [
    "{p} has {a} apples and buys {b} bags of {k} apples. How many apples now?",
    "Solve for x: {a}x + {b} = {c}.",
    "What is the sum of the integers from 1 to {n}? Prove the formula.",
    "Is {c} prime? Explain how you check it.",
    "Find the greatest common divisor of {a} and {c} with Euclid's algorithm.",
    "A train leaves at {k}:00 at {a} km/h; another leaves an hour later at {b} km/h. When does it catch up?",
    "{p} saves {a} dollars a week. How many weeks until {p} has {c} dollars?",
]
DETAILS = {
    "coding": [
        "Handle empty input.",
        "State the time complexity.",
        "Give two test cases.",
        "Use only the standard library.",
        "Add type hints.",
        "Name one edge case.",
    ],
    "maths": ["Explain step by step.", "Check the answer at the end.", "Show your work.", "Explain why it is correct."],
}
EXAMPLE = {"coding": "Test it on these numbers: {}", "maths": "Then do the same for each of: {}"}


def _chat_tokens(tokenizer, messages: Sequence[Mapping]) -> int:
    return len(chat_ids(tokenizer, messages))


def _user_tokens(tokenizer, text: str) -> int:
    return _chat_tokens(tokenizer, [{"role": "user", "content": text}])


def _question(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["coding", "maths"])
    template = rng.choice(CODING if kind == "coding" else MATHS)
    text = template.format(
        f=rng.choice(FUNCTIONS),
        p=rng.choice(NAMES),
        C=rng.choice(["Stack", "Deque", "Ring"]) + "Store",
        t=rng.choice(["orders", "sales", "events"]),
        k=rng.randint(2, 9),
        n=rng.randint(10, 999),
        a=rng.randint(2, 99),
        b=rng.randint(2, 99),
        c=rng.randint(100, 9999),
    )
    return kind, text


def question_session(tokenizer, sizes: Sizes, rng: random.Random) -> Session:
    """One coding or maths question of a length drawn from `sizes.prompt_tokens` (chat template
    included): a templated question, up to two requirements, then example values, one at a time,
    until it reaches that length; its output length is drawn from [max_tokens/4, max_tokens].
    (If no question fits under the top of the range, e.g. a chat template with a long default
    system prompt, the shortest of those drawn is used as it is.)"""
    lo, hi = sizes.prompt_tokens
    target = rng.randint(lo, hi)
    shortest = None
    for _ in range(100):
        kind, text = _question(rng)
        n = _user_tokens(tokenizer, text)
        if shortest is None or n < shortest[2]:
            shortest = (kind, text, n)
        if n <= hi:
            break
    else:
        kind, text, n = shortest
    for detail in rng.sample(DETAILS[kind], 2):
        m = _user_tokens(tokenizer, f"{text} {detail}")
        if n >= target or m > hi:
            break
        text, n = f"{text} {detail}", m
    base, values = text, []
    while n < target:
        values.append(str(rng.randint(1, 999)))
        longer = f"{base} {EXAMPLE[kind].format(', '.join(values))}."
        m = _user_tokens(tokenizer, longer)
        if m > hi:
            break
        text, n = longer, m
    out = rng.randint(max(1, sizes.max_tokens // 4), sizes.max_tokens)
    return Session([{"role": "user", "content": text}], [out], prompt_tokens=n)


# ---- agentic: a system prompt, a task, tool outputs ----------------------------------------------
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
    while _chat_tokens(tokenizer, [{"role": "system", "content": system}]) < history // 4:
        system += "\n" + next(system_lines)
    followup_size = max(8, history // 8)
    sessions = []
    for _ in range(n):
        m = rng.choice(MODULES)
        task = f"{rng.choice(VERBS)} {m}.py: test_{m} fails."
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        count = _chat_tokens(tokenizer, messages)
        while count < history:
            action = rng.choice(["Let me look.", "Checking.", "Next, the tests."])
            messages.append({"role": "assistant", "content": action})
            lines = _tool_output(rng, repo)
            messages.append({"role": "user", "content": "\n".join(lines)})
            count = _chat_tokens(tokenizer, messages)
            if count > history:  # cut the last output so that the history ends just at the target

                def with_output(text: str, head=messages[:-1]) -> int:
                    return _chat_tokens(tokenizer, [*head, {"role": "user", "content": text}])

                messages[-1] = {"role": "user", "content": _trim(lines, with_output, history)}
                count = _chat_tokens(tokenizer, messages)
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


# ---- your own prompts ----------------------------------------------------------------------------
PROMPT_FIELDS = ("prompt", "messages", "max_tokens")


def read_prompts(path: str | Path, max_tokens: int) -> WorkloadSpec:
    """A workload from a JSON Lines file: one {"prompt": str} or {"messages": [chat messages]} per
    line, with an optional "max_tokens" (default `max_tokens`); blank lines are skipped and a
    "response" field is ignored (so a `tokenrouter label` corpus works as is). A bad line is a
    ConfigError naming the file, the line and the field."""
    sessions = [_prompt_line(record, where, max_tokens) for where, record in read_records(path)]
    if not sessions:
        raise ConfigError(f"{path}: no prompts (expected one JSON object per line)")
    return WorkloadSpec("prompts", Sizes(max_tokens), prompts=tuple(sessions), source=str(path))


def _prompt_line(record: object, where: str, default_max_tokens: int) -> Session:
    if not isinstance(record, dict):
        raise ConfigError(f'{where}: expected an object with "prompt" or "messages", got {type(record).__name__}')
    unknown = sorted(set(record) - set(PROMPT_FIELDS) - {"response"})
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; expected {', '.join(map(repr, PROMPT_FIELDS))}")
    if ("prompt" in record) == ("messages" in record):
        raise ConfigError(f'{where}: give exactly one of "prompt" (a string) and "messages" (a list of chat messages)')
    if "prompt" in record and not isinstance(record["prompt"], list):
        prompt = record["prompt"]
        if not isinstance(prompt, str):
            raise ConfigError(f'{where}: field "prompt" must be a string, got {type(prompt).__name__}')
        _check_text(prompt, where, '"prompt"')
        messages = [{"role": "user", "content": prompt}]
    else:
        key = "messages" if "messages" in record else "prompt"
        messages = _check_messages(record[key], where, key)
    max_tokens = record.get("max_tokens", default_max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f'{where}: field "max_tokens" must be an integer >= 1, got {json.dumps(max_tokens)}')
    return Session(messages, [max_tokens])


def _check_text(text: str, where: str, name: str) -> None:
    if not text.strip():
        raise ConfigError(f"{where}: field {name} is empty")
    if "\x00" in text:
        raise ConfigError(f"{where}: field {name} contains a NUL character")


def _check_messages(messages, where: str, key: str) -> list[dict]:
    if not isinstance(messages, list):
        raise ConfigError(f'{where}: field "{key}" must be a list of chat messages, got {type(messages).__name__}')
    if not messages:
        raise ConfigError(f'{where}: field "{key}" is an empty list')
    for i, m in enumerate(messages):
        name = f'"{key}"[{i}]'
        if not isinstance(m, dict):
            raise ConfigError(f'{where}: field {name} must be an object {{"role": ..., "content": ...}}')
        if m.get("role") not in CHAT_ROLES:
            raise ConfigError(f"{where}: field {name}.role must be one of {sorted(CHAT_ROLES)}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise ConfigError(f"{where}: field {name}.content must be a string")
        _check_text(m["content"], where, f"{name}.content")
    return [{"role": m["role"], "content": m["content"]} for m in messages]
