"""JSON Lines files of prompts (`tokenrouter label`, `tokenrouter bench --prompts`): one reader,
so both name a bad file, line and column the same way."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError


def read_records(path: str | Path) -> list[tuple[str, object]]:
    """(where, parsed JSON) for every non-blank line, `where` being "path:line" for messages.
    A missing or unreadable file, or a line that is not JSON, is a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it as UTF-8 text: {e}") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            records.append((where, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
    return records
