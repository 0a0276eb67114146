"""`resolve`: pip's resolver, offline, for the GPU machine's Python and platform, over the carried wheels
and metadata-only stand-ins for the machine's own packages: tokenrouter[gpu] and every carried wheel
resolve, and each carried wheel is the one used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .console import say
from .lists import project_requirements, read_machine
from .wheel_files import norm, stand_in_wheel, wheel_name

PY_TAGS = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def cmd_resolve(args) -> int:
    """pip install --dry-run, offline, for the GPU machine's tags: tokenrouter[gpu] and every carried wheel,
    from the carried wheels plus stand-ins (metadata only) for the packages the machine already has."""
    wheel_dir = Path(args.dir).resolve()
    carried = {wheel_name(w)[0]: wheel_name(w)[1] for w in wheel_dir.glob("*.whl")}
    machine = read_machine()
    shadowed = sorted(set(carried) & set(machine))
    version, deps, extras = project_requirements()
    with tempfile.TemporaryDirectory(prefix="gpu-kit-resolve-") as tmp:
        stand = Path(tmp) / "machine"
        stand.mkdir()
        for name, v in machine.items():
            if name not in carried:  # a carried wheel shadows the machine's copy (PYTHONPATH comes first)
                stand_in_wheel(stand, name, v)
        stand_in_wheel(stand, "tokenrouter", version, deps, {"gpu": extras.get("gpu", [])})
        report = Path(tmp) / "report.json"
        wanted = [f"tokenrouter[gpu]=={version}"] + [f"{n}=={v}" for n, v in sorted(carried.items())]
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--find-links",
            str(wheel_dir),
            "--find-links",
            str(stand),
            "--only-binary=:all:",
            *PY_TAGS,
            *[f"--platform={p}" for p in PLATFORMS],
            "--target",
            str(Path(tmp) / "target"),
            "--report",
            str(report),
            "--quiet",
            "--disable-pip-version-check",
            *wanted,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
        if proc.returncode != 0:
            say(f"FAIL: pip's resolver (offline, Python 3.12 manylinux) cannot satisfy the set:\n{proc.stderr[-4000:]}")
            return 1
        installs = json.loads(report.read_text())["install"]
    chosen = {norm(i["metadata"]["name"]): (i["metadata"]["version"], i["download_info"]["url"]) for i in installs}
    problems = []
    for name, v in carried.items():
        if name not in chosen or str(wheel_dir) not in chosen[name][1]:
            problems.append(f"{name}=={v} is carried but the resolution does not use it")
    from_machine = sorted(n for n, (_, url) in chosen.items() if str(stand) in url and n != "tokenrouter")
    say(
        f"pip's resolver (offline; Python 3.12, manylinux x86_64): tokenrouter[gpu] and the {len(carried)} carried "
        f"wheels resolve; from the carried wheels: {', '.join(sorted(carried))}; from the machine's own "
        f"packages: {', '.join(from_machine)}"
        + (f"; carried over the machine's copy: {', '.join(shadowed)}" if shadowed else "")
    )
    for p in problems:
        say(f"FAIL: {p}")
    return 1 if problems else 0
