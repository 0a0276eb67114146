"""scripts/check_promises.py stays current: every text it mutates is in its file exactly once
(a refactor that moves the code must move the mutation too, or the script reports it stale)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mutations():
    spec = importlib.util.spec_from_file_location("check_promises", ROOT / "scripts" / "check_promises.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module.MUTATIONS


@pytest.mark.parametrize("m", _mutations(), ids=lambda m: m.name)
def test_each_mutation_applies_once(m):
    assert (ROOT / m.path).read_text().count(m.old) == 1, f"{m.name}: not exactly once in {m.path}"
    for arg in m.tests:
        if arg.startswith("tests/"):
            assert (ROOT / arg.split("::")[0]).is_file(), arg
