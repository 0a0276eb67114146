"""`ChatTokenRouter`: a LangChain chat model answered by the engine in this process.

It is LangChain's own OpenAI chat model (`BaseChatOpenAI`: message and tool conversion, tool
calls, structured output, streaming, usage) over `tokenrouter.openai`'s clients, so the OpenAI
protocol is implemented once, in `tokenrouter.openai`. What it adds: the clients (always ours,
never ones for api.openai.com), the engine's model name as the default, and the routing record,
which LangChain's OpenAI model drops as an unknown field, kept in `response_metadata["tokenrouter"]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai.chat_models.base import BaseChatOpenAI
from pydantic import Field, model_validator
from typing_extensions import Self

from ..api import Engine
from ..errors import EngineNotRunningError
from ..llm import LLM
from ..openai import async_client, client
from .async_only import AsyncOnlyClient

RECORD = "tokenrouter"  # the extension field's name, and the key in response_metadata


def served(engine) -> tuple[Engine, LLM | None]:
    """The engine behind `engine` (an `Engine` or an `LLM`), and the LLM if there is one."""
    if isinstance(engine, LLM):
        return engine.engine, engine
    if isinstance(engine, Engine):
        return engine, None
    raise ValueError(f"engine: must be a tokenrouter Engine or LLM, got {type(engine).__name__}")


def routing_record(response) -> dict | None:
    """The record on a completion or a stream chunk: as a dict, or an extension field the SDK kept."""
    if isinstance(response, dict):
        return response.get(RECORD) or (response.get("chunk") or {}).get(RECORD)  # a chunk event of .stream()
    return (getattr(response, "model_extra", None) or {}).get(RECORD)


class ChatTokenRouter(BaseChatOpenAI):
    """A LangChain chat model served by tokenrouter's engine, with token-level routing.

    >>> with LLM() as llm:
    ...     model = ChatTokenRouter(engine=llm, max_tokens=256)
    ...     reply = model.invoke("Write a haiku about routing.")
    ...     reply.response_metadata["tokenrouter"]  # {"tokens_per_model", "num_handoffs", "tokens_processed"}

    `engine` is an `LLM` (sync and async calls) or an `Engine` (async calls only: `ainvoke`,
    `astream`, ...; a sync call raises `SyncCallError`). `model` defaults to the policy's entry
    model; any name the engine serves is accepted, and the request is routed under the engine's
    policy whatever it names. The other arguments are `ChatOpenAI`'s (`temperature`, `max_tokens`,
    `stop`, `seed`, `model_kwargs`, `extra_body` for vLLM's extras, ...). `timeout` is the clients'
    read timeout, which the engine keeps (it aborts the request past it); `max_retries` defaults to
    0, as a retry runs the request again. `api_key`, `base_url`, proxies and HTTP clients are not
    used: nothing leaves the process.
    """

    engine: Any = Field(exclude=True)
    """The `Engine` or `LLM` that answers."""

    model_name: str | None = Field(default=None, alias="model")
    """A model the engine serves; None: the policy's entry model. The engine routes regardless."""

    stream_usage: bool | None = True
    """Usage on a stream's last chunk: the engine always counts it."""

    use_responses_api: bool | None = False
    """The engine answers Chat Completions only."""

    stream_chunk_timeout: float | None = Field(default=None, exclude=True)
    """None: the client's read timeout (`timeout`, openai's default 600 s) is the one bound on each
    chunk's wait, kept by the engine as a server keeps it, the request aborted past it. LangChain's
    default, 120 s, would cut a long prompt's prefill on a busy CPU."""

    @model_validator(mode="after")
    def validate_environment(self) -> Self:
        """Named as `BaseChatOpenAI`'s validator, so that it replaces it (pydantic keeps one validator
        per name): the clients are tokenrouter.openai's, never ones built for api.openai.com."""
        if self.n is not None and self.n < 1:
            raise ValueError("n must be at least 1.")
        if self.n is not None and self.n > 1 and self.streaming:
            raise ValueError("n must be 1 when streaming.")
        if self.use_responses_api:
            raise ValueError("use_responses_api: the engine answers Chat Completions only")
        engine, llm = served(self.engine)
        info = engine.info()
        if self.model_name is None:
            self.model_name = info.entry_model
        elif self.model_name not in info.models:
            raise ValueError(f"model: {self.model_name!r} is not served by the engine (it serves {list(info.models)})")
        options = {
            "timeout": self.request_timeout,
            "max_retries": self.max_retries,
            "default_headers": self.default_headers,
            "default_query": self.default_query,
        }
        options = {k: v for k, v in options.items() if v is not None}
        self.root_async_client = async_client(engine, **options)
        self.async_client = self.root_async_client.chat.completions
        if llm is None:
            self.root_client = self.client = AsyncOnlyClient()
        else:
            self.root_client = client(llm, **options)
            self.client = self.root_client.chat.completions
        return self

    @property
    def _llm_type(self) -> str:
        return "tokenrouter-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "tokenrouter"
        return params

    def _create_chat_result(self, response, generation_info: dict | None = None) -> ChatResult:
        """The completion's routing record beside its token usage: in `llm_output`, which LangChain
        merges into the message's `response_metadata` (with n > 1 it stays in `llm_output`)."""
        result = super()._create_chat_result(response, generation_info)
        record = routing_record(response)
        if record is not None and result.llm_output is not None:
            result.llm_output[RECORD] = record
        return result

    def _convert_chunk_to_generation_chunk(
        self, chunk: dict, default_chunk_class: type, base_generation_info: dict | None
    ) -> ChatGenerationChunk | None:
        """A stream's record comes on its last chunk, once: merged chunks carry it once."""
        generation = super()._convert_chunk_to_generation_chunk(chunk, default_chunk_class, base_generation_info)
        record = routing_record(chunk)
        if generation is not None and record is not None:
            generation.message.response_metadata[RECORD] = record
        return generation

    def get_token_ids(self, text: str) -> list[int]:
        """Tokens as the engine's entry model counts them (not tiktoken's, which fetches its tables)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        tokenizer = served(self.engine)[0].info().tokenizer
        if tokenizer is None:
            raise EngineNotRunningError("counting tokens needs the engine's tokenizer: start the engine first")
        return tokenizer.encode(text, add_special_tokens=False)

    def get_num_tokens_from_messages(
        self, messages: Sequence[BaseMessage], tools: Sequence | None = None, **kwargs: Any
    ) -> int:
        """LangChain's approximate count (each message's text) with the engine's tokenizer."""
        return BaseChatModel.get_num_tokens_from_messages(self, list(messages), tools)
