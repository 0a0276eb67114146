"""The GPU kit's command line, `python -m scripts.gpu_kit COMMAND` from the repository root: build the wheel
set on a CPU machine, check it there, and run the GPU-side steps.

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
  warm --part fa2|fa3    (GPU) load one part of our flashinfer kernels, from the AOT set where it loads, else
                         JIT-built in one parallel ninja run: fa2 the page append and FA2 (decode, short
                         prefill), fa3 FA3 (prefill rows over 64); reports each module's source
  jit-report             (GPU) the flashinfer modules built so far, and any the warm-up did not foresee
  aot                    build our flashinfer modules for sm_90a here (nvcc 13.0, ~2,000 CPU-s, cached per
                         pin) and pack them into .whl/flashinfer-aot.tar.xz with a manifest, then check-aot
  check-aot              the packed modules: NEEDED libraries, GLIBC/GLIBCXX versions, tvm-ffi exports and
                         names against what the engine asks for
  device-run             (GPU) the device run itself (gpu_check.sh without --dry-run): every stage in order,
                         each stage's JSON to $OUT as it ends, summary.json rewritten at every start and end
  unpack-aot             (GPU) the carried AOT modules into an installed flashinfer (the install stage)
  table OUT              the compact table of a device run's results, from what came back

Each command's module imports only the standard library at its top: check-env and device-run run before
anything is installed.
"""

from __future__ import annotations

import argparse

from .aot import cmd_aot, cmd_aot_build, cmd_check_aot
from .completeness import cmd_complete
from .device_run import cmd_device_run, cmd_unpack_aot
from .env_check import cmd_check_env
from .jit_report import cmd_jit_report
from .lists import REQUIRES, ROOT, cmd_record_requires
from .nvcc_jobs import cmd_max_jobs
from .preflight import cmd_preflight
from .probe import cmd_probe
from .resolver_check import cmd_resolve
from .run_table import cmd_table
from .travel_size import cmd_travel_size
from .trim import cmd_trim
from .trimmed_check import cmd_check_trimmed
from .warm import cmd_warm
from .wheel_set_check import cmd_verify_wheels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.gpu_kit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    command(
        "aot",
        cmd_aot,
        "build our flashinfer modules for sm_90a and pack them into .whl/",
        ("--wheels", {"default": str(ROOT / ".whl")}),
        ("--host-site", {"default": str(ROOT / ".whl-host" / "site")}),
        ("--cuda", {"default": "/usr/local/cuda", "help": "a CUDA 13.0 toolkit (nvcc, headers, libcudart)"}),
        ("--jobs", {"type": int, "default": None, "help": "nvcc jobs at once (default: the cores)"}),
        ("--rebuild", {"action": "store_true", "help": "ignore the cached build"}),
        ("--cached-only", {"action": "store_true", "help": "copy a cached build if there is one, build nothing"}),
    )
    command("aot-build", cmd_aot_build, "(internal) build the AOT modules into OUT", ("out",))
    command(
        "check-aot",
        cmd_check_aot,
        "the packed AOT modules against the engine's names and the GPU machine",
        ("--wheels", {"default": str(ROOT / ".whl")}),
        ("--site", {"default": None, "help": "an installed (trimmed) flashinfer: check the module names too"}),
        ("--host-site", {"default": None, "help": "tvm-ffi for this interpreter: load each module here too"}),
        ("--cuda", {"default": "/usr/local/cuda", "help": "a CUDA 13 toolkit whose lib64 has libcudart.so.13"}),
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
    command(
        "max-jobs",
        cmd_max_jobs,
        "nvcc jobs the JIT may run at once",
        ("--cores", {"type": int, "default": None}),
        ("--part", {"choices": ["fa2", "fa3"], "default": "fa3", "help": "fa2: 0.5 GiB a job, fa3: 4 GiB"}),
    )
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
    command("device-run", cmd_device_run, "(GPU) the device run", ("--out", {"default": None, "help": "default $OUT"}))
    command(
        "unpack-aot",
        cmd_unpack_aot,
        "(GPU) unpack the AOT modules into SITE/flashinfer/data/aot",
        ("--wheels", {"default": str(ROOT / ".whl")}),
        ("--site", {"required": True}),
        ("--json",),
    )
    command("table", cmd_table, "the compact table of a device run", ("out",))
    args = p.parse_args(argv)
    return args.fn(args)
