"""`check-trimmed`: the installed trimmed flashinfer imports, our kernels' JIT specs generate, and their
#include closure resolves inside it as it did in the full wheel (with a real toolkit: nvcc -E passes)."""

from __future__ import annotations

import json
from pathlib import Path

from .console import say
from .probe import run_probe


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
