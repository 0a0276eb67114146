"""What the commands print: each model's text in its own colour on a terminal, and the summary line."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

COLOURS = ("\033[36m", "\033[35m", "\033[33m", "\033[32m")  # cyan, magenta, yellow, green; by policy order
DIM, RESET = "\033[2m", "\033[0m"


class Painter:
    """Colours each model's text on a terminal (NO_COLOR and --no-color turn it off)."""

    def __init__(self, models: Sequence[str], enabled: bool):
        self.enabled = enabled
        self.colour = {m: COLOURS[i % len(COLOURS)] for i, m in enumerate(models)}

    def text(self, text: str, model: str | None) -> str:
        if not self.enabled or model is None or not text:
            return text
        return f"{self.colour[model]}{text}{RESET}"

    def dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.enabled else text


def use_colour(args) -> bool:
    return sys.stdout.isatty() and not args.no_color and not os.environ.get("NO_COLOR")


def summary(out, models: Sequence[str], seconds: float) -> dict:
    n = len(out.token_ids)
    per_model = out.tokens_per_model()
    return {
        "tokens": n,
        "tokens_per_model": {m: per_model.get(m, 0) for m in models},
        "handoffs": out.num_handoffs,
        "finish_reason": out.finish_reason,
        "seconds": round(seconds, 3),
        "time_to_first_token": None if out.time_to_first_token is None else round(out.time_to_first_token, 3),
        "tokens_per_second": round(n / seconds, 2) if seconds > 0 else None,
    }


def summary_line(s: dict, painter: Painter) -> str:
    n = max(s["tokens"], 1)
    parts = [painter.text(f"{m} {c} ({100 * c / n:.0f}%)", m) for m, c in s["tokens_per_model"].items()]
    rate = f"{s['tokens_per_second']:.1f}" if s["tokens_per_second"] is not None else "-"
    tail = f"{s['handoffs']} hand-offs · {s['tokens']} tokens in {s['seconds']:.1f} s = {rate} tokens/s"
    if s["finish_reason"] != "stop":
        tail += f" · finish: {s['finish_reason']}"
    return painter.dim("[") + " · ".join(parts) + painter.dim(f" · {tail}]")


def status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
