"""results.md and pareto.png, made from results.jsonl alone (so committed raw results can be audited).

This module makes the table and writes both files; what the numbers mean is in summary.py, the
figure is pareto.py.
"""

from __future__ import annotations

from pathlib import Path

from ..bench import write_table_and_plot
from .pareto import plot
from .results import RESULTS, ResultsFile
from .summary import Summary, summarize


def _count(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} "


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(s: Summary) -> str:
    run, models = s.run, s.models
    slash = "/".join(models)
    lines = ["# HumanEval: pass@1 against cost and speed", ""]
    lines.append(
        f"Greedy pass@1 over HumanEval-format problems ({run['data'].get('source', '?')}, "
        f"{run['data'].get('problems', '?')} in the file), prompt version {run['prompt_version']}, "
        f"at most {run['max_tokens']} new tokens, each program tested in the sandbox "
        f"(timeout {run['sandbox']['timeout_s']:g} s)."
    )
    lines += ["", "Models:", ""]
    dtypes, kernels = {}, {}
    for row in s.rows:
        for m, d in row.dtype.items():
            dtypes.setdefault(m, set()).add(d)
        for m, k in row.linear_kernel.items():
            kernels.setdefault(m, set()).add(k)
    for m, info in run["models"].items():
        computed = f", computed in {'/'.join(sorted(dtypes[m]))}" if m in dtypes else ""
        if kernels.get(m):  # which linear kernels: a GGUF's own 4-bit weights, or dense ones
            computed += f" (linear layers: {'/'.join(sorted(kernels[m]))})"
        lines.append(
            f"- `{m}`: {info['description']}{computed}; {_count(info['parameters'])} parameters, "
            f"{_count(info['flops_per_token'])}FLOPs per token (2 x the parameters but the input embedding)"
        )
    lines.append("")
    header_row = (
        f"| system | pass@1 | passed | output tokens /problem | tokens written {slash} "
        f"| tokens processed {slash} /problem "
        f"| steps {slash} /problem | hand-offs /problem | relative cost | output tok/s | p50 latency (s) "
        "| quality s/problem |"
    )
    lines += [header_row, "|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for row in s.rows:
        if not row.n:  # started, not one problem finished: named under the table
            continue
        n = row.n
        shares = "/".join(_f(row.share(m), "{:.0%}") for m in models)
        processed = "/".join(f"{row.tokens_processed.get(m, 0) / n:.0f}" for m in models)
        steps = "/".join(f"{row.steps.get(m, 0) / n:.0f}" for m in models)
        sp = row.speed
        tok_s, p50 = (sp.cell(), _f(sp.p50_s)) if sp else ("-", "-")
        lines.append(
            f"| {row.system} | {_f(row.pass_at_1, '{:.3f}')} | {row.passed}/{row.n} | {row.output_tokens / n:.0f} "
            f"| {shares} | {processed} | {steps} "
            f"| {row.handoffs / n:.1f} | {_f(row.relative_cost)} | {tok_s} | {p50} "
            f"| {_f(row.wall_s / row.wall_problems if row.wall_problems else None, '{:.1f}')} |"
        )
    lines.append("")
    if s.reference is not None:
        lines.append(
            f"Relative cost: tokens processed per model x FLOPs per token, summed over the problems, over "
            f"`{s.reference}`'s on the same problems."
        )
    else:
        lines.append("Relative cost: `-`, because the largest model alone did not run.")
    speeds = [(r.system, r.speed) for r in s.rows if r.speed]
    if speeds:
        settings: dict[tuple[int, int], list[str]] = {}
        for system, sp in speeds:
            settings.setdefault((sp.concurrency, sp.requests), []).append(system)
        if len(settings) == 1:
            ((c, n),) = settings
            how = f"C = {c} requests in flight over the first {n} problems"
        else:  # systems measured at different settings: say which is which
            how = "; ".join(
                f"C = {c} over the first {n} problems for {', '.join(names)}" for (c, n), names in settings.items()
            )
        counts = sorted({len(sp.runs) for _, sp in speeds})
        if counts == [1]:
            runs = "one run per system"
        elif len(counts) == 1:
            runs = f"the median of {counts[0]} runs per system (their range in parentheses), the systems taking turns"
        else:
            runs = (
                "the median of each system's runs (their range in parentheses; "
                + ", ".join(f"{system} {len(sp.runs)}" for system, sp in speeds)
                + "), the systems taking turns"
            )
        runs_all = [r for _, sp in speeds for r in sp.runs]
        m = runs_all[-1].get("machine", {})
        dates = sorted({r["date"][:10] for r in runs_all})
        loads = [x for r in runs_all for x in r.get("load_average", [])]
        load = f"; the 1-minute load average over the runs was {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        lines.append(
            f"Speed: its own phase, per system on a warmed engine with an empty prefix cache: a closed loop keeping "
            f"{how}, the same prompt and stop string as the quality phase; output tok/s = output tokens / wall "
            f"time, latency from submission to the end of each request; {runs}. Measured {', '.join(dates)} on "
            f"{m.get('cpu') or '?'} ({m.get('cpu_count', '?')} CPUs{', ' + m['cuda'] if m.get('cuda') else ''}){load}."
        )
    plotted = s.plotted()
    most = plotted[0].n if plotted else 0
    partial = [f"{r.system} ({r.n} of {most})" for r in s.rows if r.n and r not in plotted]
    if partial:
        lines.append(
            f"Still running (pass@1 over the problems finished so far; left out of pareto.png): {', '.join(partial)}."
        )
    waiting = [r.system for r in s.rows if not r.n]
    if waiting:
        lines.append(f"Not run yet: {', '.join(waiting)}.")
    failures = {}
    for row in s.rows:
        for k, v in row.statuses.items():
            if k != "passed":
                failures.setdefault(row.system, []).append(f"{k} {v}")
        if row.capped:
            failures.setdefault(row.system, []).append(f"(answers cut at max_tokens: {row.capped})")
    if failures:
        lines += ["", "Failures by kind: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in failures.items()) + "."]
    lines += [
        "",
        f"Made from `{RESULTS}` by `tokenrouter eval --report-only`; first command: `{run.get('command', '')}`.",
    ]
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """results.md and pareto.png from `out_dir/results.jsonl`; (paths written, notes)."""
    out = Path(out_dir)
    rf = ResultsFile(out / RESULTS)
    if not rf.exists():
        raise FileNotFoundError(f"{rf.path}: no results to report on")
    summary = summarize(rf.read())
    return write_table_and_plot(out, "results.md", markdown(summary), "pareto.png", lambda p: plot(summary, p))


__all__ = ["markdown", "write_report"]
