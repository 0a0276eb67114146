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
    if _on_httpx2():
        import httpx2

        from .httpx2_transports import AsyncHttpx2Transport

        http_client = httpx2.AsyncClient(transport=AsyncHttpx2Transport(engine))
    else:
        import httpx

        from .httpx_transports import AsyncHttpxTransport

        http_client = httpx.AsyncClient(transport=AsyncHttpxTransport(engine))
    kwargs = {"base_url": BASE_URL, "api_key": API_KEY, "max_retries": 0, **kwargs}
    return openai.AsyncOpenAI(http_client=http_client, **kwargs)


def client(llm, **kwargs) -> openai.OpenAI:
    """An `openai.OpenAI` whose requests `llm` (an open `LLM`) answers in its own event loop,
    from any thread. `kwargs` go to `OpenAI`."""
    if _on_httpx2():
        import httpx2

        from .httpx2_transports import Httpx2Transport

        http_client = httpx2.Client(transport=Httpx2Transport(llm))
    else:
        import httpx

        from .httpx_transports import HttpxTransport

        http_client = httpx.Client(transport=HttpxTransport(llm))
    kwargs = {"base_url": BASE_URL, "api_key": API_KEY, "max_retries": 0, **kwargs}
    return openai.OpenAI(http_client=http_client, **kwargs)
