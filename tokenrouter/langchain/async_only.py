"""What stands where the sync `openai` client would be when `ChatTokenRouter` is given an `Engine`.

An `Engine` runs in its caller's event loop; a blocking call (`invoke`, `stream`, `batch`) has no
loop of its own to run it in, so it is refused, saying what to do instead, rather than left to
LangChain's default client, which would send the request to api.openai.com.
"""

from __future__ import annotations

from ..errors import TokenRouterError

MESSAGE = (
    "ChatTokenRouter(engine=<Engine>) answers async calls only (ainvoke, astream, abatch, astream_events): "
    "an Engine runs in its caller's event loop, and a blocking call has none to run it in. "
    "For invoke, stream and batch, give it an LLM: ChatTokenRouter(engine=LLM(...)), which serves both."
)


class SyncCallError(TokenRouterError, RuntimeError):
    """A blocking call on a `ChatTokenRouter` made from an `Engine`."""


class AsyncOnlyClient:
    """Raises `SyncCallError` on any use: every sync path of LangChain's OpenAI model reaches its
    client (`client.create`, `root_client.beta...`), so none of them goes anywhere else."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and friends probe for these: plain absence
            raise AttributeError(name)
        raise SyncCallError(MESSAGE)

    def __repr__(self) -> str:
        return "AsyncOnlyClient()"
