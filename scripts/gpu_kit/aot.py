"""`aot` and `check-aot`: our flashinfer modules compiled ahead of time for the GPU machine, on a CPU machine.

flashinfer 0.7.4 loads `flashinfer/data/aot/<name>/<name>.so` before it would JIT-build a module, and builds
it after all if that load fails (`JitSpec.try_load`). So the kit builds the modules the device run needs here,
with the JIT's own ninja files and nvcc 13.0 (the machine's), for sm_90a, and carries them xz-compressed in
`.whl/`: the device run unpacks them into the installed flashinfer and skips about 2,000 CPU-seconds of nvcc.

Linking needs what a GPU machine has and this one lacks: `-lcuda` (a stub `libcuda.so` whose soname is the
driver's, `libcuda.so.1`; the modules' driver calls stay undefined until the real driver is loaded) and, for
FA3, cuRAND's headers (from the pinned `nvidia-curand` wheel). The build is ~2,000 CPU-seconds: once per pin,
cached under `~/.cache/tokenrouter/gpu-aot/`, never in CI. `check-aot` reads the archive back: each module's
NEEDED libraries, the newest GLIBC and GLIBCXX symbol versions it asks for, and the tvm-ffi functions it
exports, against what the engine calls and what the GPU machine has.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .console import say
from .lists import ROOT

ARCH = "9.0a"  # the H100's and the H200's; flashinfer's FLASHINFER_CUDA_ARCH_LIST spelling
ARCHIVE = "flashinfer-aot.tar.xz"
MANIFEST = "flashinfer-aot.json"
CACHE = Path(os.environ.get("TOKENROUTER_HOME", Path.home() / ".cache" / "tokenrouter")) / "gpu-aot"
# cuRAND's headers for FA3 (flashinfer's sm90 sources include curand_kernel.h); the file PyPI had in 2026-12
CURAND = ("nvidia-curand==10.4.5.25", "22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529")
# What a module may ask the loader for: the CUDA runtime and driver (torch's libcudart.so.13 is loaded first,
# the driver is the machine's), and the C/C++ runtime every Linux has. tvm-ffi's symbols stay undefined: the
# Python package has loaded libtvm_ffi.so before flashinfer loads a module.
ALLOWED_NEEDED = {"libcudart.so.13", "libcuda.so.1", "libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6"}
# The oldest C/C++ runtime the modules may need: Ubuntu 22.04's (glibc 2.35, GCC 12's libstdc++). The GPU
# image's Python 3.12.3 is Ubuntu 24.04's (glibc 2.39), so this leaves room.
MAX_GLIBC = (2, 35)
MAX_GLIBCXX = (3, 4, 30)
# The tvm-ffi functions flashinfer's Python calls on each kind of module (page.py, prefill.py, decode.py)
EXPORTS = {"page": {"append_paged_kv_cache"}, "prefill": {"plan", "paged_run", "ragged_run"}}


def aot_specs():
    """The modules the device run needs, as JIT specs: the page append and FA2 of `warm_specs("fa2")`, and
    FA3 of `warm_specs("fa3")` on Hopper."""
    from .jit_modules import warm_specs

    return warm_specs("fa2") + warm_specs("fa3", prefill_backend="fa3")


RECIPE = "1"  # raise it when what `build` does changes (the flags, the toolkit, the set of modules)


def cache_key(flashinfer_wheel: Path) -> str:
    """The build's identity: the (trimmed) flashinfer wheel, nvcc's version, the architecture, the recipe."""
    h = hashlib.sha256(flashinfer_wheel.read_bytes())
    h.update(f"{nvcc_version()} {ARCH} {RECIPE}".encode())
    return h.hexdigest()[:16]


def nvcc_version(nvcc: str = "nvcc") -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"release [\d.]+, V([\d.]+)", out)[1]


def toolkit(work: Path, cuda: Path, curand_wheel: Path) -> Path:
    """A CUDA home for the JIT: the machine's toolkit by symlinks, cuRAND's headers beside its own, and a
    stub `lib64/stubs/libcuda.so` with the driver's soname."""
    home = work / "cuda"
    for part in ("include", "lib64"):
        (home / part).mkdir(parents=True, exist_ok=True)
        for entry in (cuda / part).iterdir():
            (home / part / entry.name).symlink_to(entry.resolve())
    for entry in cuda.iterdir():
        if entry.name not in ("include", "lib64"):
            (home / entry.name).symlink_to(entry.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        shutil.unpack_archive(curand_wheel, tmp, "zip")
        for header in (Path(tmp) / "nvidia" / "cu13" / "include").glob("curand*.h"):
            if not (home / "include" / header.name).exists():
                shutil.copy(header, home / "include" / header.name)
    stubs = home / "lib64" / "stubs"
    stubs.mkdir()
    (stubs / "stub.c").write_text("/* the CUDA driver's soname, no symbols: the real driver resolves them */\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"), str(stubs / "stub.c")],
        check=True,
    )
    return home


