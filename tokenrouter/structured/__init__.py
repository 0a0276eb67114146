"""Structured output: constraining what a request may write, with xgrammar.

- `compiler.py`: the caller's side. A response format (JSON Schema, regex, EBNF) or a tool
  choice becomes a compiled grammar, once per engine and text (xgrammar caches compilations),
  before the request reaches a worker, so a bad schema fails the request and nothing else.
- `matcher.py`: a worker's side. Each worker keeps its own matcher per constrained request and
  rebuilds its state from the tokens it knows, so the constraint follows the request across
  hand-offs (it advances over a catch-up's tokens) and rolls back with rejected drafts.
"""

from .compiler import GrammarCompiler, format_of
from .matcher import MAX_ROLLBACK, GrammarState

__all__ = ["GrammarCompiler", "GrammarState", "MAX_ROLLBACK", "format_of"]
