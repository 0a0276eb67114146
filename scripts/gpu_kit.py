#!/usr/bin/env python3
"""The GPU kit's helper: build the wheel set on a CPU machine, check it there, and run the GPU-side steps.

docs/gpu.md says how the pieces fit. scripts/gpu_wheels.sh and scripts/gpu_check.sh call:

  trim WHEEL OUT_DIR     repack flashinfer-python with what our kernels' JIT needs: every Python file, the
                         header trees, and of its CUDA sources only the #include closure of our kernels
                         (from `probe` over the full wheel); METADATA without the dependencies of code paths
                         we never call; a fresh RECORD; flashinfer/data/TRIMMED.json says what was done
  probe SITE             (needs SITE's flashinfer importable) generate our kernels' JIT specs on CPU: their
                         sources, ninja files and #include closure; prints JSON
  check-trimmed SITE     probe the installed trimmed copy: every file the closure reaches is there, and no
                         #include is unresolved that was not unresolved (a CUDA toolkit header) in the full one
  verify-wheels DIR      each wheel's RECORD matches its files; one version per distribution; the pins hold
  resolve DIR            pip's resolver, offline, over the carried wheels and stand-ins for the GPU machine's
                         own packages: every Requires-Dist of tokenrouter[gpu] and of each wheel is met
  travel-size            bytes of what a device `run` sends: the working tree plus the carried paths
  check-env              (GPU) versions, the GPU, and every requirement met by what is importable
  complete               (no wheel, no network) every requirement of tokenrouter, of [gpu] and of each carried
                         wheel (as scripts/gpu_wheels_requires.txt records them) is met by the GPU machine's
                         packages (scripts/gpu_machine.txt) or the kit's pins (scripts/gpu_wheels.txt)
  record-requires DIR    rewrite scripts/gpu_wheels_requires.txt from the wheels' METADATA (verify-wheels checks it)
  max-jobs               how many nvcc jobs the JIT may run at once: the cores, fewer if memory is short
  preflight              (GPU) a pinned allocation, a one-kernel CUDA graph captured and replayed on a side
                         stream, and `import flashinfer`; exit 0 all well, 1 a CUDA part failed, 2 flashinfer
  warm --part fa2|fa3    (GPU) build one part of our flashinfer kernels in one parallel ninja run, then load it:
                         fa2 the page append and FA2 (decode, short prefill), fa3 FA3 (prefill rows over 64)
  jit-report             (GPU) the flashinfer modules built so far, and any the warm-up did not foresee
  summary                (GPU) the summary JSON: stages, their times, the attention backend, the results

Only the standard library is imported at the top: check-env and summary run before anything is installed.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "gpu_wheels.txt"
MACHINE = ROOT / "scripts" / "gpu_machine.txt"
REQUIRES = ROOT / "scripts" / "gpu_wheels_requires.txt"
# PEP 508 marker values of the GPU machine (CPython 3.12, Linux x86_64), for the offline completeness check
TARGET_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "os_name": "posix",
    "platform_release": "",
    "platform_version": "",
}
TRAVEL_LIMIT = 64 << 20  # bytes a device `run` may send (working tree + carried paths)
COMMAND_LIMIT = 2000  # characters of a device `run` command
PY_TAGS = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]

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
# The attention kernels tokenrouter's flashinfer backend asks for (engine/attention/flashinfer_paged.py): bfloat16
# queries and pages, int32 indices, no positional encoding in the kernel, no logit soft cap. (head_dim,
# sliding window) of the models the kit runs: the gpu tests' pair (64, with and without a window) and the
# demo pair's shapes (small 64, large 128, no window). Decode runs on tensor cores (GQA groups >= 4; bf16
# decode then always takes FA2's prefill module, flashinfer/decode.py). Prefill, under flashinfer 0.7.4's
# rule (BatchPrefillWithPagedKVCacheWrapper._determine_auto_backend): FA3 on Hopper, except that a step whose
# longest query row is 64 tokens or fewer runs FA2. The gpu tests' windowed step has rows of at most 5 tokens,
# and the demo pair has no window: FA3 with a window never runs, so it is not built. Stage jit-fa2 builds
# WARM_FA2 (decode and short prefill rows; without it the run falls back to torch), then jit-fa3 WARM_FA3
# (rows over 64 tokens: the engine's load-time self-test, the benchmarks' prompts; without it prefill is
# forced to FA2, prefill_backend="fa2", and FA3 is never asked for).
WARM_FA2 = [(64, False), (64, True), (128, False)]
WARM_FA3 = [(64, False), (128, False)]
# Peak resident memory of one nvcc job of the JIT, measured here (nvcc 13.0.88, the JIT's flags for sm_90a,
# head_dim 128): an FA3 kernel instantiation 3.5 GiB, FA3's batch_prefill_sm90.cu 1.7 GiB, an FA2 kernel
# 0.46 GiB. `max-jobs` allows 4 GiB a job and keeps MEM_RESERVE free for the random-weight pair written beside.
NVCC_JOB_BYTES = 4 << 30
MEM_RESERVE = 16 << 30
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
MACRO_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]+[A-Za-z_]", re.M)


def say(*a) -> None:
    print(*a, flush=True)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- pins ---------------------------------------------------------------------------------------------
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


def wheel_name(path: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-")
    return norm(parts[0]), parts[1]


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # Python 3.11+: both machines of the kit


# ---- completeness, offline ---------------------------------------------------------------------------
def requires_lines(metadata: str) -> list[str]:
    """The Requires-Python and Requires-Dist lines of a METADATA file's header, verbatim."""
    header = metadata.split("\n\n", 1)[0]
    return [ln.strip() for ln in header.splitlines() if ln.startswith(("Requires-Dist:", "Requires-Python:"))]


