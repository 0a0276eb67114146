"""Tool calling: the tools a caller offers, and the calls parsed out of what the model wrote.

Tools are given in OpenAI's shape (`{"type": "function", "function": {"name", "description",
"parameters"}}`, or just the inner function dict) and rendered by the model's chat template.
The model's calls come back parsed by a `ToolCallParser` for its chat format; the first is the
Hermes format that Qwen2.5 uses (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`).
When the caller asks (`tool_choice="required"` or a named function), the calls are constrained
to the tools' JSON schemas with an xgrammar structural tag for the same format.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence

from ..errors import InvalidRequestError
from ..outputs import ToolCall

ToolChoice = str | Mapping
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
TOOL_CHOICES = ("auto", "none", "required")


def normalize_tools(tools) -> list[dict]:
    """The tools in OpenAI's full shape, checked: each a function with a unique valid name and,
    if given, a description string and a JSON Schema object for its parameters."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidRequestError("tools", f"must be a list of tool dicts, got {type(tools).__name__}")
    if not tools:
        raise InvalidRequestError("tools", "is empty; pass None for no tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidRequestError(where, f"must be a dict, got {type(tool).__name__}")
        if "function" in tool or "type" in tool:
            if tool.get("type") != "function":
                raise InvalidRequestError(f"{where}.type", f"must be 'function', got {tool.get('type')!r}")
            fn, where = tool.get("function"), f"{where}.function"
            if not isinstance(fn, Mapping):
                raise InvalidRequestError(where, "must be a dict with the function's name and parameters")
        else:
            fn = tool
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise InvalidRequestError(where, f"unknown key(s) {unknown}")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise InvalidRequestError(f"{where}.name", f"must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
        if name in seen:
            raise InvalidRequestError(f"{where}.name", f"{name!r} is given twice")
        seen.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise InvalidRequestError(f"{where}.description", "must be a string")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise InvalidRequestError(f"{where}.parameters", "must be a JSON Schema dict")
        entry = {"name": name, "parameters": dict(params)}
        if "description" in fn:
            entry["description"] = fn["description"]
        out.append({"type": "function", "function": entry})
    return out


def check_tool_choice(tool_choice: ToolChoice, tools: list[dict] | None) -> ToolChoice:
    """'auto', 'none', 'required', or {"type": "function", "function": {"name": NAME}} naming a given tool."""
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise InvalidRequestError(
                "tool_choice", f"must be one of {list(TOOL_CHOICES)} or a named function, got {tool_choice!r}"
            )
        if tool_choice == "required" and not tools:
            raise InvalidRequestError("tool_choice", "'required' needs tools")
        return tool_choice
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidRequestError(
                "tool_choice", 'a named choice is {"type": "function", "function": {"name": NAME}}'
            )
        names = [t["function"]["name"] for t in tools or []]
        if name not in names:
            raise InvalidRequestError("tool_choice", f"names {name!r}, which is not among the tools {names}")
        return {"type": "function", "function": {"name": name}}
    raise InvalidRequestError("tool_choice", f"must be a string or a dict, got {type(tool_choice).__name__}")


def constrains(tool_choice: ToolChoice) -> bool:
    """Whether the choice forces a tool call (and so is decoded under a grammar)."""
    return tool_choice == "required" or isinstance(tool_choice, Mapping)


class ToolCallParser:
    """One chat format's tool calls: how to find them in text, and the structural tag that
    constrains them. Subclass it for another format. `tool_names`: the tools offered. A format
    whose calls sit between an `open_tag` and a `close_tag` streams them (`ToolCallStream`)."""

    name = ""
    open_tag = ""
    close_tag = ""

    def __init__(self, tool_names: Sequence[str] = ()):
        self.tool_names = frozenset(tool_names)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(the text without the calls, the calls) of a model's answer."""
        raise NotImplementedError

    def parse_block(self, body: str) -> ToolCall | None:
        """The call between one open and close tag, or None where it is not one."""
        raise NotImplementedError

    def structural_tag(self, tools: list[dict], tool_choice: ToolChoice, parallel: bool = True, alternative=None):
        """An xgrammar structural tag: calls as `tool_choice` says, arguments under the tools'
        schemas; with `parallel` False at most one call; with `alternative` (an xgrammar format:
        a response format's) under "auto", either one or more calls or that format."""
        raise NotImplementedError


class HermesToolCallParser(ToolCallParser):
    """`<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`, as Qwen2.5's template asks.

    Small models often answer a tool request with the same JSON object in a ```json fence, or
    bare, instead (Qwen2.5-Coder-1.5B-Instruct does: tests/data/qwen25_tool_calls.json). An
    answer that is nothing but such an object, naming an offered tool, is read as that call."""

    name = "hermes"
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
    WHOLE = re.compile(r"^(?:```(?:json)?\s*)?(\{.*\})\s*(?:```)?$", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        whole = self.WHOLE.match(text.strip())
        if whole and "<tool_call>" not in text:
            call = _call_from_json(whole.group(1))
            if call is not None and call.name in self.tool_names:
                return "", [call]
        calls: list[ToolCall] = []
        kept: list[str] = []
        last = 0
        for m in self.BLOCK.finditer(text):
            call = self.parse_block(m.group(1))
            if call is None:  # not a call we can read: leave it in the text
                continue
            kept.append(text[last : m.start()])
            last = m.end()
            calls.append(call)
        kept.append(text[last:])
        return "".join(kept).strip(), calls

    def parse_block(self, body: str) -> ToolCall | None:
        return _call_from_json(body.strip())

    def structural_tag(self, tools: list[dict], tool_choice: ToolChoice, parallel: bool = True, alternative=None):
        import xgrammar as xgr
        from xgrammar.structural_tag import OrFormat, TagsWithSeparatorFormat

        # xgrammar's "qwen_3" format is this one (the Hermes block); no reasoning section. At most
        # one whitespace character between JSON tokens: a weak model may otherwise write spaces
        # until max_tokens (the reason response formats default to compact JSON).
        tag = xgr.get_model_structural_tag(
            "qwen_3", tools=tools, tool_choice=tool_choice, reasoning="disabled", max_whitespace_cnt=1
        )
        fmt = tag.format
        if tool_choice == "required" or (tool_choice == "auto" and alternative is not None):
            # calls only, one or more, one per line: no text around them (or, under "auto" with a
            # response format, the format instead: openai-agents sends its output type on every call)
            fmt = TagsWithSeparatorFormat(tags=fmt.tags, separator="\n", at_least_one=True)
        if not parallel and hasattr(fmt, "stop_after_first"):
            fmt = fmt.model_copy(update={"stop_after_first": True})
        if tool_choice == "auto" and alternative is not None:
            fmt = OrFormat(elements=[fmt, alternative])
        return xgr.StructuralTag(format=fmt)


class ToolCallStream:
    """A stream's text with its tool calls taken out as they close: text that may begin a call's
    open tag is held back until it does not, a call's block until its close tag, so a caller never
    sees a call's raw text, and each call comes whole (as OpenAI's servers stream them, one delta a
    call). What it streamed is what the output holds in the end (`finish`)."""

    def __init__(self, parser: ToolCallParser):
        self.parser = parser
        self.held = ""  # text not yet streamed: a possible open tag, or an open call's block
        self.content: list[str] = []  # the text streamed
        self.calls: list[ToolCall] = []

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        """(text to stream now, calls that closed) after `text`; `final`: the stream's end."""
        self.held += text
        out, calls = [], []
        open_tag, close_tag = self.parser.open_tag, self.parser.close_tag
        while self.held:
            start = self.held.find(open_tag)
            if start < 0:
                keep = 0 if final else _partial_suffix(self.held, open_tag)
                out.append(self.held[: len(self.held) - keep])
                self.held = self.held[len(self.held) - keep :]
                break
            out.append(self.held[:start])
            end = self.held.find(close_tag, start + len(open_tag))
            if end < 0:
                if final:  # a call never closed: it is text
                    out.append(self.held[start:])
                    self.held = ""
                else:
                    self.held = self.held[start:]
                break
            block = self.held[start : end + len(close_tag)]
            call = self.parser.parse_block(self.held[start + len(open_tag) : end])
            if call is None:
                out.append(block)  # not a call we can read: it stays text, as `parse` leaves it
            else:
                calls.append(call)
            self.held = self.held[end + len(close_tag) :]
        streamed = "".join(out)
        self.content.append(streamed)
        self.calls.extend(calls)
        return streamed, calls

    def finish(self, output) -> None:
        """Set the output's `content` and `tool_calls` to what was streamed; where no call was
        streamed, the parser's reading of the whole text (a bare JSON call, as small models write)."""
        if self.calls:
            output.content, output.tool_calls = "".join(self.content).strip(), list(self.calls)
        else:
            output.content, output.tool_calls = self.parser.parse(output.text)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _call_from_json(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"], arguments=args)


PARSERS: dict[str, type[ToolCallParser]] = {"hermes": HermesToolCallParser}


def parser_for(tokenizer, tools: list[dict]) -> ToolCallParser:
    """The parser of the chat format this tokenizer's template renders tools in."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str) or "tools" not in template:
        raise InvalidRequestError("tools", "this model's chat template does not render tools")
    if "<tool_call>" in template:
        return HermesToolCallParser([t["function"]["name"] for t in tools])
    raise InvalidRequestError(
        "tools", f"this model's chat template writes tool calls in a format without a parser (known: {sorted(PARSERS)})"
    )
