"""The `tokenrouter` command (also `python -m tokenrouter`): generate, chat, pull, models,
label / train-router (train the router of a learned policy on a model pair), bench (routed
serving against the serving baselines) and eval (HumanEval pass@1 of several systems).

One module per command group registers its subcommands (`add_parsers`) and runs them (`run`);
`arguments` and `engine_setup` hold what the groups share. Errors a user can fix (bad arguments,
a missing model, a bad value) print one line and exit 2; an unexpected failure exits 1; Ctrl-C
exits 130.
"""

from .arguments import UsageError
from .command_line import build_parser, build_parsers, main
from .output import COLOURS, DIM, RESET

__all__ = ["COLOURS", "DIM", "RESET", "UsageError", "build_parser", "build_parsers", "main"]
