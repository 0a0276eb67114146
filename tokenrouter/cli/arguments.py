"""The command line's shared pieces: its error type, argument types and the option groups that
generate, chat, bench and eval share."""

from __future__ import annotations

import argparse

from .. import store

POLICIES = ("rstitch", "single", "citer", "r2r", "collm", "escalation", "speculative", "bild")
LEARNED = ("citer", "r2r", "collm")
PRECISIONS = ("auto", "float32", "bfloat16", "gguf", "gguf+bf16")  # api.setup.PRECISIONS, without importing torch
# the knobs of Speculative and BiLD: their defaults here, and the policies that take each
MAX_DRAFT_LENGTH = 64  # Speculative's bound on k
DEFAULT_K, DEFAULT_FALLBACK, DEFAULT_ROLLBACK = 4, 0.9, 2.0  # BiLD(0.9/2): the setting measured in docs/
KNOBS = {"--k": ("k", ("speculative",)), "--fallback": ("fallback", ("bild",)), "--rollback": ("rollback", ("bild",))}


class UsageError(Exception):
    """Something the user can fix: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def model_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (0 usually turns something off)."""
    return 0 if text.strip() == "0" else positive_int(text)


def optional_count(group, flag: str, help: str, metavar: str = "N", **kw) -> None:
    """An option taking an integer >= 1, None when it is not given (the command picks)."""
    group.add_argument(flag, type=positive_int, default=None, metavar=metavar, help=help, **kw)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def fraction(low_open: bool, high_open: bool):
    """An argparse type: a float in [0, 1], with the ends open as asked."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        if not (value > 0 if low_open else value >= 0) or not (value < 1 if high_open else value <= 1):
            raise argparse.ArgumentTypeError(f"must be in {lo}0, 1{hi}, got {text}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def draft_length(text: str) -> int | str:
    """An argparse type: Speculative's k, an integer in [1, 64] or the word auto."""
    if text.strip() == "auto":
        return "auto"
    limit = f"[1, {MAX_DRAFT_LENGTH}]"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in {limit} or auto, got {text!r}") from None
    if not 1 <= value <= MAX_DRAFT_LENGTH:
        raise argparse.ArgumentTypeError(f"must be an integer in {limit} or auto, got {value}")
    return value


def taus(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.2,0.1, got {text!r}") from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise argparse.ArgumentTypeError(f"every tau must be in [0, 1], got {bad[0]}")
    return values


def add_routing_options(g) -> None:
    """--policy, --tau, --router, --threshold, --taus, --k, --fallback, --rollback, --model, --no-pull:
    shared by generate, chat, bench."""
    g.add_argument(
        "--policy",
        choices=POLICIES,
        default="rstitch",
        help="routing policy: rstitch (default; small model, large one where the small one is unsure); "
        "single (one model, given with --model); citer, r2r or collm (a learned router decides which "
        "tokens the large model writes; give --router); escalation (two or more models, usually "
        "three, smallest first, given with --model; --taus); speculative (lossless: the small model "
        "drafts --k tokens, the large one verifies them, so the output is the large model's); bild "
        "(the small model writes, the large one takes over below --fallback and rolls back past "
        "--rollback)",
    )
    g.add_argument(
        "--tau",
        type=float,
        default=0.03,
        help="RStitch threshold on the normalized entropy, in [0, 1] (default 0.03); escalation uses it "
        "for every model without --taus",
    )
    g.add_argument(
        "--router",
        default=None,
        metavar="DIR",
        help="citer, r2r, collm: the router directory written by `tokenrouter train-router` for this "
        "model pair (required for those policies)",
    )
    g.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="citer, r2r, collm: the router's decision threshold in [0, 1] (default: the one picked when "
        "it was trained). R2R defers a token when p >= threshold, CoLLM when p > threshold, CITER when "
        "its confidence < threshold",
    )
    g.add_argument(
        "--taus",
        type=taus,
        default=None,
        metavar="A,B,...",
        help="escalation: one normalized-entropy threshold per model but the largest, smallest first "
        "(default: --tau for each)",
    )
    g.add_argument(
        "--k",
        type=draft_length,
        default=None,
        metavar="N|auto",
        help=f"speculative: the draft length, an integer in [1, {MAX_DRAFT_LENGTH}], or auto (picked from "
        f"the acceptance rate seen lately and the models' step latencies) (default {DEFAULT_K})",
    )
    g.add_argument(
        "--fallback",
        type=fraction(low_open=False, high_open=False),
        default=None,
        metavar="P",
        help="bild: the small model writes while its top probability is at least P, in [0, 1]; below, "
        f"the large model writes the token (default {DEFAULT_FALLBACK})",
    )
    g.add_argument(
        "--rollback",
        type=positive_number,
        default=None,
        metavar="D",
        help="bild: the large model rolls back the first small-model token whose distance, "
        f"-log p_large(token) in nats, exceeds D > 0 (default {DEFAULT_ROLLBACK})",
    )
    g.add_argument(
        "--model",
        action="append",
        type=model_arg,
        default=[],
        metavar="NAME=PATH",
        help="a model as the policy names it (rstitch, citer, r2r, collm, speculative, bild: small, "
        "large; escalation: any "
        "names, smallest first) and where it is: a store name, a .gguf file, a directory holding one "
        "or a Hugging Face directory; repeatable. Default: the demo pair, "
        f"small={store.DEFAULT_MODELS['small']} and large={store.DEFAULT_MODELS['large']}",
    )
    g.add_argument("--no-pull", action="store_true", help="fail instead of fetching a store model that is missing")


def add_precision_option(g) -> None:
    """--precision: what every model computes in (generate, chat, bench, eval)."""
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="what every model computes in: auto (default: on CPU a model with a GGUF (a store model, a "
        ".gguf file, a directory holding one) from the GGUF's own blocks where a timed probe finds them "
        "faster, any other model in float32 or bfloat16, whichever the probe finds faster on this machine; "
        "on a GPU the checkpoint's dtype); float32, bfloat16 (dense weights: a GGUF's written once as a "
        "dense copy); gguf (the GGUF's blocks for every quantized layer; the least memory; CPU only); "
        "gguf+bf16 (those for steps of few rows, bf16 copies for prefill and batches up to the rows a "
        "probe measured, with the bf16 weights' memory on top)",
    )


def add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models and routing")
    add_routing_options(g)
    add_precision_option(g)
    optional_count(
        g, "--threads", "torch threads per worker (default: on CPU the workers take turns, each step on every core)"
    )
    g.add_argument(
        "--kv-cache-tokens", type=positive_int, default=8192, help="KV cache budget per model, in tokens (default 8192)"
    )
    g.add_argument(
        "--device",
        default=None,
        help="torch device of every model, e.g. cuda:0 (default: cuda if available, else cpu); on one GPU each "
        "model's worker runs on its own CUDA stream",
    )
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=positive_int, default=256, help="most tokens to generate (default 256)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1)")
    s.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    s.add_argument("--system", default=None, help="a system message put before the conversation")
    p.add_argument("--no-color", action="store_true", help="never colour the output (also: NO_COLOR set)")
