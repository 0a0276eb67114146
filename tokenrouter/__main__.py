"""`python -m tokenrouter`: the same as the `tokenrouter` command."""

from .cli import main

raise SystemExit(main())
