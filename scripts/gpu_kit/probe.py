"""The CPU probe of an installed flashinfer: in a process of its own (flashinfer from SITE, a stand-in CUDA
home), generate our kernels' JIT specs and report their sources, ninja files and #include closure as JSON;
with a real toolkit, also preprocess one module of each kind with nvcc."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .include_closure import include_closure, include_dirs
from .jit_modules import probe_specs, warm_specs
from .lists import ROOT


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
        cmd = [sys.executable, "-m", "scripts.gpu_kit", "probe", str(site)]
        cmd += ["--nvcc"] if cuda_home else []
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"probe of {site} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
