"""The `openai` clients an agent framework takes, answered by the engine in this process.

The base URL can never resolve (`.invalid`), so nothing leaves the process; the key is a
placeholder; retries are off (a retry would run the request again, it cannot recover one). The
HTTP library is the one the installed `openai` builds on: httpx2 from openai 3, else httpx.
"""

from __future__ import annotations

import openai

BASE_URL = "http://tokenrouter.invalid/v1"
API_KEY = "tokenrouter-in-process"  # the client insists on one; nothing checks it


def _on_httpx2() -> bool:
    try:
        import httpx2
    except ImportError:
        return False
    return issubclass(openai.DefaultAsyncHttpxClient, httpx2.AsyncClient)


def async_client(engine, **kwargs) -> openai.AsyncOpenAI:
    """An `openai.AsyncOpenAI` whose requests `engine` (a running `Engine`) answers, in the
    caller's event loop. `kwargs` go to `AsyncOpenAI` (`timeout=`, `default_headers=`, ...)."""
    return openai.AsyncOpenAI(http_client=_http_client(engine, sync=False), **_settings(kwargs))


def client(llm, **kwargs) -> openai.OpenAI:
    """An `openai.OpenAI` whose requests `llm` (an open `LLM`) answers in its own event loop,
    from any thread. `kwargs` go to `OpenAI`."""
    return openai.OpenAI(http_client=_http_client(llm, sync=True), **_settings(kwargs))


def _settings(kwargs: dict) -> dict:
    return {"base_url": BASE_URL, "api_key": API_KEY, "max_retries": 0, **kwargs}


def _http_client(target, sync: bool):
    """The HTTP library's client over its in-process transport: `target` is an `LLM` (sync) or an
    `Engine` (async)."""
    if _on_httpx2():
        import httpx2

        from .httpx2_transports import AsyncHttpx2Transport, Httpx2Transport

        return (
            httpx2.Client(transport=Httpx2Transport(target))
            if sync
            else httpx2.AsyncClient(transport=AsyncHttpx2Transport(target))
        )
    import httpx

    from .httpx_transports import AsyncHttpxTransport, HttpxTransport

    return (
        httpx.Client(transport=HttpxTransport(target))
        if sync
        else httpx.AsyncClient(transport=AsyncHttpxTransport(target))
    )
