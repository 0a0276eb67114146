"""The benchmark's workloads: what every system is asked to do, generated from a seed.

Four built-in workloads, each with a `gpu` size (the real one) and a `cpu` size (scaled down so a
2-core box finishes in minutes), plus a JSONL file of your own prompts (`prompt_file.py`):

- `short`: short reasoning. Coding and maths questions built from templates with seeded numbers
  and names, 30-120 prompt tokens after the chat template; each request's output length is drawn
  from [max/4, max] (EOS makes real lengths differ; every system gets the same lengths).
- `long`: long reasoning. The same prompt style, a larger max.
- `agentic`: multi-turn sessions. A long history (a system prompt, shared by every session of a
  run, then synthetic tool outputs: file listings, logs, code) of about `history_tokens` tokens;
  each turn writes `max_tokens` tokens, then the next turn appends that answer and a new tool
  output, so a session's turns share a growing prefix (where prefix caching and kept KV pay).
- `agentic-edit`: an agent quotes a file of about `history_tokens` tokens (this package's own
  code, whole functions) and a grep of it, and asks for the whole file back with a function
  renamed; each later turn asks for it again with another edit. The answers repeat the prompt
  (where prompt-lookup drafts pay). Not in the default set: name it.

Nothing is downloaded: prompts are generated (`questions.py`, `agentic.py`) and sized in tokens
with the served model's own tokenizer (so "120 tokens" means 120 tokens of that model, chat
template included). The same seed, level and tokenizer give the same prompts. Requests are
greedy with EOS ignored, so every system does exactly the same work.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from ..errors import ConfigError
from .agentic import agentic_sessions
from .edits import edit_sessions
from .questions import question_session
from .sessions import Session, Sizes, chat_tokens

BUILT_IN = ("short", "long", "agentic", "agentic-edit")
DEFAULT_WORKLOADS = ("short", "long", "agentic")  # what a run without --workload runs
SESSION_WORKLOADS = ("agentic", "agentic-edit")  # the ones with a history and turns
SIZE_NAMES = ("cpu", "gpu")


SIZES: dict[str, dict[str, Sizes]] = {
    # cpu: the gpu sizes / 128 (agentic / 64, and 2 turns): a 2-core box writes a few tokens/s
    "short": {"gpu": Sizes(2048), "cpu": Sizes(16), "tiny": Sizes(4, prompt_tokens=(30, 50))},
    "long": {"gpu": Sizes(8192), "cpu": Sizes(64), "tiny": Sizes(6, prompt_tokens=(30, 50))},
    "agentic": {"gpu": Sizes(1024, 8192, 4), "cpu": Sizes(16, 128, 2), "tiny": Sizes(4, 48, 2)},
    # agentic-edit: an answer as long as the file it rewrites (cpu: most of it)
    "agentic-edit": {"gpu": Sizes(1024, 1024, 2), "cpu": Sizes(128, 192, 2), "tiny": Sizes(4, 48, 2)},
}
#: `tokenrouter bench --quick` uses the "tiny" sizes: the smallest run that still exercises every
#: path, in minutes on the demo pair (prefilling the prompt on both models dominates there).


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
        if self.name == "agentic-edit":
            return (
                f"agentic edits: a ~{s.history_tokens}-token file quoted and asked back edited, {s.turns} turns of "
                f"{s.max_tokens} output tokens"
            )
        kind = "short" if self.name == "short" else "long"
        return (
            f"{kind} reasoning: {s.prompt_tokens[0]}-{s.prompt_tokens[1]}-token prompts, "
            f"{max(1, s.max_tokens // 4)}-{s.max_tokens} output tokens"
        )

    def sizes_dict(self) -> dict:
        s = self.sizes
        if self.name in SESSION_WORKLOADS:
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
            return [replace(s, prompt_tokens=chat_tokens(tokenizer, s.messages)) for s in picked]
        rng = random.Random(f"{seed}/{self.name}/{level}")
        if self.name == "agentic":
            return agentic_sessions(tokenizer, sessions, self.sizes, rng)
        if self.name == "agentic-edit":
            return edit_sessions(tokenizer, sessions, self.sizes, rng)
        return [question_session(tokenizer, self.sizes, rng) for _ in range(sessions)]


def workload(name: str, size: str = "cpu", **overrides) -> WorkloadSpec:
    """A built-in workload at a size ("cpu", "gpu" or "tiny"), with any of max_tokens,
    history_tokens, turns overridden (None leaves the size's value)."""
    if name not in SIZES:
        raise ConfigError(f"workload: unknown {name!r}; the built-in ones are {', '.join(BUILT_IN)}")
    if size not in SIZES[name]:
        raise ConfigError(f"size: unknown {size!r}; expected one of {', '.join(SIZE_NAMES)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    if name not in SESSION_WORKLOADS:
        for key in ("history_tokens", "turns"):
            if key in given:
                raise ConfigError(f"{key}: only the agentic workloads have it, not {name!r}")
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}: must be an integer >= 1, got {value!r}")
    return WorkloadSpec(name, replace(SIZES[name][size], **given))
