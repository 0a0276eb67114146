"""A `POST /chat/completions` body, checked and read into the engine's terms: the messages, a
`SamplingParams`, the tools and the tool choice, and what the answer should look like.

Every refusal is a 400 naming the field, as OpenAI's API names it. Fields the engine has no use
for (`store`, `user`, ...) are accepted and ignored, as vLLM does; fields it cannot honour
(`logit_bias`, audio, ...) are refused rather than silently dropped. An unknown field is
ignored with a warning: frameworks send fields newer than this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from ..api import ToolChoice
from ..config import Grammar, JsonSchema, Regex, SamplingParams
from .errors import api_error, bad_request

log = logging.getLogger(__name__)

IGNORED = frozenset(
    {
        "store",
        "metadata",
        "user",
        "reasoning_effort",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "verbosity",
    }
)
REFUSED = {
    "logit_bias": "token biases are not supported",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated functions API is not supported; use tools",
    "function_call": "the deprecated functions API is not supported; use tool_choice",
}
# SamplingParams fields a vLLM client sends at the top level of the body (`extra_body`)
SAMPLING_EXTRAS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
)
SAMPLING = ("temperature", "top_p", "seed", "stop", "n", "presence_penalty", "frequency_penalty", *SAMPLING_EXTRAS)
CONSTRAINTS = ("response_format", "guided_json", "guided_regex", "regex", "guided_grammar", "grammar")
KNOWN = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "stream"}
    | {"stream_options", "tools", "tool_choice", "parallel_tool_calls", "modalities"}
    | set(SAMPLING)
    | set(CONSTRAINTS)
)
_warned: set[str] = set()


@dataclass
class ChatRequest:
    """A checked request. `params.max_tokens` is the caller's, else None: the room the prompt
    leaves in the context and the KV pools (OpenAI's default; the engine works it out)."""

    model: str
    messages: list[dict]
    params: SamplingParams
    tools: list | None = None
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    renamed: dict[str, str] = field(default_factory=dict)  # SamplingParams' names -> the request's


def parse_chat_request(body) -> ChatRequest:
    """The request, or an `APIError` (400) naming the first field that is wrong."""
    if not isinstance(body, Mapping):
        raise bad_request(None, "the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # null is "not given", as OpenAI reads it
    for name, why in REFUSED.items():
        if name in body and body[name] not in ({}, []):
            raise bad_request(name, why)
    if body.get("modalities", ["text"]) != ["text"]:
        raise bad_request("modalities", f"only ['text'] is supported, got {body['modalities']!r}")
    for name in sorted(set(body) - KNOWN - IGNORED - set(REFUSED) - _warned):
        _warned.add(name)
        log.warning("chat.completions: ignoring the unknown field %r", name)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", "must be a model name")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("stream_options", "is only allowed with stream=true")
    if options is not None and not isinstance(options, Mapping):
        raise bad_request("stream_options", "must be an object")
    include_usage = _bool(options or {}, "include_usage", False, "stream_options.include_usage")
    logprobs = _bool(body, "logprobs", False)
    tools, tool_choice = _tools(body)
    kwargs, renamed = _sampling(body, logprobs)
    try:
        params = SamplingParams(**kwargs)
    except ValidationError as e:
        raise api_error(e, renamed) from None
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages")),
        params=params,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=_bool(body, "parallel_tool_calls", True),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        renamed=renamed,
    )


def _bool(body: Mapping, name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(param or name, f"must be true or false, got {value!r}")
    return value


def _messages(messages) -> list[dict]:
    """The conversation as the engine takes it: `developer` read as `system` (the role chat
    templates know; OpenAI treats them alike); content parts and tool-call argument strings go
    to the engine as they are, which reads them."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise bad_request(f"messages[{i}]", f"must be an object, got {type(m).__name__}")
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        if m.get("role") == "developer":
            m["role"] = "system"
        elif m.get("role") == "function":
            raise bad_request(f"messages[{i}].role", "the deprecated 'function' role is not supported; use 'tool'")
        out.append(m)
    return out


def _sampling(body: Mapping, logprobs: bool) -> tuple[dict, dict[str, str]]:
    """SamplingParams' keyword arguments, and which request field each came from where it differs."""
    kwargs = {name: body[name] for name in SAMPLING if name in body}
    renamed: dict[str, str] = {}
    if kwargs.get("top_k") == -1:  # vLLM's "disabled"
        kwargs["top_k"] = 0
    kwargs["max_tokens"] = None  # not given: the room left, as OpenAI and vLLM default it
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins, as in vLLM
        if name in body:
            kwargs["max_tokens"], renamed["max_tokens"] = body[name], name
            break
    top = body.get("top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("top_logprobs", "needs logprobs=true")
    if logprobs:
        kwargs["logprobs"] = 0 if top is None else top
        renamed["logprobs"] = "top_logprobs"
    given = [name for name in CONSTRAINTS if name in body]
    if len(given) > 1:
        raise bad_request(given[1], f"only one of {list(CONSTRAINTS)} may be given, got {given}")
    if given:
        try:
            kwargs["response_format"] = _constraint(given[0], body[given[0]])
        except ValidationError as e:  # an empty pattern, ...
            raise bad_request(given[0], e.errors()[0]["msg"]) from None
        renamed["response_format"] = given[0]
    return kwargs, renamed


def _constraint(name: str, value):
    """The engine's response format for `response_format` or a vLLM guided field."""
    if name in ("guided_regex", "regex"):
        if not isinstance(value, str):
            raise bad_request(name, "must be a regular expression string")
        return Regex(pattern=value)
    if name in ("guided_grammar", "grammar"):
        if not isinstance(value, str):
            raise bad_request(name, "must be an EBNF grammar string")
        return Grammar(ebnf=value)
    if name == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise bad_request(name, f"is not JSON: {e}") from None
        if not isinstance(value, Mapping):
            raise bad_request(name, "must be a JSON Schema object")
        return JsonSchema(json_schema=dict(value))
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonSchema(json_schema={"type": "object"})
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise bad_request("response_format.json_schema", "must be an object with the schema")
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, Mapping):
            raise bad_request("response_format.json_schema.schema", "must be a JSON Schema object")
        return JsonSchema(json_schema=None if schema is None else dict(schema))
    raise bad_request("response_format.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _tools(body: Mapping) -> tuple[list | None, ToolChoice]:
    """The tools offered and the engine's tool choice. `allowed_tools` offers only the tools it
    names, then decides as its mode says ("auto" or "required")."""
    tools = body.get("tools") or None  # [] is no tools, as vLLM reads it
    choice = body.get("tool_choice", "auto")
    if not isinstance(choice, Mapping) or choice.get("type") != "allowed_tools":
        return tools, choice
    allowed = choice.get("allowed_tools")
    where = "tool_choice.allowed_tools"
    if not isinstance(allowed, Mapping) or allowed.get("mode") not in ("auto", "required"):
        raise bad_request(f"{where}.mode", "must be 'auto' or 'required'")
    if not isinstance(tools, list):
        raise bad_request("tools", "allowed_tools needs tools")
    names = []
    for j, t in enumerate(allowed.get("tools") or []):
        fn = t.get("function") if isinstance(t, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else t.get("name") if isinstance(t, Mapping) else None
        if not isinstance(name, str):
            raise bad_request(f"{where}.tools[{j}]", 'must be {"type": "function", "function": {"name": NAME}}')
        names.append(name)
    if not names:
        raise bad_request(f"{where}.tools", "must name at least one tool")
    offered = {_tool_name(t): t for t in tools}
    missing = [n for n in names if n not in offered]
    if missing:
        raise bad_request(f"{where}.tools", f"names {missing}, which are not among the tools {list(offered)}")
    return [t for t in tools if _tool_name(t) in names], allowed["mode"]


def _tool_name(tool) -> str | None:
    if not isinstance(tool, Mapping):
        return None
    fn = tool.get("function", tool)
    return fn.get("name") if isinstance(fn, Mapping) else None