def fetch_curand(dest: Path) -> Path:
    spec, sha = CURAND
    got = list(dest.glob("nvidia_curand-*.whl"))
    if not got:
        req = dest / "curand.txt"
        dest.mkdir(parents=True, exist_ok=True)
        req.write_text(f"{spec} --hash=sha256:{sha}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
             "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
             "--require-hashes", "-r", str(req), "-d", str(dest)],
            check=True,
        )  # fmt: skip
        got = list(dest.glob("nvidia_curand-*.whl"))
    return got[0]


def cmd_aot(args) -> int:
    """Build the device run's flashinfer modules for sm_90a, check them, and pack them into `.whl/`."""
    wheels = Path(args.wheels)
    fi_wheel = next(wheels.glob("flashinfer_python-*.whl"), None)
    if fi_wheel is None:
        raise SystemExit(f"no flashinfer wheel in {wheels}: run scripts/gpu_wheels.sh first")
    key = cache_key(fi_wheel)
    cached = CACHE / key
    if not (cached / ARCHIVE).is_file() or args.rebuild:
        if args.cached_only:
            say(f"aot: no build of {fi_wheel.name} cached in {CACHE}: run `python -m scripts.gpu_kit aot` (~30 min)")
            return 0
        build(fi_wheel, Path(args.host_site), Path(args.cuda), cached, args.jobs)
    for name in (ARCHIVE, MANIFEST):
        shutil.copy(cached / name, wheels / name)
    say(f"aot: {wheels / ARCHIVE} ({(wheels / ARCHIVE).stat().st_size / 2**20:.2f} MiB) from {cached}")
    return check(wheels)


