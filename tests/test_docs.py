"""The runnable examples in docs/ run as written, and its generated reference is current."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run_example(heading: str, scratch: str, tmp_path) -> str:
    """Run the first python block after `heading` in docs/policies.md (its scratch directory
    moved under tmp_path); return what it printed."""
    section = (ROOT / "docs" / "policies.md").read_text().split(heading, 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1).replace(scratch, str(tmp_path))
    script = tmp_path / "example.py"
    script.write_text("import torch; torch.set_num_threads(1)\n" + code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_custom_policy_example_in_docs_runs(tmp_path):
    out = _run_example("## A complete custom policy", "/tmp/every_k", tmp_path)
    assert "['small', 'small', 'small', 'large', 'large', 'large'" in out


def test_verifying_policy_example_in_docs_runs(tmp_path):
    out = _run_example("## Verifying policies", "/tmp/draft_three", tmp_path)
    assert "'small'" in out and "'large'" in out  # both wrote accepted tokens


def test_the_configuration_reference_is_made_from_the_fields():
    """docs/sdk.md's tables of options are the fields' own defaults and descriptions, as
    `python -m tokenrouter.config.reference` writes them (run it after changing a field)."""
    from tokenrouter.config.reference import reference

    assert reference() in (ROOT / "docs" / "sdk.md").read_text(encoding="utf-8")


def test_the_command_reference_is_made_from_the_parser():
    """docs/cli.md's reference is every command's --help, as `python -m tokenrouter.cli.reference`
    writes it (run it after changing a flag)."""
    from tokenrouter.cli.reference import reference

    assert reference() in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


def test_engines_public_methods_are_documented_and_few():
    """docs/sdk.md's `Engine` section names every public method and property of `Engine`, and
    there are at most 14: the engine's own steps stay private, or with the part that owns them."""
    from tokenrouter import Engine

    public = sorted(
        name
        for name, member in vars(Engine).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    )
    section = (ROOT / "docs" / "sdk.md").read_text(encoding="utf-8").split("\n## `Engine`", 1)[1].split("\n## ", 1)[0]
    undocumented = [name for name in public if not re.search(rf"`{name}[`(]", section)]
    assert not undocumented, (
        f"public methods of Engine that docs/sdk.md's `Engine` section does not name: {undocumented}"
    )
    assert len(public) <= 14, f"Engine has {len(public)} public methods and properties, more than 14: {public}"
