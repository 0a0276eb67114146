"""The #include closure of the JIT's sources: every file a compile may read, whatever the #if around an
#include, found on the JIT's own include path. What the trimmed wheel must keep."""

from __future__ import annotations

import re
from pathlib import Path

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
MACRO_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]+[A-Za-z_]", re.M)


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