def build(fi_wheel: Path, host_site: Path, cuda: Path, cached: Path, jobs: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="gpu-kit-aot-") as tmp:
        work = Path(tmp)
        site = work / "site-fi"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
             "--no-compile", "--target", str(site), str(fi_wheel)],
            check=True,
        )  # fmt: skip
        home = toolkit(work, cuda, fetch_curand(CACHE / "downloads"))
        from .probe import probe_env

        env = probe_env(site, work, host_site, home)
        env.update(MAX_JOBS=str(jobs or os.cpu_count()), FLASHINFER_NVCC_THREADS="1", FLASHINFER_CUDA_ARCH_LIST=ARCH)
        out = work / "aot"
        t0 = time.perf_counter()
        say(f"aot: building {fi_wheel.name}'s modules for sm_{ARCH.replace('.', '')} with nvcc {nvcc_version()}")
        cmd = [sys.executable, "-m", "scripts.gpu_kit", "aot-build", str(out)]
        subprocess.run(cmd, env=env, cwd=ROOT, check=True)
        names = json.loads((out / "modules.json").read_text())
        manifest = {
            "flashinfer_wheel": fi_wheel.name,
            "flashinfer_wheel_sha256": hashlib.sha256(fi_wheel.read_bytes()).hexdigest(),
            "tvm_ffi": tvm_ffi_version(host_site),
            "nvcc": nvcc_version(),
            "arch": f"sm_{ARCH.replace('.', '')}",
            "build_s": round(time.perf_counter() - t0),
            "modules": {n: describe(out / n / f"{n}.so") for n in names},
        }
        cached.mkdir(parents=True, exist_ok=True)
        pack(out, names, manifest, cached / ARCHIVE)
        (cached / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def tvm_ffi_version(host_site: Path) -> str:
    info = next(host_site.glob("apache_tvm_ffi-*.dist-info"), None)
    return info.name.removesuffix(".dist-info").split("-")[1] if info else "unknown"


def cmd_aot_build(args) -> int:
    """(internal; in `build`'s environment) one parallel ninja run over every spec, then the libraries out."""
    from flashinfer.jit.core import build_jit_specs

    out = Path(args.out)
    specs = aot_specs()
    build_jit_specs(specs, verbose=False)
    for s in specs:
        (out / s.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(s.jit_library_path, out / s.name / f"{s.name}.so")
        say(f"  {s.name}.so {s.jit_library_path.stat().st_size / 2**20:.2f} MiB")
    (out / "modules.json").write_text(json.dumps([s.name for s in specs]))
    return 0


def pack(src: Path, names: list[str], manifest: dict, archive: Path) -> None:
    """`<name>/<name>.so` for each module and the manifest, xz, fixed times and owners (reproducible)."""
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for n in sorted(names):
            info = tar.gettarinfo(src / n / f"{n}.so", f"{n}/{n}.so")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(src / n / f"{n}.so", "rb") as f:
                tar.addfile(info, f)
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def describe(so: Path) -> dict:
    """What the loader and flashinfer's Python will ask of a module: its NEEDED libraries, the newest symbol
    versions of glibc and libstdc++ it needs, the tvm-ffi functions it exports."""
    dyn = subprocess.run(["readelf", "-d", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    ver = subprocess.run(["readelf", "-V", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    data = so.read_bytes()

    def newest(prefix: str) -> str | None:
        found = {tuple(int(x) for x in v.split(".")) for v in re.findall(rf"\b{prefix}_([\d.]+)\b", ver)}
        return ".".join(map(str, max(found))) if found else None

    return {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "needed": sorted(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)),
        "glibc": newest("GLIBC"),
        "glibcxx": newest("GLIBCXX"),
        "exports": sorted(set(re.findall(r" __tvm_ffi_(\w+)$", syms, re.M))),
    }


def problems(name: str, info: dict) -> list[str]:
    """What would stop the GPU machine's loader or flashinfer's Python from using this module."""
    out = []
    extra = set(info["needed"]) - ALLOWED_NEEDED
    if extra:
        out.append(f"{name}: needs {sorted(extra)}, which the GPU machine's loader may not find")
    for field, limit in (("glibc", MAX_GLIBC), ("glibcxx", MAX_GLIBCXX)):
        v = info.get(field)
        if v and tuple(int(x) for x in v.split(".")) > limit:
            out.append(f"{name}: needs {field.upper()}_{v}, newer than {'.'.join(map(str, limit))}")
    kind = "page" if name == "page" else "prefill"
    missing = EXPORTS[kind] - set(info["exports"])
    if missing:
        out.append(f"{name}: does not export {sorted(missing)}, which flashinfer's {kind}.py calls")
    return out


def check(
    wheels: Path, expected: list[str] | None = None, host_site: Path | None = None, cuda: Path = Path("/usr/local/cuda")
) -> int:
    """The archive in `wheels` against its manifest and the rules above; `expected`: the module names the
    engine asks for (the JIT specs' names); `host_site`: a tvm-ffi for this interpreter, to load each module
    here as flashinfer would."""
    archive, manifest_path = wheels / ARCHIVE, wheels / MANIFEST
    if not archive.is_file():
        say(f"check-aot: no {archive}: run `python -m scripts.gpu_kit aot` (the device run will JIT-build)")
        return 1
    manifest = json.loads(manifest_path.read_text())
    bad = []
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        inner = json.loads((Path(tmp) / MANIFEST).read_text())
        if inner != manifest:
            bad.append(f"{MANIFEST} beside the archive differs from the one inside it")
        for name, info in manifest["modules"].items():
            so = Path(tmp) / name / f"{name}.so"
            if not so.is_file():
                bad.append(f"{name}: not in the archive")
                continue
            got = describe(so)
            if got != info:
                bad.append(f"{name}: the archive's library differs from the manifest's description")
            bad += problems(name, got)
            say(
                f"  {name}: {got['bytes'] / 2**20:.2f} MiB, needs {', '.join(got['needed'])}; GLIBC_{got['glibc']}, "
                f"GLIBCXX_{got['glibcxx']}; exports {', '.join(got['exports'])}"
            )
        if host_site is not None:
            bad += load_here(Path(tmp), list(manifest["modules"]), host_site, cuda)
    if expected is not None:
        missing = sorted(set(expected) - set(manifest["modules"]))
        if missing:
            bad.append(f"the engine asks for modules the archive lacks: {missing}")
    for b in bad:
        say(f"check-aot: {b}")
    say(
        f"check-aot: {len(manifest['modules'])} modules for {manifest['arch']} (nvcc {manifest['nvcc']}, "
        f"{manifest['flashinfer_wheel']}, tvm-ffi {manifest['tvm_ffi']}), {archive.stat().st_size / 2**20:.2f} MiB: "
        + ("ok" if not bad else f"{len(bad)} problem(s)")
    )
    return 1 if bad else 0


LOAD = """
import json, sys, tvm_ffi

def found(module, name):
    try:
        getattr(module, name)
        return True
    except AttributeError:
        return False

out = {}
for path, names in json.loads(sys.argv[1]).items():
    try:
        m = tvm_ffi.load_module(path)
        out[path] = [n for n in names if found(m, n)]
    except Exception as e:
        out[path] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def load_here(tmp: Path, names: list[str], host_site: Path, cuda: Path) -> list[str]:
    """Load each module with tvm-ffi, as flashinfer does (lazy binding: flashinfer's dispatchers name kernel
    tiles it leaves uninstantiated as unreachable, so binding every symbol now would fail by design), beside
    the toolkit's CUDA runtime, and look up the functions flashinfer's Python calls. No GPU is needed: a
    module registers its kernels with the runtime, which asks for a device only at the first launch."""
    want = {str(tmp / n / f"{n}.so"): sorted(EXPORTS["page" if n == "page" else "prefill"]) for n in names}
    env = dict(os.environ, PYTHONPATH=str(host_site), CUDA_VISIBLE_DEVICES="")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(cuda / "lib64"), env.get("LD_LIBRARY_PATH", "")])
    proc = subprocess.run([sys.executable, "-c", LOAD, json.dumps(want)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return [f"loading the modules here failed: {proc.stderr[-800:]}"]
    bad = []
    for path, got in json.loads(proc.stdout).items():
        name = Path(path).parent.name
        if isinstance(got, str):
            bad.append(f"{name}: does not load here: {got[-300:]}")
        elif got != want[path]:
            bad.append(f"{name}: loads, but lacks {sorted(set(want[path]) - set(got))}")
    say(f"  loaded here with tvm-ffi and {cuda}/lib64's CUDA runtime: {len(names) - len(bad)} of {len(names)}")
    return bad


def cmd_check_aot(args) -> int:
    """With --site (an installed flashinfer, the trimmed copy), the names the engine asks for come from
    flashinfer's own JIT specs there (`probe`'s warm list); without it, only the archive is checked."""
    expected = None
    if args.site:
        from .probe import run_probe

        expected = run_probe(Path(args.site), Path(args.host_site) if args.host_site else None)["warm"]
    return check(Path(args.wheels), expected, Path(args.host_site) if args.host_site else None, Path(args.cuda))
