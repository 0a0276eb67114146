"""Shared pieces of the bad-input tables (tests/config/test_*_input.py, tests/api/test_*_input.py).

Each case must fail with a typed error that names what was wrong, and none may reach a worker.
The tables also check themselves: every field of SamplingParams and ModelSpec and every
parameter of Engine() has rows, so a new field without bad-input cases fails.

Decisions these tables pin down:
- numbers and flags are strict: bool is not an int, 3.0 is not an int, "3" is not a number,
  1 is not a bool; an int is a fine float. NaN and +/-inf are rejected wherever a float goes.
- `stop_timeout` is finite and > 0, `batch_wait_s` finite and >= 0, `num_threads` an int >= 1.
- a prompt (or chat content) with NUL is rejected; other control characters (tab, newline,
  ANSI escapes) are text and accepted. A lone surrogate (not encodable as UTF-8) is rejected.
"""

from __future__ import annotations

import math

import pydantic
import pytest

NAN, INF = math.nan, math.inf
NO_SUCH_PATH = "/nonexistent/tokenrouter-test/model"


def ids(rows, what=lambda r: r):
    return [pytest.param(*r, id=what(r)) for r in rows]


def show(v) -> str:
    s = repr(v)
    return s if len(s) <= 24 else s[:21] + "..."


def check_validation_error(e: pydantic.ValidationError, field: str, fragment: str) -> None:
    """The error is about `field` (its location, or its message for a cross-field rule) and says `fragment`."""
    errors = e.errors()
    located = {err["loc"][0] for err in errors if err["loc"]}
    if located:
        assert located == {field}, f"error located at {located}, expected {field!r}: {e}"
    else:
        assert field in str(e), f"error does not name {field!r}: {e}"
    assert fragment in str(e), f"{fragment!r} not in: {e}"
