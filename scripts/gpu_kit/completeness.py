"""`complete`: the kit is complete, checked offline (no wheel, no network): every requirement of tokenrouter,
of its [gpu] extra and of each carried wheel is met by the GPU machine's packages or the kit's pins."""

from __future__ import annotations

from .console import say
from .lists import MACHINE, PINS, REQUIRES, project_requirements, read_machine, read_pins, read_requires
from .wheel_files import norm

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
