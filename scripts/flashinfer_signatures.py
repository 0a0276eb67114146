"""Record the signatures of the flashinfer callables tokenrouter's backend calls, for the default suite.

The default environment has no flashinfer, so tests/engine/attention/test_flashinfer_contract.py binds our calls
against the signatures this script read from the real library: parameter names, kinds and defaults
(annotations left out) of every callable in tokenrouter.testing.flashinfer_fake.CALLABLES.

    python scripts/flashinfer_signatures.py --site SITE            # writes the recorded file
    python scripts/flashinfer_signatures.py --site SITE --check    # exit 1 if it differs

SITE holds flashinfer, installed for this interpreter; it imports on a CPU:

    pip download flashinfer-python==0.7.4 --no-deps -d /tmp/fi
    pip install --no-deps --target SITE /tmp/fi/flashinfer_python-0.7.4-*.whl apache-tvm-ffi nvidia-ml-py

Without --site, flashinfer is imported from the environment (as where the GPU kit installed it).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "engine" / "attention" / "data" / "flashinfer_0_7_4_signatures.json"


def signature_of(lib: Any, name: str) -> inspect.Signature:
    """The signature of "Class" (its constructor), "Class.method" or "function" in `lib` (flashinfer or
    the fake), without `self`."""
    owner, _, attr = name.partition(".")
    obj = getattr(lib, owner)
    if not attr:
        return inspect.signature(obj)
    sig = inspect.signature(getattr(inspect.unwrap(obj), attr))
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def describe(sig: inspect.Signature) -> list[dict]:
    """A signature as JSON data: each parameter's name, kind and default (if any)."""
    out = []
    for p in sig.parameters.values():
        entry: dict[str, Any] = {"name": p.name, "kind": p.kind.name}
        if p.default is not p.empty:
            plain = p.default is None or isinstance(p.default, (bool, int, float, str))
            entry["default"] = p.default if plain else {"repr": repr(p.default)}
        out.append(entry)
    return out


def signature_from(described: list[dict]) -> inspect.Signature:
    """The signature `describe` described, to bind calls against."""
    kinds = inspect.Parameter
    params = [kinds(d["name"], getattr(kinds, d["kind"]), default=d.get("default", kinds.empty)) for d in described]
    return inspect.Signature(params)


def record(lib: Any, names) -> dict:
    return {"flashinfer": lib.__version__, "signatures": {name: describe(signature_of(lib, name)) for name in names}}


def dump(found: dict) -> str:
    """JSON with one parameter a line."""
    sigs = [
        f"  {json.dumps(name)}: [\n" + ",\n".join(f"   {json.dumps(p)}" for p in params) + "\n  ]"
        for name, params in found["signatures"].items()
    ]
    return (
        f'{{\n "flashinfer": {json.dumps(found["flashinfer"])},\n "signatures": {{\n' + ",\n".join(sigs) + "\n }\n}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", help="a folder flashinfer is installed in")
    parser.add_argument("--out", default=str(RECORDED))
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    if args.site:
        sys.path.insert(0, str(Path(args.site).resolve()))
    sys.path.insert(0, str(ROOT))
    import flashinfer

    from tokenrouter.testing.flashinfer_fake import CALLABLES

    found = record(flashinfer, CALLABLES)
    out = Path(args.out)
    if args.check:
        same = json.loads(out.read_text()) == found
        print(
            f"{out}: {'matches' if same else 'differs from'} flashinfer {found['flashinfer']} ({flashinfer.__file__})"
        )
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump(found))
    print(f"wrote {out}: {len(found['signatures'])} signatures of flashinfer {found['flashinfer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
