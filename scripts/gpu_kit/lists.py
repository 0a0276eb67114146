"""The kit's lists, read and written: the pins (gpu_wheels.txt), the GPU machine's own packages
(gpu_machine.txt), the carried wheels' recorded requirements (gpu_wheels_requires.txt) and tokenrouter's own
(pyproject.toml). The offline checks read them; `record-requires` rewrites the record."""

from __future__ import annotations

import re
from pathlib import Path

from .console import say
from .wheel_files import norm, requires_lines, wheel_metadata, wheel_name

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "scripts" / "gpu_wheels.txt"
MACHINE = ROOT / "scripts" / "gpu_machine.txt"
REQUIRES = ROOT / "scripts" / "gpu_wheels_requires.txt"


def read_pins(path: Path = PINS) -> dict[str, tuple[str, str]]:
    """{normalized name: (version, sha256)} from a requirements file of `name==version --hash=sha256:...`."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})", line)
        if not m:
            raise SystemExit(f"{path}: cannot read {line!r}")
        pins[norm(m[1])] = (m[2], m[3])
    return pins


def read_machine(path: Path = MACHINE) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[norm(name)] = version
    return out


def read_requires(path: Path | None = None) -> dict[str, tuple[str, list[str]]]:
    """{normalized name: (the carried wheel's version, its Requires-* lines)} from the record (REQUIRES unless
    `path`): a `[name==version]` line, then that wheel's METADATA lines."""
    path = path or REQUIRES
    out: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)==(\S+)\]", line)
        if m:
            current = norm(m[1])
            out[current] = (m[2], [])
        elif current is None or not line.startswith(("Requires-Dist:", "Requires-Python:")):
            raise SystemExit(f"{path}: cannot read {line!r}")
        else:
            out[current][1].append(line)
    return out


def format_requires(wheels: list[Path]) -> str:
    lines = [
        "# The Requires-Python and Requires-Dist lines of each wheel the GPU kit carries, verbatim from its METADATA",
        "# (flashinfer's: the trimmed copy's). `gpu_kit complete` (tests/test_gpu_kit_complete.py, offline) reads",
        "# them; `gpu_kit verify-wheels` (gpu_wheels.sh, the dry run) checks them against the built wheels.",
        "# Written by `python -m scripts.gpu_kit record-requires .whl` after a pin changes.",
    ]
    for w in sorted(wheels, key=lambda w: wheel_name(w)[0]):
        name, version = wheel_name(w)
        lines += ["", f"[{name}=={version}]", *requires_lines(wheel_metadata(w))]
    return "\n".join(lines) + "\n"


def cmd_record_requires(args) -> int:
    REQUIRES.write_text(format_requires(sorted(Path(args.dir).glob("*.whl"))))
    say(f"wrote {REQUIRES.relative_to(ROOT)}")
    return 0


def project_requirements() -> tuple[str, list[str], dict[str, list[str]]]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["version"], project["dependencies"], project.get("optional-dependencies", {})
