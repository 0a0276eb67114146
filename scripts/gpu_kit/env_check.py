"""`check-env`, the env stage: the versions, the GPU, and every requirement of tokenrouter[gpu] and of each
carried wheel met by what this interpreter imports. Only the standard library at the top: it runs before
anything is checked to be installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .console import say
from .lists import project_requirements
from .wheel_files import wheel_name


def cmd_check_env(args) -> int:
    """Versions, the GPU, and whether every requirement of tokenrouter[gpu] and of each carried wheel is met
    by what this interpreter imports (the carried wheels in PYTHONPATH first, then the machine's own)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    problems, report = [], {"python": sys.version.split()[0]}
    _, deps, extras = project_requirements()
    reqs = [("tokenrouter", r) for r in deps + extras.get("gpu", [])]
    for w in sorted(Path(args.wheels).glob("*.whl")):
        name = wheel_name(w)[0]
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            problems.append(f"{name}: carried but not installed")
            continue
        if args.site and not str(dist.locate_file("")).startswith(str(Path(args.site).resolve())):
            problems.append(f"{name}: imported from {dist.locate_file('')}, not from {args.site}")
        reqs += [(name, r) for r in dist.requires or []]
    for owner, text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{owner} requires {text}: not installed")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{owner} requires {text}: {req.name} {have} is installed")
    for name in (
        "torch",
        "transformers",
        "triton",
        "tokenizers",
        "safetensors",
        "accelerate",
        "numpy",
        "anyio",
        "packaging",
        "typing-extensions",
        "ninja",
        "flashinfer-python",
        "apache-tvm-ffi",
        "xgrammar",
        "pydantic",
    ):
        try:
            report[name] = md.version(name)
        except md.PackageNotFoundError:
            report[name] = None
    try:
        import torch

        report["torch_cuda"] = torch.version.cuda
        report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        report["capability"] = list(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None
        if not torch.cuda.is_available():
            problems.append("torch sees no CUDA device")
    except Exception as e:  # noqa: BLE001 - reported, not raised
        problems.append(f"torch: {type(e).__name__}: {e}")
    for tool, cmd in (
        ("nvcc", ["nvcc", "--version"]),
        ("nvidia-smi", ["nvidia-smi", "-L"]),
        ("ninja", ["ninja", "--version"]),
    ):
        try:
            report[tool] = (
                subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[-1]
            )
        except (OSError, subprocess.SubprocessError, IndexError) as e:
            report[tool] = None
            problems.append(f"{tool}: {e}")
    report["problems"] = problems
    say(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    for p in problems:
        say(f"FAIL: {p}")
    return 1 if problems else 0
