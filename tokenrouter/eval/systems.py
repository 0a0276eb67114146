"""The systems an evaluation compares, written as short specs on the command line.

A spec is `[LABEL=]BODY`; BODY is one of

    small | large               one model alone (Single), as the models are named
    single:NAME                 any given model alone
    rstitch[:T1,T2,...]         RStitch at each tau (default 0.03)
    r2r[:T1,...]@DIR            R2R with the router in DIR (written by `tokenrouter train-router`),
    citer[:T1,...]@DIR          at each threshold (none given: the threshold picked at training)
    collm[:T1,...]@DIR
    speculative[:K1,K2,...]     Speculative (small drafts, large verifies; lossless) with draft
                                length K (an int, or auto: the default)
    bild:F/R[,F/R,...]          BiLD at each operating point: fallback F in [0, 1], rollback R
                                in nats (> 0)
    package.module:factory      your own policy: `factory()` returns a Policy (or is one)

Several values give one system each (`rstitch:0.01,0.03,0.1` is three). A LABEL (letters,
digits and `_.+-()`) names a single system in the results and the report; the default label is
the canonical spec (`rstitch:0.03`, `r2r:0.269@r2r-demo`). Every spec is checked before any model
loads: a bad number, a missing router, an unknown kind or a policy naming a model that is not
given fails with the spec and the field named.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..policies import CITER, R2R, BiLD, CoLLM, Policy, RStitch, Single, Speculative

LEARNED = {"r2r": R2R, "citer": CITER, "collm": CoLLM}
KINDS = ("small", "large", "single", "rstitch", *LEARNED, "speculative", "bild")
LABEL = re.compile(r"[A-Za-z0-9_.+()-]+")
DEFAULT_TAU = 0.03


class SpecError(ConfigError):
    """A system spec that cannot be used; the message names the spec and the field."""

    def __init__(self, spec: str, field: str, message: str):
        self.spec, self.field = spec, field
        super().__init__(f"system {spec!r}: {field}: {message}")


@dataclass(frozen=True)
class System:
    """One system: how to build its policy (afresh for each engine) and what it needs."""

    label: str
    kind: str  # a KINDS entry, or "custom"
    make: Callable[[], Policy] = field(repr=False, compare=False)
    models: tuple[str, ...]
    spec: str  # what the user wrote
    value: float | None = None  # tau, threshold, draft length (None: auto) or BiLD's fallback
    router: str | None = None  # learned: the router directory

    @property
    def single_model(self) -> str | None:
        """The model a one-model system runs, else None."""
        return self.models[0] if self.kind in ("small", "large", "single") else None

    def describe(self) -> str:
        if self.single_model is not None:
            return f"{self.single_model} alone"
        return repr(self.make())


def _numbers(spec: str, what: str, text: str) -> list[float]:
    values = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise SpecError(spec, what, f"expected a number in [0, 1], got {part!r}") from None
        if not 0.0 <= v <= 1.0:
            raise SpecError(spec, what, f"must be in [0, 1], got {part}")
        values.append(v)
    if len(set(values)) != len(values):
        raise SpecError(spec, what, "a value is given twice")
    return values


def _draft_lengths(spec: str, text: str) -> list[int | str]:
    values: list[int | str] = []
    for part in text.split(","):
        if part == "auto":
            values.append(part)
            continue
        try:
            k = int(part)
        except ValueError:
            raise SpecError(spec, "k", f"expected a draft length (an int in [1, 64]) or auto, got {part!r}") from None
        if not 1 <= k <= 64:
            raise SpecError(spec, "k", f"must be in [1, 64], got {part}")
        values.append(k)
    if len(set(values)) != len(values):
        raise SpecError(spec, "k", "a value is given twice")
    return values


def _bild_points(spec: str, text: str) -> list[tuple[float, float]]:
    points = []
    for part in text.split(","):
        fallback, slash, rollback = part.partition("/")
        try:
            f, r = float(fallback), float(rollback)
        except ValueError:
            raise SpecError(spec, "point", f"expected FALLBACK/ROLLBACK, e.g. 0.6/5, got {part!r}") from None
        if not slash:
            raise SpecError(spec, "point", f"expected FALLBACK/ROLLBACK, e.g. 0.6/5, got {part!r}")
        if not 0.0 <= f <= 1.0:
            raise SpecError(spec, "fallback", f"must be in [0, 1], got {fallback}")
        if not r > 0:
            raise SpecError(spec, "rollback", f"must be > 0 (nats), got {rollback}")
        points.append((f, r))
    if len(set(points)) != len(points):
        raise SpecError(spec, "point", "a point is given twice")
    return points


def _custom(spec: str, body: str) -> Callable[[], Policy]:
    module_name, _, attr = body.partition(":")
    if not module_name or not attr or not all(p.isidentifier() for p in [*module_name.split("."), *attr.split(".")]):
        raise SpecError(
            spec,
            "kind",
            f"unknown {body!r}: expected one of {', '.join(KINDS)} or an import path package.module:factory",
        )
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise SpecError(spec, "module", f"cannot import {module_name!r}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecError(spec, "factory", f"{module_name!r} has no attribute {attr!r}") from None
    target = obj

    def make() -> Policy:
        policy = target if isinstance(target, Policy) else target() if callable(target) else target
        if not isinstance(policy, Policy):
            raise SpecError(spec, "factory", f"{body} must return a tokenrouter Policy, got {type(policy).__name__}")
        return policy

    try:
        make()
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 (the user's code: any failure is a bad spec)
        raise SpecError(spec, "factory", f"calling {body}() failed: {type(e).__name__}: {e}") from None
    return make


def parse_system(spec: str, models: Iterable[str]) -> list[System]:
    """The systems one spec stands for, checked against the given model names."""
    models = list(models)
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(str(spec), "spec", "is empty")
    spec = spec.strip()
    label, body = None, spec
    head, eq, rest = spec.partition("=")
    if eq and LABEL.fullmatch(head):
        label, body = head, rest
    elif eq and ":" not in head and "@" not in head:
        raise SpecError(spec, "label", f"{head!r} may hold only letters, digits and _.+-()")
    router = None
    if "@" in body:
        body, router = body.rsplit("@", 1)
        if not router:
            raise SpecError(spec, "router", "is empty after '@'")
    kind, colon, values = body.partition(":")
    systems: list[System] = []
    if kind in ("small", "large", "single"):
        if router is not None:
            raise SpecError(spec, "router", f"{kind} takes no router")
        if kind == "single":
            if not values:
                raise SpecError(spec, "model", "give the model, e.g. single:small")
            name = values
        elif colon:
            raise SpecError(spec, "kind", f"{kind} takes no value (did you mean single:{kind} or rstitch:...?)")
        else:
            name = kind
        systems.append(
            System(label or (name if kind != "single" else body), kind, lambda n=name: Single(n), (name,), spec)
        )
    elif kind == "rstitch":
        if router is not None:
            raise SpecError(spec, "router", "rstitch takes no router")
        taus = _numbers(spec, "tau", values) if colon else [DEFAULT_TAU]
        for t in taus:
            systems.append(System(f"rstitch:{t:g}", kind, lambda t=t: RStitch(tau=t), ("small", "large"), spec, t))
    elif kind in ("speculative", "bild"):
        if router is not None:
            raise SpecError(spec, "router", f"{kind} takes no router")
        if kind == "speculative":
            for k in _draft_lengths(spec, values) if colon else ["auto"]:
                systems.append(
                    System(
                        f"speculative:{k}",
                        kind,
                        lambda k=k: Speculative(k=k),
                        ("small", "large"),
                        spec,
                        None if k == "auto" else float(k),
                    )
                )
        else:
            if not colon:
                raise SpecError(spec, "point", "give FALLBACK/ROLLBACK, e.g. bild:0.6/5")
            for f, r in _bild_points(spec, values):
                systems.append(
                    System(
                        f"bild:{f:g}/{r:g}",
                        kind,
                        lambda f=f, r=r: BiLD(fallback=f, rollback=r),
                        ("small", "large"),
                        spec,
                        f,
                    )
                )
    elif kind in LEARNED:
        if router is None:
            raise SpecError(
                spec,
                "router",
                f"{kind} needs a router: {kind}@DIR, DIR written by `tokenrouter train-router --policy {kind}`",
            )
        directory = Path(router).expanduser()
        if not directory.is_dir():
            raise SpecError(spec, "router", f"no such directory: {router}")
        cls = LEARNED[kind]
        try:
            trained = cls(directory)  # loads and checks the router; its threshold is the trained one
        except (ConfigError, ValueError, OSError) as e:
            raise SpecError(spec, "router", str(e)) from None
        thresholds = _numbers(spec, "threshold", values) if colon else [trained.threshold]
        for t in thresholds:
            systems.append(
                System(
                    f"{kind}:{t:.4g}@{directory.resolve().name}",
                    kind,
                    lambda cls=cls, d=directory, t=t: cls(d, threshold=t),
                    ("small", "large"),
                    spec,
                    t,
                    str(directory),
                )
            )
    else:
        make = _custom(spec, body)
        if router is not None:
            raise SpecError(spec, "router", "an import path takes no router")
        systems.append(System(body, "custom", make, tuple(make().models), spec))
    if label is not None:
        if len(systems) != 1:
            raise SpecError(spec, "label", f"a label names one system; this spec makes {len(systems)}")
        systems[0] = System(
            label, *[getattr(systems[0], f) for f in ("kind", "make", "models", "spec", "value", "router")]
        )
    for s in systems:
        missing = [m for m in s.models if m not in models]
        if missing:
            raise SpecError(
                spec, "models", f"needs model(s) {missing}, but only {models} are given (--model NAME=PATH)"
            )
    return systems


def parse_systems(specs: Sequence[str], models: Iterable[str]) -> list[System]:
    """Every spec's systems, in order; a label given twice is an error."""
    models = list(models)
    out: list[System] = []
    for spec in specs:
        for s in parse_system(spec, models):
            if any(o.label == s.label for o in out):
                raise SpecError(spec, "label", f"{s.label!r} is already a system of this run")
            out.append(s)
    if not out:
        raise ConfigError("systems: give at least one")
    return out
