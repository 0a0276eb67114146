"""Turn what a caller passes as a prompt into token ids, validating it on the way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ContextLengthExceededError, InvalidRequestError

ChatMessage = Mapping[str, object]
Prompt = str | Sequence[int] | Sequence[ChatMessage]

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def _check_text(field: str, text: str) -> None:
    """Text must be encodable as UTF-8 and free of NUL; other control characters (tab, newline,
    ANSI escapes, ...) are ordinary text and pass."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(field, f"is not valid Unicode (character {e.start} is a lone surrogate)") from e
    nul = text.find("\x00")
    if nul >= 0:
        raise InvalidRequestError(field, f"contains a NUL character (at {nul}); is it binary data?")


def _check_messages(messages: Sequence[ChatMessage]) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequestError(f"prompt[{i}]", f"a chat message must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidRequestError(
                f"prompt[{i}].role", f"unknown role {role!r}; expected one of {sorted(CHAT_ROLES)}"
            )
        content = m.get("content")
        if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
            _text_parts(f"prompt[{i}].content", content)
        elif not isinstance(content, str) and not (role == "assistant" and content is None):
            raise InvalidRequestError(f"prompt[{i}].content", "must be a string or a list of text parts")
        if isinstance(content, str):
            _check_text(f"prompt[{i}].content", content)
        calls = m.get("tool_calls")
        if calls is not None:
            _check_tool_calls(f"prompt[{i}].tool_calls", role, calls)


def _text_parts(field: str, parts: Sequence) -> str:
    """A content given as parts (OpenAI's `[{"type": "text", "text": ...}]`), checked, as one
    string: the parts joined as they come (OpenAI concatenates them)."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"a {kind!r} part" if isinstance(kind, str) else f"{type(part).__name__}"
            raise InvalidRequestError(
                f"{field}[{j}]", f'must be a text part {{"type": "text", "text": ...}}, not {what}'
            )
        _check_text(f"{field}[{j}].text", part["text"])
        texts.append(part["text"])
    return "".join(texts)


def template_messages(messages: Sequence[Mapping]) -> list[dict]:
    """The messages as chat templates read them: content given as text parts joined into one
    string, and a tool call's `arguments` given as a JSON string (as OpenAI's clients send them)
    parsed into the object a template writes out; otherwise as given."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), Sequence) and not isinstance(m["content"], str):
            m["content"] = "".join(part["text"] for part in m["content"])
        if m.get("tool_calls"):
            m["tool_calls"] = [_arguments_as_object(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _arguments_as_object(call: Mapping) -> dict:
    import json

    call, fn = dict(call), dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass  # not JSON: the template writes the string as it is
    call["function"] = fn
    return call


def _check_tool_calls(field: str, role: str, calls) -> None:
    """An assistant message's earlier tool calls, in OpenAI's shape (`ToolCall.to_dict()`)."""
    if role != "assistant":
        raise InvalidRequestError(field, f"only assistant messages carry tool calls, not {role!r}")
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise InvalidRequestError(field, "must be a list")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidRequestError(
                f"{field}[{j}]", 'must be {"type": "function", "function": {"name", "arguments"}}'
            )
        if not isinstance(fn.get("arguments"), (Mapping, str)):
            raise InvalidRequestError(f"{field}[{j}].function.arguments", "must be a dict or a JSON string")


def chat_ids(tokenizer, messages: Sequence[Mapping], tools: list[dict] | None = None) -> list[int]:
    """Chat messages (and the tools offered, if any) rendered by the tokenizer's chat template,
    with the generation prompt: the one way every part of the package turns a conversation into
    token ids."""
    return [
        int(i)
        for i in tokenizer.apply_chat_template(
            template_messages(messages), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    ]


def encode_prompt(
    tokenizer, prompt: Prompt, vocab_size: int, max_model_len: int, tools: list[dict] | None = None
) -> list[int]:
    """Token ids for a string, a list of token ids, or a list of chat messages.

    Chat messages are rendered with the tokenizer's chat template, with the generation prompt
    and, if given, the tools (which need chat messages).
    """
    if tools is not None and not (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and len(prompt) > 0
        and isinstance(prompt[0], Mapping)
    ):
        raise InvalidRequestError("tools", "need a prompt of chat messages (the chat template renders them)")
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt", "is empty")
        _check_text("prompt", prompt)
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        raise InvalidRequestError("prompt", "must be str, not bytes; decode it first")
    elif isinstance(prompt, Sequence):
        if len(prompt) == 0:
            raise InvalidRequestError("prompt", "is empty")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if t < 0 or t >= vocab_size]
            if bad:
                raise InvalidRequestError("prompt", f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        elif isinstance(prompt[0], Mapping):
            _check_messages(prompt)  # names the first message that is not a dict
            if getattr(tokenizer, "chat_template", None) is None:
                raise InvalidRequestError("prompt", "chat messages need a chat template, and this tokenizer has none")
            ids = chat_ids(tokenizer, prompt, tools)
        else:
            i, t = next((i, t) for i, t in enumerate(prompt) if isinstance(t, bool) or not isinstance(t, int))
            raise InvalidRequestError(
                "prompt",
                f"a list prompt must be all token ids (int) or all chat messages (dict); "
                f"item {i} is {type(t).__name__}",
            )
    else:
        raise InvalidRequestError(
            "prompt", f"must be a str, a list of token ids or chat messages, got {type(prompt).__name__}"
        )
    if not ids:
        raise InvalidRequestError("prompt", "encodes to zero tokens")
    if len(ids) >= max_model_len:
        raise ContextLengthExceededError(
            "prompt", f"is {len(ids)} tokens; the model's context holds {max_model_len}, leaving no room to generate"
        )
    return ids
