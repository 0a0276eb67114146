"""A benchmark script run as `python benchmarks/<topic>/<script>.py ARGS` would run it, but in this
process: a Python started per script costs ~2 s of imports (torch, transformers), which the smoke
runs share this way. What a script sets for the whole process (sys.argv, sys.path, environment
variables, torch's threads) is put back after it."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import torch


def run_script(path: Path, args: list[str]) -> int | str:
    """The script's exit status: 0 when it returns or exits 0, else its `sys.exit` code or message."""
    saved_argv, saved_path, saved_env, threads = sys.argv[:], sys.path[:], dict(os.environ), torch.get_num_threads()
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
        return 0
    except SystemExit as e:
        return 0 if e.code is None else e.code
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
