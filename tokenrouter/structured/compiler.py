"""Compile response formats and tool choices into grammars over one engine's vocabulary."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable

from ..config import Grammar, JsonSchema, Regex, ResponseFormat
from ..errors import InvalidRequestError


class GrammarCompiler:
    """xgrammar's compiler for one vocabulary (every routed model shares it), built on first use:
    reading a 150k-token vocabulary takes about a second, which an engine that never constrains
    a request should not pay. Thread-safe; xgrammar caches each compiled grammar by its text."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Iterable[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self._lock = threading.Lock()
        self._compiler = None

    def _xgr(self):
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def compile(self, fmt: ResponseFormat, field: str = "response_format"):
        """The compiled grammar of a response format; an invalid one is an InvalidRequestError."""
        compiler = self._xgr()
        try:
            if isinstance(fmt, JsonSchema):
                schema = json.dumps(fmt.json_schema if fmt.json_schema is not None else {"type": "object"})
                if fmt.compact:
                    return compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
                return compiler.compile_json_schema(schema, any_whitespace=True)
            if isinstance(fmt, Regex):
                return compiler.compile_regex(fmt.pattern)
            if isinstance(fmt, Grammar):
                return compiler.compile_grammar(fmt.ebnf, root_rule_name=fmt.root)
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with the parser's message
            raise InvalidRequestError(field, f"does not compile: {_first_line(e)}") from None
        raise InvalidRequestError(field, f"unknown response format {type(fmt).__name__}")

    def compile_structural_tag(self, tag, field: str = "tool_choice"):
        """A structural tag (xgrammar's format for tool calls between free text)."""
        compiler = self._xgr()
        try:
            return compiler.compile_structural_tag(tag)
        except Exception as e:
            raise InvalidRequestError(field, f"does not compile: {_first_line(e)}") from None


def format_of(fmt: ResponseFormat):
    """A response format as an xgrammar structural-tag format, to combine with tool calls (a
    tool call OR the format): JSON Schema (compact as the format says), a regex, or a grammar
    whose root rule is `root`."""
    import xgrammar as xgr
    from xgrammar.structural_tag import GrammarFormat, JSONSchemaFormat, RegexFormat

    if isinstance(fmt, JsonSchema):
        schema = fmt.json_schema if fmt.json_schema is not None else {"type": "object"}
        if not fmt.compact:
            return JSONSchemaFormat(json_schema=schema)
        try:  # compact JSON has no structural-tag style of its own: its grammar, as `compile` makes it
            grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        except Exception as e:
            raise InvalidRequestError("response_format", f"does not compile: {_first_line(e)}") from None
        return GrammarFormat(grammar=str(grammar))
    if isinstance(fmt, Regex):
        return RegexFormat(pattern=fmt.pattern)
    if isinstance(fmt, Grammar):
        if fmt.root != "root":
            raise InvalidRequestError(
                "response_format", f"a grammar combined with tools needs its root rule named 'root', not {fmt.root!r}"
            )
        return GrammarFormat(grammar=fmt.ebnf)
    raise InvalidRequestError("response_format", f"unknown response format {type(fmt).__name__}")


_WHERE = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[08:02:42] /project/cpp/file.cc:94: "


def _first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return _WHERE.sub("", text.splitlines()[0])[:300]
