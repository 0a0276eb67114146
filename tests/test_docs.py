"""The runnable examples in docs/ run as written."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_custom_policy_example_in_docs_runs(tmp_path):
    text = (ROOT / "docs" / "policies.md").read_text()
    section = text.split("## A complete custom policy", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    code = code.replace("/tmp/every_k", str(tmp_path))
    script = tmp_path / "example.py"
    script.write_text("import torch; torch.set_num_threads(1)\n" + code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "['small', 'small', 'small', 'large', 'large', 'large'" in done.stdout


def test_verifying_policy_example_in_docs_runs(tmp_path):
    text = (ROOT / "docs" / "policies.md").read_text()
    section = text.split("## Verifying policies", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    code = code.replace("/tmp/draft_three", str(tmp_path))
    script = tmp_path / "example.py"
    script.write_text("import torch; torch.set_num_threads(1)\n" + code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'small'" in done.stdout and "'large'" in done.stdout  # both wrote accepted tokens
