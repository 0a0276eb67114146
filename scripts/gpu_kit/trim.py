"""`trim`: repack flashinfer-python with what our kernels' JIT needs (every Python file, the header trees,
of its CUDA sources only the #include closure the probe finds) and METADATA without the dependencies of code
paths we never call; flashinfer/data/TRIMMED.json says what was done."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .console import say
from .probe import run_probe
from .wheel_files import norm, sha256, wheel_name, write_wheel

# flashinfer-python's dependencies that only code paths we never call import (cuDNN, CuTe-DSL, cuTile and
# NCCL kernels; `import flashinfer` itself needs none of them): the trimmed wheel does not declare them.
# cuda-python is a meta-package over cuda-bindings/-core/-pathfinder, which the GPU machine has.
DROPPED_REQUIRES = (
    "cuda-python",
    "cuda-tile",
    "nccl-extensions",
    "nccl4py",
    "nvidia-cudnn-frontend",
    "nvidia-cutlass-dsl",
)
TRIM_LABEL = "trim"  # local version label of the repacked wheel: 0.7.4+trim
SOURCE_SUFFIXES = {
    ".cu",
    ".cuh",
    ".h",
    ".hh",
    ".hpp",
    ".hxx",
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".inc",
    ".inl",
    ".jinja",
    ".ptx",
    ".cubin",
    ".fatbin",
    ".mlir",
}
# Header trees the JIT puts on its include path: kept whole (the closure of our kernels reaches most of them,
# and a header reached only under a macro the scan cannot see would otherwise be missing).
KEEP_WHOLE = (
    "flashinfer/data/include/",
    "flashinfer/data/cccl/",
    "flashinfer/data/cutlass/",
    "flashinfer/data/spdlog/",
)


def trimmed_metadata(text: str, version: str) -> tuple[str, list[str]]:
    out, dropped = [], []
    for line in text.split("\n"):
        if line.startswith("Version: "):
            line = f"Version: {version}"
        elif line.startswith("Requires-Dist: ") and "extra ==" not in line:
            req = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)", line)[1]
            if norm(req) in DROPPED_REQUIRES:
                dropped.append(line[len("Requires-Dist: ") :])
                continue
        out.append(line)
    return "\n".join(out), dropped


def cmd_trim(args) -> int:
    src = Path(args.wheel).resolve()
    out_dir = Path(args.out_dir).resolve()
    host = Path(args.host_site).resolve() if args.host_site else None
    name, version = wheel_name(src)
    if name != "flashinfer-python":
        raise SystemExit(f"trim takes flashinfer-python's wheel, not {src.name}")
    new_version = f"{version}+{TRIM_LABEL}"
    with tempfile.TemporaryDirectory(prefix="gpu-kit-full-") as tmp:
        say(f"trim: installing {src.name} into a scratch folder, to probe it")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-compile",
                "--no-index",
                "--target",
                tmp,
                str(src),
            ],
            check=True,
        )
        probe = run_probe(Path(tmp), host)
    needed = set(probe["files"])
    say(f"trim: {len(probe['specs'])} JIT specs, their closure reaches {len(needed)} files in the package")
    old_dist = f"flashinfer_python-{version}.dist-info"
    new_dist = f"flashinfer_python-{new_version}.dist-info"
    kept, dropped_files, dropped_bytes, dropped_requires = [], 0, 0, []
    csrc_kept = []
    with zipfile.ZipFile(src) as z:
        for info in z.infolist():
            fn = info.filename
            if info.is_dir() or fn == f"{old_dist}/RECORD":
                continue
            data = z.read(info)
            if fn.startswith(old_dist + "/"):
                info = zipfile.ZipInfo(new_dist + fn[len(old_dist) :])
                if fn.endswith("/METADATA"):
                    text, dropped_requires = trimmed_metadata(data.decode(), new_version)
                    data = text.encode()
                kept.append((info, data))
                continue
            suffix = Path(fn).suffix.lower()
            keep = (
                fn.startswith(KEEP_WHOLE)
                or fn in needed
                or (suffix not in SOURCE_SUFFIXES and not fn.startswith("flashinfer/data/csrc/"))
            )
            if keep:
                kept.append((info, data))
                if fn.startswith("flashinfer/data/csrc/"):
                    csrc_kept.append(fn)
            else:
                dropped_files += 1
                dropped_bytes += info.file_size
    missing = sorted(needed - {i.filename for i, _ in kept})
    if missing:
        raise SystemExit(f"trim: the probe needs files the wheel does not have: {missing[:10]}")
    manifest = {
        "source_wheel": src.name,
        "source_sha256": sha256(src),
        "version": new_version,
        "kept_whole": list(KEEP_WHOLE),
        "csrc_kept": sorted(csrc_kept),
        "dropped_files": dropped_files,
        "dropped_bytes": dropped_bytes,
        "dropped_requires_dist": dropped_requires,
        "probe": {k: probe[k] for k in ("flashinfer", "specs", "unresolved_includes", "macro_includes", "files_bytes")},
        "closure_files": sorted(needed),
    }
    info = zipfile.ZipInfo("flashinfer/data/TRIMMED.json")
    kept.append((info, (json.dumps(manifest, indent=1) + "\n").encode()))
    # dist-info last, as wheels have it
    kept.sort(key=lambda e: (e[0].filename.startswith(new_dist), e[0].filename))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"flashinfer_python-{new_version}-py3-none-any.whl"
    write_wheel(out, kept, new_dist)
    say(
        f"trim: {out.name}: {out.stat().st_size / 1e6:.1f} MB (from {src.stat().st_size / 1e6:.1f} MB); "
        f"dropped {dropped_files} files ({dropped_bytes / 1e6:.0f} MB unpacked) and Requires-Dist "
        f"{', '.join(dropped_requires)}"
    )
    return 0


def read_trimmed_manifest(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        return json.loads(z.read("flashinfer/data/TRIMMED.json"))
