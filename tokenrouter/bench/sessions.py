"""A session, the unit of work every workload is made of, and how big one is.

Shared by the built-in generators, the prompts file and the closed loop that runs them; sizes
are counted in the served model's own tokens, chat template included, so one number means the
same work for every system.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..api import chat_ids

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


def chat_tokens(tokenizer, messages: Sequence[Mapping]) -> int:
    """The messages' length in the tokenizer's tokens, chat template included."""
    return len(chat_ids(tokenizer, messages))
