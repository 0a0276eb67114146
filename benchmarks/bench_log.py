"""The benchmarks' progress lines: timestamped, on stderr, so that stdout keeps only the results."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
