"""An `openai` client answered by the engine in this process (docs/integrations.md).

>>> client = async_client(engine)
>>> await client.chat.completions.create(model="large", messages=[{"role": "user", "content": "Hi"}])

Agent frameworks take an `openai` client; these are real ones, whose HTTP requests a transport
answers in process (`transport.py`), streaming and cancellable: httpx's in `httpx_transports.py`,
httpx2's (openai 3 builds on it) in `httpx2_transports.py`, each imported only where used.
Below the transports, `OpenAIServer` speaks the API without HTTP, and `ChatCompletions`
without even that.
"""

from .chat_completions import ChatCompletions
from .clients import API_KEY, BASE_URL, async_client, client
from .errors import APIError
from .server import OpenAIServer

__all__ = ["API_KEY", "APIError", "BASE_URL", "ChatCompletions", "OpenAIServer", "async_client", "client"]