def wheel_metadata(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(names) != 1:
            raise SystemExit(f"{path.name}: {len(names)} METADATA files")
        return z.read(names[0]).decode()


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
        "# (flashinfer's: the trimmed copy's). `gpu_kit.py complete` (tests/test_gpu_kit_complete.py, offline) reads",
        "# them; `gpu_kit.py verify-wheels` (gpu_wheels.sh, the dry run) checks them against the built wheels.",
        "# Written by `python scripts/gpu_kit.py record-requires .whl` after a pin changes.",
    ]
    for w in sorted(wheels, key=lambda w: wheel_name(w)[0]):
        name, version = wheel_name(w)
        lines += ["", f"[{name}=={version}]", *requires_lines(wheel_metadata(w))]
    return "\n".join(lines) + "\n"


def cmd_record_requires(args) -> int:
    REQUIRES.write_text(format_requires(sorted(Path(args.dir).glob("*.whl"))))
    say(f"wrote {REQUIRES.relative_to(ROOT)}")
    return 0


def check_complete(
    deps: list[str],
    gpu: list[str],
    pins: dict[str, tuple[str, str]],
    machine: dict[str, str],
    recorded: dict[str, tuple[str, list[str]]],
) -> tuple[list[str], dict[str, str]]:
    """(problems, {name: "kit VERSION" or "machine VERSION"}): every requirement of tokenrouter (`deps`), of its
    [gpu] extra and, transitively, of each carried wheel (its recorded Requires-Dist, with the extras asked for),
    markers evaluated for the GPU machine, is met by a carried wheel (the kit's pins; it shadows the machine's
    copy) or by the machine's own package, at a version the specifier allows. The machine's own packages are
    taken as installed consistently (their dependencies are not followed)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    problems: list[str] = []
    carried: dict[str, str] = {}
    for name, (version, _) in pins.items():
        rec = recorded.get(name)
        if rec is None:
            problems.append(f"{name}=={version} is pinned, but {REQUIRES.name} does not record its Requires-Dist")
            carried[name] = version
            continue
        if Version(rec[0]).public != Version(version).public:
            problems.append(f"{name}: {REQUIRES.name} records version {rec[0]}, {PINS.name} pins {version}")
        carried[name] = rec[0]
    problems += [f"{n}: recorded in {REQUIRES.name} but not pinned in {PINS.name}" for n in recorded if n not in pins]
    met: dict[str, str] = {}
    todo = [("tokenrouter", r, ()) for r in deps] + [("tokenrouter[gpu]", r, ()) for r in gpu]
    expanded: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        owner, text, owner_extras = todo.pop(0)
        req = Requirement(text)
        if req.marker is not None and not any(
            req.marker.evaluate({**TARGET_MARKERS, "extra": e}) for e in ("", *owner_extras)
        ):
            continue
        name = norm(req.name)
        if name in carried:
            have, where = carried[name], "kit"
        elif name in machine:
            have, where = machine[name], "machine"
        else:
            problems.append(
                f"{owner} requires {text}: neither the GPU machine ({MACHINE.name}) nor the kit ({PINS.name}) has "
                f"{req.name}"
            )
            continue
        met[name] = f"{where} {have or '(version not recorded)'}"
        if req.specifier:
            if not have:
                problems.append(f"{owner} requires {text}: the machine's {name} version is not recorded")
            elif not req.specifier.contains(have, prereleases=True):
                problems.append(f"{owner} requires {text}: the {where} has {name} {have}")
        key = (name, tuple(sorted(req.extras)))
        if where != "kit" or key in expanded or name not in recorded:
            continue
        expanded.add(key)
        for line in recorded[name][1]:
            field, _, value = line.partition(":")
            value = value.strip()
            if field == "Requires-Python":
                if not SpecifierSet(value).contains(TARGET_MARKERS["python_full_version"]):
                    problems.append(f"{name} {have} requires Python {value}: the machine has 3.12")
            else:
                todo.append((name, value, key[1]))
    return problems, met


def cmd_complete(args) -> int:
    _, deps, extras = project_requirements()
    problems, met = check_complete(deps, extras.get("gpu", []), read_pins(), read_machine(), read_requires())
    kit = sorted(n for n, w in met.items() if w.startswith("kit"))
    say(
        f"complete (offline; Python 3.12 Linux x86_64): {len(met)} distributions needed by tokenrouter[gpu] and the "
        f"carried wheels; from the kit: {', '.join(kit)}; the rest from the machine"
    )
    for p in problems:
        say(f"FAIL: {p}")
    return 1 if problems else 0


# ---- the JIT probe (CPU) ------------------------------------------------------------------------------
def probe_specs():
    """Every module whose sources the trimmed wheel keeps: the warm set, plus the FA2 variants flashinfer may
    pick instead (runtime and independent strides) and the CUDA-core decode kernel (GQA groups under 4)."""
    import torch
    from flashinfer.jit.attention import modules as m
    from flashinfer.jit.page import gen_page_module

    bf = torch.bfloat16
    specs = [gen_page_module()]
    for head_dim in (64, 128):
        for window in (False, True):
            a = (bf, bf, bf, torch.int32, head_dim, head_dim, 0, window, False, False)
            specs += [
                m._gen_batch_prefill_primary_module("fa2", *a),
                m.gen_batch_prefill_module("fa2", *a),
                m._gen_batch_prefill_independent_paged_module("fa2", *a),
                m._gen_batch_prefill_independent_full_module("fa2", *a),
                m.gen_batch_prefill_module("fa3", *a),
                m.gen_batch_decode_module(*a[:-1]),
            ]
    return specs


def warm_specs(part: str, device=None, prefill_backend: str | None = None):
    """The modules the engine builds on this device, by part. "fa2": the page append and FA2's module for
    each of WARM_FA2 (tensor-core decode, prefill rows of 64 tokens or fewer, all prefill off Hopper). "fa3":
    FA3's module for each of WARM_FA3 where flashinfer picks FA3 for `device` (Hopper); without a device,
    `prefill_backend` says whether it does (the CPU probe: "fa3", the H200's)."""
    import torch
    from flashinfer.jit.attention import modules as m
    from flashinfer.jit.page import gen_page_module
    from flashinfer.utils import determine_attention_backend

    bf = torch.bfloat16

    def args(head_dim, window):
        return (bf, bf, bf, torch.int32, head_dim, head_dim, 0, window, False, False)

    if part == "fa2":
        return [gen_page_module()] + [m._gen_batch_prefill_primary_module("fa2", *args(*c)) for c in WARM_FA2]
    if part != "fa3":
        raise ValueError(f"part is fa2 or fa3, not {part!r}")
    specs = []
    for head_dim, window in WARM_FA3:
        backend = prefill_backend
        if device is not None:
            backend = determine_attention_backend(
                device, 0, False, False, bf, bf, head_dim_qk=head_dim, head_dim_vo=head_dim
            )
        if backend == "fa3":
            specs.append(m.gen_batch_prefill_module("fa3", *args(head_dim, window)))
    return specs


def include_dirs(spec, cuda_home: str) -> list[Path]:
    from flashinfer.jit.cpp_ext import build_common_cflags

    dirs = []
    for flag in build_common_cflags(cuda_home, spec.extra_include_dirs):
        flag = flag.replace("$cuda_home", cuda_home)
        for prefix in ("-isystem ", "-I"):
            if flag.startswith(prefix):
                dirs.append(Path(flag[len(prefix) :].strip()))
    return dirs


_INCLUDES: dict[Path, tuple[list[tuple[str, str]], int]] = {}


def _includes(path: Path) -> tuple[list[tuple[str, str]], int]:
    """(#include kind and name, #include MACRO count) of a file, read once."""
    if path not in _INCLUDES:
        text = path.read_text(errors="replace")
        _INCLUDES[path] = INCLUDE_RE.findall(text), len(MACRO_INCLUDE_RE.findall(text))
    return _INCLUDES[path]


def include_closure(sources: list[Path], dirs: list[Path]) -> tuple[set[Path], set[str], int]:
    """(files reached, #include names not found, #include MACRO lines seen) from `sources`, following every
    #include whatever the #if around it (a superset of what a compile reads)."""
    seen: set[Path] = set()
    missing: set[str] = set()
    macro = 0
    todo = [p.resolve() for p in sources]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        includes, n_macro = _includes(path)
        macro += n_macro
        for kind, name in includes:
            candidates = ([path.parent] if kind == '"' else []) + dirs
            for d in candidates:
                hit = d / name
                if hit.is_file():
                    todo.append(hit.resolve())
                    break
            else:
                missing.add(name)
    return seen, missing, macro


def cmd_probe(args) -> int:
    """Run in a process whose environment `probe_env` made: flashinfer from SITE, a stand-in CUDA home."""
    site = Path(args.site).resolve()
    package = site / "flashinfer"
    opened: set[str] = set()

    def hook(event, hook_args):
        if event == "open" and hook_args and isinstance(hook_args[0], str):
            p = os.path.realpath(hook_args[0])
            if p.startswith(str(package) + os.sep) and not p.endswith((".py", ".pyc")):
                opened.add(p)

    sys.addaudithook(hook)
    t0 = time.perf_counter()
    import flashinfer

    if Path(flashinfer.__file__).resolve().parent != package:
        raise SystemExit(f"flashinfer imported from {flashinfer.__file__}, not {package}")
    import_s = time.perf_counter() - t0
    cuda_home = os.environ["CUDA_HOME"]
    specs = probe_specs()
    warm = [s.name for part in ("fa2", "fa3") for s in warm_specs(part, prefill_backend="fa3")]
    not_kept = sorted(set(warm) - {s.name for s in specs})
    files: set[Path] = set()
    missing: set[str] = set()
    macro = 0
    spec_info = []
    for spec in specs:
        spec.write_ninja()  # renders the generated sources too (gen_* already did) and checks the flags
        dirs = include_dirs(spec, cuda_home)
        reached, miss, n_macro = include_closure(list(spec.sources), dirs)
        files |= reached
        missing |= miss
        macro += n_macro
        spec_info.append(
            {"name": spec.name, "sources": [p.name for p in spec.sources], "ninja": spec.ninja_path.is_file()}
        )
    preprocessed = preprocess(specs) if args.nvcc else None
    in_package = sorted(
        str(p.relative_to(site)) for p in files | {Path(o) for o in opened} if str(p).startswith(str(package) + os.sep)
    )
    out = {
        "flashinfer": flashinfer.__version__,
        "import_s": round(import_s, 2),
        "specs": spec_info,
        "files": in_package,
        "files_bytes": sum((site / f).stat().st_size for f in in_package),
        "unresolved_includes": sorted(missing),
        "macro_includes": macro,
        "nvcc_preprocessed": preprocessed,
        "warm": warm,
        "warm_not_kept": not_kept,
    }
    print(json.dumps(out))
    return 0


def preprocess(specs) -> dict:
    """Run each source of one module of every kind (head_dim 128, sliding window on, and the page append)
    through `nvcc -E` with the flags the JIT would compile it with: every #include a compile for sm_90a
    reads, under the real macros, must resolve. Needs CUDA_HOME to be a real toolkit (nvcc, CUDA headers)."""
    chosen = [s for s in specs if s.name == "page" or ("head_dim_qk_128" in s.name and "use_swa_True" in s.name)]
    done, failed = 0, []
    t0 = time.perf_counter()
    for spec in chosen:
        for entry in spec.get_compile_commands():
            cmd = re.sub(r" -o \S+$", " -o /dev/null", entry["command"].replace(" -c ", " -E ", 1))
            proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            done += 1
            if proc.returncode != 0:
                failed.append({"file": Path(entry["file"]).name, "module": spec.name, "error": proc.stderr[-1500:]})
    return {
        "modules": [s.name for s in chosen],
        "sources": done,
        "failed": failed,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def probe_env(site: Path, work: Path, host_site: Path | None, cuda_home: Path | None = None) -> dict[str, str]:
    """The environment of a CPU probe: flashinfer from `site`, the host helpers (tvm-ffi and nvidia-ml-py for
    this interpreter) behind it, a stand-in CUDA home with an nvcc that only tells its version (13.0, the GPU
    machine's) unless `cuda_home` is a real toolkit, the JIT workspace in `work`, and the H200's architecture."""
    cuda = cuda_home or work / "cuda"
    if cuda_home is None:
        (cuda / "bin").mkdir(parents=True, exist_ok=True)
        (cuda / "include").mkdir(exist_ok=True)
        nvcc = cuda / "bin" / "nvcc"
        nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
        nvcc.chmod(0o755)
    # the host helpers first: a site installed for the GPU machine holds a cp312 tvm_ffi this interpreter
    # may not load
    paths = ([str(host_site)] if host_site else []) + [str(site), str(ROOT)]
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        CUDA_HOME=str(cuda),
        FLASHINFER_WORKSPACE_BASE=str(work / "ws"),
        FLASHINFER_CUDA_ARCH_LIST="9.0a",
        CUDA_VISIBLE_DEVICES="",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run_probe(site: Path, host_site: Path | None, cuda_home: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpu-kit-probe-") as tmp:
        env = probe_env(site, Path(tmp), host_site, cuda_home)
        cmd = [sys.executable, str(Path(__file__).resolve()), "probe", str(site)]
        cmd += ["--nvcc"] if cuda_home else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"probe of {site} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- trimming ----------------------------------------------------------------------------------------
def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def write_wheel(path: Path, entries: list[tuple[zipfile.ZipInfo, bytes]], dist_info: str) -> None:
    """A wheel from (info, data) pairs, in order, with a fresh RECORD; fixed timestamps, so the same input
    gives the same bytes."""
    rows = []
    record = f"{dist_info}/RECORD"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for info, data in entries:
            zi = zipfile.ZipInfo(info.filename, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = info.external_attr or (0o644 << 16)
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data, compresslevel=9)
            rows.append(record_line(info.filename, data))
        rows.append([record, "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        zi = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        z.writestr(zi, buf.getvalue().encode(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)


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


def cmd_check_trimmed(args) -> int:
    """Probe an installed trimmed flashinfer: it imports, our kernels' specs generate, and their #include
    closure resolves inside it exactly as in the full wheel."""
    site = Path(args.site).resolve()
    manifest = json.loads((site / "flashinfer/data/TRIMMED.json").read_text())
    cuda_home = Path(args.cuda_home).resolve() if args.cuda_home else None
    probe = run_probe(site, Path(args.host_site).resolve() if args.host_site else None, cuda_home=cuda_home)
    problems = []
    gone = sorted(set(manifest["closure_files"]) - set(probe["files"]))
    if gone:
        problems.append(f"the closure no longer reaches {len(gone)} files: {gone[:5]}")
    new_missing = sorted(set(probe["unresolved_includes"]) - set(manifest["probe"]["unresolved_includes"]))
    if new_missing and cuda_home is None:  # with a real toolkit its headers resolve too, and reach others
        problems.append(f"#includes unresolved in the trimmed copy only: {new_missing[:10]}")
    absent = [f for f in probe["files"] if not (site / f).is_file()]
    if absent:
        problems.append(f"files missing: {absent[:10]}")
    if probe["warm_not_kept"]:
        problems.append(f"the jit stages would build modules whose sources are not kept: {probe['warm_not_kept']}")
    say(
        f"trimmed flashinfer {probe['flashinfer']}: imports in {probe['import_s']} s; {len(probe['specs'])} JIT specs "
        f"generated with their ninja files; their #include closure: {len(probe['files'])} files "
        f"({probe['files_bytes'] / 1e6:.1f} MB), all present; unresolved only the toolkit's "
        f"({len(probe['unresolved_includes'])} names, e.g. {', '.join(probe['unresolved_includes'][:4])}); the jit "
        f"stages' {len(probe['warm'])} modules (on an H200) among them"
    )
    pre = probe["nvcc_preprocessed"]
    if pre is not None:
        for f in pre["failed"]:
            problems.append(f"nvcc -E {f['file']} ({f['module']}): {f['error']}")
        say(
            f"nvcc -E with the JIT's flags (sm_90a): {pre['sources'] - len(pre['failed'])} of {pre['sources']} sources "
            f"of {len(pre['modules'])} modules preprocess in the trimmed copy ({pre['wall_s']:.0f} s)"
        )
    for p in problems:
        say(f"FAIL: {p}")
    return 1 if problems else 0


# ---- wheel checks ------------------------------------------------------------------------------------
def verify_record(path: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(path) as z:
        names = [i.filename for i in z.infolist() if not i.is_dir()]
        records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            return [f"{path.name}: {len(records)} RECORD files"]
        rows = {r[0]: r for r in csv.reader(io.StringIO(z.read(records[0]).decode())) if r}
        for n in names:
            if n == records[0]:
                continue
            row = rows.get(n)
            if row is None:
                problems.append(f"{path.name}: {n} is not in RECORD")
                continue
            expect = record_line(n, z.read(n))
            if row[1:3] != expect[1:3]:
                problems.append(f"{path.name}: {n}: RECORD says {row[1:3]}, the file is {expect[1:3]}")
        listed_only = set(rows) - set(names)
        if listed_only:
            problems.append(f"{path.name}: RECORD lists absent files: {sorted(listed_only)[:5]}")
    return problems


def cmd_verify_wheels(args) -> int:
    wheels = sorted(Path(args.dir).glob("*.whl"))
    pins = read_pins()
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
            problems.append(f"{by_name[name][0].name}: not pinned in {PINS.name}")
    for w in wheels:
        problems += verify_record(w)
    recorded = read_requires() if REQUIRES.is_file() else {}
    for w in wheels:
        name, version = wheel_name(w)
        rec = recorded.get(name)
        lines = requires_lines(wheel_metadata(w))
        if rec is None or rec[0] != version or sorted(rec[1]) != sorted(lines):
            only_wheel = sorted(set(lines) - set(rec[1] if rec else []))
            only_record = sorted(set(rec[1] if rec else []) - set(lines))
            problems.append(
                f"{w.name}: {REQUIRES.name} does not record its METADATA"
                + (f" (records version {rec[0]})" if rec and rec[0] != version else "")
                + (f"; only in the wheel: {only_wheel}" if only_wheel else "")
                + (f"; only in the record: {only_record}" if only_record else "")
                + f" (python scripts/gpu_kit.py record-requires {Path(args.dir)} rewrites it)"
            )
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        say(f"  {w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
    say(f"  {total / 2**20:8.2f} MiB  in {len(wheels)} wheels; RECORD checked in each")
    for p in problems:
        say(f"FAIL: {p}")
    return 1 if problems else 0


# ---- the resolver, offline ---------------------------------------------------------------------------
def stand_in_wheel(folder: Path, name: str, version: str, requires: list[str] = (), extras: dict = None) -> Path:
    """A wheel of metadata only: what pip's resolver reads."""
    dist = f"{name.replace('-', '_')}-{version}"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in (extras or {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    files = {
        f"{dist}.dist-info/METADATA": "\n".join(lines) + "\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu_kit\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = folder / f"{dist}-py3-none-any.whl"
    write_wheel(path, [(zipfile.ZipInfo(k), v.encode()) for k, v in files.items()], f"{dist}.dist-info")
    return path


def project_requirements() -> tuple[str, list[str], dict[str, list[str]]]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["version"], project["dependencies"], project.get("optional-dependencies", {})


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


# ---- what travels ------------------------------------------------------------------------------------
def travel_bytes(carry: list[str]) -> tuple[int, int, int]:
    """(working tree, carried paths, total) in bytes: tracked files and untracked files git does not ignore,
    as the device tool sends them, plus the carried paths."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    tree = 0
    for rel in {p for p in out.decode().split("\0") if p}:
        p = ROOT / rel
        if p.is_file() and not p.is_symlink():
            tree += p.stat().st_size
    carried = 0
    for c in carry:
        p = ROOT / c
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()] if p.exists() else []
        carried += sum(f.stat().st_size for f in files)
    return tree, carried, tree + carried


def cmd_travel_size(args) -> int:
    tree, carried, total = travel_bytes(args.carry)
    ok = total <= TRAVEL_LIMIT
    say(
        f"what travels: working tree {tree / 2**20:.2f} MiB + carried {' '.join(args.carry)} {carried / 2**20:.2f} MiB "
        f"= {total / 2**20:.2f} MiB of {TRAVEL_LIMIT >> 20} MiB" + ("" if ok else "  FAIL: over the limit")
    )
    return 0 if ok else 1


# ---- on the GPU machine ------------------------------------------------------------------------------
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


def max_jobs(cores: int, mem_available: int | None, per_job: int = NVCC_JOB_BYTES, reserve: int = MEM_RESERVE) -> int:
    """nvcc jobs the JIT may run at once: one a core, fewer where the memory left after `reserve` does not hold
    `per_job` bytes for each (at least one). Unknown memory: the cores."""
    if mem_available is None:
        return max(1, cores)
    return max(1, min(cores, (mem_available - reserve) // per_job))


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cmd_max_jobs(args) -> int:
    cores = args.cores or os.cpu_count() or 1
    print(max_jobs(cores, mem_available()))
    return 0


def preflight() -> tuple[int, dict]:
    """(exit status, report): 0 all well, 1 a CUDA part failed (flashinfer imports), 2 flashinfer failed to import.
    Each part is timed and any exception kept with its traceback's last lines."""
    import traceback

    report: dict = {}

    def part(name, fn):
        t0 = time.perf_counter()
        try:
            report[name] = {"ok": True, **(fn() or {})}
        except BaseException as e:  # noqa: BLE001 - the pre-flight reports every failure, whatever its kind
            if isinstance(e, KeyboardInterrupt):
                raise
            report[name] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
        report[name]["s"] = round(time.perf_counter() - t0, 2)

    def pinned():
        import torch

        host = torch.arange(1 << 20, dtype=torch.int32).pin_memory()  # 4 MiB, page-locked
        dev = host.to("cuda", non_blocking=True)
        back = torch.empty_like(host).pin_memory()
        back.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        if not torch.equal(back, host):
            raise RuntimeError("a pinned round trip through the GPU changed the data")
        return {"bytes": host.numel() * 4, "device": torch.cuda.get_device_name(0)}

    def graph():
        import torch

        side = torch.cuda.Stream()
        x = torch.ones(4096, device="cuda")
        y = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mul(x, 2, out=y)  # the warm-up, on the stream that captures
        side.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side, capture_error_mode="thread_local"):
            torch.mul(x, 2, out=y)  # one kernel
        x.fill_(3.0)  # on the current stream: the side stream waits for it
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            g.replay()
        side.synchronize()
        if float(y[0]) != 6.0 or float(y[-1]) != 6.0:
            raise RuntimeError(f"the replayed graph wrote {float(y[0])}, not 6.0")
        return {"stream": "side", "capture_error_mode": "thread_local"}

    def flashinfer():
        import flashinfer

        return {"version": flashinfer.__version__, "file": flashinfer.__file__}

    part("pinned", pinned)
    part("graph", graph)
    part("flashinfer", flashinfer)
    rc = 2 if not report["flashinfer"]["ok"] else 0 if report["pinned"]["ok"] and report["graph"]["ok"] else 1
    return rc, report


def cmd_preflight(args) -> int:
    rc, report = preflight()
    for name, r in report.items():
        say(f"preflight {name}: " + ("ok" if r["ok"] else f"FAILED: {r['error']}") + f" ({r['s']} s)")
        if not r["ok"]:
            say(r["traceback"])
    if args.json:
        Path(args.json).write_text(json.dumps({"rc": rc, **report}, indent=1))
    return rc


def cmd_warm(args) -> int:
    """Build one part of the flashinfer modules the kit's runs need in one ninja run, MAX_JOBS nvcc jobs at
    once (flashinfer would otherwise build each at first use, one after the other), then load each."""
    import torch

    t0 = time.perf_counter()
    import flashinfer
    from flashinfer.jit.core import build_jit_specs

    device = torch.device("cuda:0")
    specs = warm_specs(args.part, device)
    say(
        f"warm {args.part}: flashinfer {flashinfer.__version__} imported in {time.perf_counter() - t0:.1f} s; building "
        f"{len(specs)} modules with MAX_JOBS={os.environ.get('MAX_JOBS', 'ninja default')}, "
        f"FLASHINFER_NVCC_THREADS={os.environ.get('FLASHINFER_NVCC_THREADS', '1 (default)')}:"
    )
    for s in specs:
        say(f"  {s.name}")
    t1 = time.perf_counter()
    if specs:
        build_jit_specs(specs, verbose=False)
    t2 = time.perf_counter()
    for s in specs:
        s.build_and_load()
    t3 = time.perf_counter()
    result = {
        "part": args.part,
        "modules": [s.name for s in specs],
        "build_s": round(t2 - t1, 1),
        "load_s": round(t3 - t2, 1),
    }
    say(f"warm {args.part}: built in {t2 - t1:.0f} s, loaded in {t3 - t2:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def jit_report(built: list[str], warm_reports: list[dict], prefill_backend: str) -> dict:
    """What the JIT built against what the jit stages foresaw: `not_in_warm` (a module then compiled inside a
    timed stage: it belongs in WARM_FA2 or WARM_FA3) and `warm_missing` (foreseen but not built)."""
    warmed = [m for r in warm_reports for m in r.get("modules", [])]
    return {
        "prefill_backend": prefill_backend,
        "built": built,
        "warmed": warmed,
        "not_in_warm": [m for m in built if m not in warmed],
        "warm_missing": [m for m in warmed if m not in built],
        "fa3_built": [m for m in built if m.endswith("_sm90")],
    }


def cmd_jit_report(args) -> int:
    from flashinfer.jit import env

    built = sorted(p.parent.name for p in env.FLASHINFER_JIT_DIR.glob("*/*.so"))
    reports = [json.loads(Path(w).read_text()) for w in args.warm_json if Path(w).is_file()]
    out = {"jit_dir": str(env.FLASHINFER_JIT_DIR), **jit_report(built, reports, args.prefill_backend)}
    say(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def cmd_summary(args) -> int:
    """summary.json from the stage table (name, cap, seconds, exit status, note per line) and the results."""
    out_dir = Path(args.out)
    stages = []
    for line in Path(args.stages).read_text().splitlines():
        name, cap, seconds, rc, note = (line.split("\t") + [""] * 5)[:5]
        stages.append({"stage": name, "cap_s": int(cap), "wall_s": float(seconds), "rc": int(rc), "note": note})
    extra = {}
    for item in args.include:  # key=path
        key, _, name = item.partition("=")
        p = Path(name)
        if p.is_file():
            try:
                extra[key] = json.loads(p.read_text())
            except ValueError:
                extra[key] = p.read_text()[-2000:]
    summary = {
        "attention_backend": args.attention,
        "prefill_backend": args.prefill_backend if args.attention == "flashinfer" else None,
        "fallbacks": args.fallback,
        "total_s": args.wall if args.wall is not None else round(sum(s["wall_s"] for s in stages), 1),
        "stages": stages,
        "results": sorted(p.name for p in out_dir.glob("*.json") if p.name != "summary.json"),
        **extra,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    width = max(len(s["stage"]) for s in stages) if stages else 5
    say("stage times:")
    for s in stages:
        state = "ok" if s["rc"] == 0 else ("timed out" if s["rc"] in (124, 137) else f"exit {s['rc']}")
        say(f"  {s['stage']:<{width}}  {s['wall_s']:6.1f} s of {s['cap_s']:3d} s  {state}  {s['note']}")
    say(
        f"  {'total':<{width}}  {summary['total_s']:6.1f} s (models runs beside jit); "
        f"attention backend: {args.attention}"
        + (f", prefill {args.prefill_backend}" if args.attention == "flashinfer" else "")
    )
    for f in args.fallback:
        say(f"  !! {f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def command(name: str, fn, help: str, *arguments: tuple) -> None:
        """A subcommand: each argument is (flag, keyword arguments of add_argument) or (flag,)."""
        s = sub.add_parser(name, help=help)
        for flag, *kw in arguments:
            s.add_argument(flag, **(kw[0] if kw else {}))
        s.set_defaults(fn=fn)

    command(
        "trim",
        cmd_trim,
        "repack flashinfer-python's wheel",
        ("wheel",),
        ("out_dir",),
        ("--host-site", {"help": "tvm-ffi and nvidia-ml-py for this interpreter (scripts/gpu_wheels.sh)"}),
    )
    command(
        "probe",
        cmd_probe,
        "(internal) our kernels' JIT specs and #include closure, as JSON",
        ("site",),
        ("--nvcc", {"action": "store_true", "help": "also run one module of each kind through nvcc -E"}),
    )
    command(
        "check-trimmed",
        cmd_check_trimmed,
        "probe an installed trimmed flashinfer",
        ("site",),
        ("--host-site",),
        ("--cuda-home", {"help": "a CUDA toolkit (nvcc 13.0 and its headers): also preprocess with nvcc -E"}),
    )
    command("verify-wheels", cmd_verify_wheels, "RECORDs, one version each, the pins", ("dir",))
    command("resolve", cmd_resolve, "pip's resolver, offline, against stand-ins for the machine's packages", ("dir",))
    command(
        "travel-size", cmd_travel_size, "bytes a device run sends", ("--carry", {"nargs": "*", "default": [".whl"]})
    )
    command(
        "check-env",
        cmd_check_env,
        "(GPU) versions, the GPU, requirements met",
        ("--wheels", {"default": str(ROOT / ".whl")}),
        ("--site", {"default": None, "help": "where the carried wheels must be imported from"}),
        ("--json",),
    )
    command("complete", cmd_complete, "every requirement met by the machine's packages or the kit's pins (offline)")
    command("record-requires", cmd_record_requires, f"rewrite {REQUIRES.name} from the wheels in DIR", ("dir",))
    command("max-jobs", cmd_max_jobs, "nvcc jobs the JIT may run at once", ("--cores", {"type": int, "default": None}))
    command(
        "preflight", cmd_preflight, "(GPU) pinned memory, a CUDA graph on a side stream, import flashinfer", ("--json",)
    )
    command(
        "warm",
        cmd_warm,
        "(GPU) build and load one part of our flashinfer kernels",
        ("--part", {"choices": ["fa2", "fa3"], "required": True}),
        ("--json",),
    )
    command(
        "jit-report",
        cmd_jit_report,
        "(GPU) the flashinfer modules built",
        ("--warm-json", {"nargs": "*", "default": []}),
        ("--prefill-backend", {"default": "auto"}),
        ("--json",),
    )
    command(
        "summary",
        cmd_summary,
        "(GPU) summary.json and the stage times",
        ("--out", {"required": True}),
        ("--stages", {"required": True}),
        ("--attention", {"required": True}),
        ("--prefill-backend", {"default": "auto", "help": "auto, or fa2 where FA3 failed to build"}),
        ("--fallback", {"action": "append", "default": [], "help": "a stage that degraded the run, and how"}),
        ("--include", {"nargs": "*", "default": [], "help": "KEY=FILE: a JSON file to include under KEY"}),
        ("--wall", {"type": float, "default": None, "help": "the whole run's seconds (stages may overlap)"}),
    )
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
