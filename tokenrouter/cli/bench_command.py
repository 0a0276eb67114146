"""`tokenrouter bench`: routed serving against standard serving, lockstep and each model alone."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .arguments import (
    UsageError,
    add_precision_option,
    add_routing_options,
    optional_count,
    positive_int,
    positive_seconds,
)
from .engine_setup import device_from_arg, model_paths, model_spec, policy_from_args
from .output import status


def add_parsers(sub) -> None:
    """`tokenrouter bench`: workloads, runs, and the models and policy as for generate."""
    from ..bench import BUILT_IN, SIZES, SYSTEMS

    def sizes(name: str) -> str:
        return ", ".join(f"{k} {v.max_tokens}" for k, v in SIZES[name].items() if k != "tiny")

    b = sub.add_parser(
        "bench",
        help="benchmark routed serving against standard serving and lockstep",
        description="Run the same models, prompts, concurrency levels and KV budget through six serving "
        "systems built from the same workers: routed (this engine), standard (every hand-off re-sent as a new "
        "request with the whole sequence), standard+pc (the same with prefix caching), lockstep (one loop "
        "steps each model in turn), and small and large (each model alone, no routing). The tables give each "
        "system's throughput over standard+pc's, the large model alone's and lockstep's. Workloads: short "
        "(short reasoning), long (long reasoning), agentic "
        "(multi-turn sessions over a long shared history) and agentic-edit (a quoted file asked back edited, "
        "where prompt-lookup drafts pay), generated from --seed, or your own prompts "
        "(--prompts). Each (workload, C, system) gets a fresh engine, a warm-up request and --repeats measured "
        "runs of a closed loop keeping C requests (or agentic sessions) in flight, greedy with EOS ignored. "
        "Prints one line per run on stderr and a table per workload on stdout, and writes results.json, "
        "results.md and plot.png to --out.",
        epilog="Start with `tokenrouter bench --quick` (all workloads at tiny sizes, C = 1 and 3, one run each, "
        "one engine per system: under 4 minutes on the demo pair on 2 cores).",
    )
    w = b.add_argument_group("workloads")
    w.add_argument(
        "--workload",
        nargs="+",
        choices=BUILT_IN,
        default=None,
        metavar="NAME",
        help="which built-in workloads to run: short, long, agentic, agentic-edit (default: the first three, or "
        "none with --prompts)",
    )
    w.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        default=None,
        help='your own prompts: JSON Lines, one {"prompt": text} or {"messages": [chat messages]} per line, '
        'with an optional "max_tokens"; each level takes the first --requests lines, cycled',
    )
    w.add_argument(
        "--size",
        choices=("cpu", "gpu"),
        default=None,
        help="workload sizes: gpu is the real one, cpu is scaled down for a small CPU box (default: gpu with "
        f"CUDA, else cpu). Max output tokens: short {sizes('short')}; long {sizes('long')}; agentic per turn "
        f"{sizes('agentic')}, after a history of {SIZES['agentic']['gpu'].history_tokens} (gpu) or "
        f"{SIZES['agentic']['cpu'].history_tokens} (cpu) tokens, {SIZES['agentic']['gpu'].turns} or "
        f"{SIZES['agentic']['cpu'].turns} turns",
    )
    optional_count(
        w,
        "--max-tokens",
        "override the max output tokens of every workload (short, long: lengths drawn from [N/4, N]; "
        "agentic: per turn; --prompts: lines without max_tokens get N, default the short workload's max)",
    )
    optional_count(w, "--history-tokens", "override the agentic history's (agentic-edit: file's) size, in tokens")
    optional_count(w, "--turns", "override the turns of agentic and agentic-edit sessions")
    w.add_argument("--seed", type=int, default=0, help="seed of the generated prompts and output lengths (default 0)")
    r = b.add_argument_group("runs")
    r.add_argument(
        "--systems",
        nargs="+",
        choices=list(SYSTEMS),
        default=None,
        metavar="SYSTEM",
        help=f"which systems to run: {', '.join(SYSTEMS)} (default: all six)",
    )
    r.add_argument(
        "--concurrency",
        nargs="+",
        type=positive_int,
        default=None,
        metavar="C",
        help="concurrency levels: requests (agentic: sessions) kept in flight (default 1 4 16; --quick 1 3)",
    )
    optional_count(
        r, "--repeats", "measured runs per level, each on a fresh engine; the table shows medians (default 3)"
    )
    optional_count(r, "--requests", "requests (agentic: sessions) per level (default max(8, C); --quick: C)")
    r.add_argument(
        "--max-run-s",
        type=positive_seconds,
        default=None,
        metavar="S",
        help="cap each run's wall time: in-flight requests are cancelled, throughput is over the time it ran, "
        "latencies are of the requests that completed, and the table marks the run with a dagger",
    )
    optional_count(
        r,
        "--kv-cache-tokens",
        "KV cache budget per model, in tokens, the same for every system (default: enough for every "
        "request of the largest level at once, at least 8192)",
    )
    optional_count(
        r,
        "--threads",
        "torch threads per worker of routed and standard, stepping at once (default: on CPU their "
        "workers take turns, each step on every core)",
    )
    optional_count(r, "--threads-lockstep", "torch threads of lockstep's one stepping thread (default: every core)")
    r.add_argument(
        "--reuse-engines",
        action="store_true",
        help="load one engine per system and reuse it for all its runs, forgetting its prefix cache before "
        "each run (as cold as a fresh engine, minutes faster on real models; --quick sets it)",
    )
    r.add_argument("--device", default=None, help="torch device of the models (default: cuda if available, else cpu)")
    r.add_argument(
        "--dtype",
        choices=("auto", "float32", "float64", "bfloat16", "float16"),
        default="auto",
        help="the models' compute dtype, for dtypes --precision does not offer (default auto: as --precision says)",
    )
    add_precision_option(r)
    r.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="directory for results.json, results.md and plot.png (default bench_out/<date>-<time>)",
    )
    r.add_argument(
        "--quick",
        action="store_true",
        help="the smallest meaningful run: all three workloads at tiny sizes (30-50-token prompts, at most 4 "
        "(short) or 6 (long) output tokens; agentic: a 48-token history, 2 turns of 4 tokens), C = 1 and 3 with "
        "C requests each, one repeat, all six systems, one engine per system; flags given explicitly still apply",
    )
    add_routing_options(b.add_argument_group("models and routing"))
    b.set_defaults(run=run)


def run(args, argv) -> int:
    import torch

    from .serve import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(1)  # the caller's thread only waits; workers set their own threads
    return bench(args, argv)


def bench_config(args):
    """Check every bench argument and build the harness's configuration (nothing loaded yet)."""
    import torch

    from ..bench import DEFAULT_WORKLOADS, SESSION_WORKLOADS, SYSTEMS, BenchConfig, read_prompts, workload
    from ..errors import ConfigError

    args.device = device_from_arg(args.device)
    device = torch.device(args.device)
    size = "tiny" if args.quick and args.size is None else args.size or ("gpu" if device.type == "cuda" else "cpu")
    names = list(dict.fromkeys(args.workload or ([] if args.prompts else DEFAULT_WORKLOADS)))
    for flag, value in (("--history-tokens", args.history_tokens), ("--turns", args.turns)):
        if value is not None and not set(SESSION_WORKLOADS) & set(names):
            raise UsageError(f"{flag} is only for the agentic workloads, which this run does not include")
    specs = [
        workload(
            n,
            size,
            max_tokens=args.max_tokens,
            history_tokens=args.history_tokens if n in SESSION_WORKLOADS else None,
            turns=args.turns if n in SESSION_WORKLOADS else None,
        )
        for n in names
    ]
    if args.prompts is not None:
        default = args.max_tokens or workload("short", size).sizes.max_tokens
        try:
            specs.append(read_prompts(args.prompts, default))
        except ConfigError as e:
            raise UsageError(f"--prompts: {e}") from None
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    policy = policy_from_args(args)
    models = model_paths(args, policy)
    dtype, model_options = precision_options(args, models)
    return BenchConfig(
        models=models,
        policy=policy,
        model_options=model_options,
        workloads=specs,
        systems=list(dict.fromkeys(args.systems or SYSTEMS)),
        concurrency=sorted(set(args.concurrency or ([1, 3] if args.quick else [1, 4, 16]))),
        repeats=args.repeats or (1 if args.quick else 3),
        requests=args.requests,
        min_requests=1 if args.quick else 8,
        kv_cache_tokens=args.kv_cache_tokens,
        threads=args.threads,
        threads_lockstep=args.threads_lockstep,
        max_run_s=args.max_run_s,
        reuse_engines=args.reuse_engines or args.quick,
        seed=args.seed,
        device=args.device,
        dtype=dtype,
        warmup_tokens=2 if args.quick else 8,
    )


