"""`verify-wheels`: the carried wheel set is the pinned one: one version of each distribution, each at its
pin (flashinfer as the trimmed copy of its pin), every RECORD true, and the recorded Requires-Dist lines
(gpu_wheels_requires.txt) those of the wheels."""

from __future__ import annotations

from pathlib import Path

from . import lists  # read through the module: a test points lists.REQUIRES at a copy
from .console import say
from .trim import TRIM_LABEL, read_trimmed_manifest
from .wheel_files import requires_lines, sha256, verify_record, wheel_metadata, wheel_name


def cmd_verify_wheels(args) -> int:
    wheels = sorted(Path(args.dir).glob("*.whl"))
    pins = lists.read_pins()
    problems = []
    by_name: dict[str, list[Path]] = {}
    for w in wheels:
        by_name.setdefault(wheel_name(w)[0], []).append(w)
    for name, ws in by_name.items():
        if len(ws) > 1:
            problems.append(f"{name}: {len(ws)} wheels ({', '.join(w.name for w in ws)}); keep one")
    for name, (version, digest) in pins.items():
        ws = by_name.get(name)
        if not ws:
            problems.append(f"{name}=={version}: no wheel (run scripts/gpu_wheels.sh)")
            continue
        w = ws[0]
        got = wheel_name(w)[1]
        if name == "flashinfer-python":
            man = read_trimmed_manifest(w)
            if got != f"{version}+{TRIM_LABEL}" or man["source_sha256"] != digest:
                problems.append(f"{w.name}: not the trimmed copy of the pinned {name}=={version}")
        elif got != version or sha256(w) != digest:
            problems.append(f"{w.name}: not the pinned {name}=={version} (version or sha256 differ)")
    for name in by_name:
        if name not in pins:
            problems.append(f"{by_name[name][0].name}: not pinned in {lists.PINS.name}")
    for w in wheels:
        problems += verify_record(w)
    recorded = lists.read_requires(lists.REQUIRES) if lists.REQUIRES.is_file() else {}
    for w in wheels:
        name, version = wheel_name(w)
        rec = recorded.get(name)
        lines = requires_lines(wheel_metadata(w))
        if rec is None or rec[0] != version or sorted(rec[1]) != sorted(lines):
            only_wheel = sorted(set(lines) - set(rec[1] if rec else []))
            only_record = sorted(set(rec[1] if rec else []) - set(lines))
            problems.append(
                f"{w.name}: {lists.REQUIRES.name} does not record its METADATA"
                + (f" (records version {rec[0]})" if rec and rec[0] != version else "")
                + (f"; only in the wheel: {only_wheel}" if only_wheel else "")
                + (f"; only in the record: {only_record}" if only_record else "")
                + f" (python -m scripts.gpu_kit record-requires {Path(args.dir)} rewrites it)"
            )
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        say(f"  {w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
    say(f"  {total / 2**20:8.2f} MiB  in {len(wheels)} wheels; RECORD checked in each")
    for p in problems:
        say(f"FAIL: {p}")
    return 1 if problems else 0
