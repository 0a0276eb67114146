"""`--prompts`: a workload from a JSON Lines file of your own prompts, checked line by line.

Every bad line is a ConfigError naming the file, the line and the field, before any model loads,
so a typo does not cost a load of the models to find.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..api import CHAT_ROLES
from ..errors import ConfigError
from ..jsonl import read_records
from .sessions import Session, Sizes
from .workloads import WorkloadSpec

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