def precision_options(args, models: dict) -> tuple[str, dict[str, dict]]:
    """--precision (or --dtype) as the bench's dtype and per-model ModelSpec fields: each model's
    spec is built as generate builds it (`model_spec`), so the flag means the same in both."""
    if args.dtype != "auto" and args.precision != "auto":
        raise UsageError(f"--dtype {args.dtype} and --precision {args.precision}: give one of them")
    fields = {"device": args.device} if args.dtype == "auto" else {"device": args.device, "dtype": args.dtype}
    specs = {m: model_spec(m, path, args.precision, **fields) for m, path in models.items()}
    dtypes = {s.dtype for s in specs.values()}
    assert len(dtypes) == 1, dtypes  # --precision and --dtype set one dtype for every model
    options = {m: {"quantization": s.quantization} for m, s in specs.items() if s.quantization != "auto"}
    return dtypes.pop(), options


def bench(args, argv: Sequence[str] | None) -> int:
    import shlex

    import anyio

    from ..bench import markdown, run_bench, write_report
    from ..config import ModelSpec
    from ..engine import load_tokenizer

    cfg = bench_config(args)
    out_dir = Path(args.out or Path("bench_out") / time.strftime("%Y%m%d-%H%M%S"))
    entry = cfg.policy.entry_model
    tokenizer = load_tokenizer(ModelSpec(path=cfg.models[entry]))
    command = shlex.join(["tokenrouter", *(sys.argv[1:] if argv is None else argv)])
    result = anyio.run(lambda: run_bench(cfg, tokenizer, command=command, progress=status))
    written, notes = write_report(result, out_dir)
    print(markdown(result), end="")
    for line in result.warnings:
        status(f"warning: {line}")
    for line in notes:
        status(line)
    status(f"wrote {', '.join(p.name for p in written.values())} to {out_dir} in {result.wall_s:.0f} s")
    return 0
