"""How a problem becomes a prompt, and a model's answer a program to test.

The prompt is EvalPlus's instruct prompt (the one the Qwen2.5-Coder report's HumanEval numbers
use): the problem in a code block, the model's chat template, and the assistant's answer already
opened with a sentence and "```python\\n". The model therefore starts writing code at once and
stops at the closing fence (a stop string): no tokens spent on prose, which halves a CPU run.

The answer is a full definition (usually) or only a function body. The program run is:

- full definition: problem prompt + the answer's code + test + `check(entry_point)`. The prompt's
  docstring-only stub is valid Python and keeps the imports and helper functions some problems
  define there; the answer's definition replaces the stub. Only the answer's imports, function
  and class definitions and assignments are kept (EvalPlus's "sanitize" does the same): example
  calls, prints and `if __name__ == "__main__":` blocks are not what is tested, and may block
  on input or run long.
- a body (indented lines, no definition of the entry point): problem prompt + body + test, the
  way HumanEval's own completions are run.

`PROMPT_VERSION` changes whenever any of this does: a results file of another version is not
resumed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..api import chat_ids
from .data import Problem

PROMPT_VERSION = 1
INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
)
RESPONSE_PREFIX = (
    "Below is a Python script with a self-contained function that solves the problem and passes "
    "corresponding tests:\n```python\n"
)
FENCE = "```"
STOP = [FENCE]  # the closing fence ends the answer


def messages(problem: Problem) -> list[dict]:
    return [{"role": "user", "content": f"{INSTRUCTION}\n```\n{problem.prompt.strip()}\n```\n"}]


def prompt_ids(tokenizer, problem: Problem) -> list[int]:
    """The chat template with the generation prompt (the package's one renderer), then the
    assistant's opened answer."""
    return chat_ids(tokenizer, messages(problem)) + list(tokenizer.encode(RESPONSE_PREFIX, add_special_tokens=False))


@dataclass(frozen=True)
class Program:
    code: str  # what the sandbox runs
    mode: str  # "definition" or "body"


def extract_code(completion: str) -> str:
    """The code of an answer that began inside "```python": up to a closing fence if one is left
    (the stop string normally cuts it), without a repeated opening fence."""
    text = completion
    stripped = text.lstrip()
    if stripped.startswith(FENCE):  # the model opened another block
        text = stripped.split("\n", 1)[1] if "\n" in stripped else ""
    return text.split(FENCE, 1)[0]


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def sanitize(code: str, tree: ast.Module) -> str:
    """The top-level imports, definitions (with their decorators) and assignments, as written."""
    lines = code.splitlines()
    kept = []
    for node in tree.body:
        if isinstance(node, KEEP):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            kept.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n".join(kept) + "\n"


def build_program(problem: Problem, completion: str) -> Program:
    """The program that tests an answer (see the module docstring)."""
    code = extract_code(completion)
    harness = f"\n{problem.test}\n\ncheck({problem.entry_point})\n"
    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = None
    if tree is not None and _defines(tree, problem.entry_point):
        return Program(f"{problem.prompt}\n{sanitize(code, tree)}{harness}", "definition")
    first = next((line for line in code.splitlines() if line.strip()), "")
    if first[:1] in (" ", "\t"):  # a body that continues the prompt's signature
        return Program(f"{problem.prompt}{code}{harness}", "body")
    # Neither: run it as written after the prompt (a syntax error or a missing function fails there).
    return Program(f"{problem.prompt}\n{code}{harness}", "definition")
