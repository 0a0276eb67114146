"""Errors as OpenAI's API sends them: a status and `{"error": {"message", "type", "param", "code"}}`.

`APIError` is what the request layer raises; `api_error` maps the engine's exceptions onto one,
so a framework reading `openai.BadRequestError.param` learns which field to fix. `ReadTimedOut`
is the client's read timeout passing, which a transport raises as its own library's ReadTimeout.
"""

from __future__ import annotations

import logging
import re

from pydantic import ValidationError

from ..errors import ContextLengthExceededError, EngineNotRunningError, InvalidRequestError

log = logging.getLogger(__name__)

NO_RETRY = {"x-should-retry": "false"}  # the openai SDK's hint: retrying the same call would fail the same way


class APIError(Exception):
    """An error response: `status`, and the body's `message`, `type`, `param` and `code`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ReadTimedOut(Exception):
    """The client's read timeout passed before the answer (or a stream's next chunk) came."""


def bad_request(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, f"{param}: {message}" if param else message, param=param, code=code)


def server_error(status: int, message: str, code: str) -> APIError:
    return APIError(status, message, type="server_error", code=code, headers=dict(NO_RETRY))


# The engine names a chat prompt "prompt[i]..."; this API calls it "messages[i]...".
_PROMPT = re.compile(r"^prompt(?=\[|$)")


def api_error(e: Exception, renamed: dict[str, str] | None = None) -> APIError:
    """The error response for an exception the engine (or SamplingParams) raised. `renamed`: the
    request's names for SamplingParams fields that differ (max_tokens given as max_completion_tokens, ...)."""
    renamed = renamed or {}
    if isinstance(e, APIError):
        return e
    if isinstance(e, InvalidRequestError):
        field = _PROMPT.sub("messages", e.field)
        field = renamed.get(field, field)
        if isinstance(e, ContextLengthExceededError):
            return bad_request(field, e.message, code="context_length_exceeded")
        return bad_request(field, e.message)
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        loc = [str(x) for x in first["loc"]]
        field = renamed.get(loc[0], loc[0]) if loc else None
        return bad_request(field, first["msg"])
    if isinstance(e, EngineNotRunningError):
        return server_error(503, str(e), "engine_not_running")
    log.exception("the request failed")
    return server_error(500, f"{type(e).__name__}: {e}", "internal_error")
