"""The benchmark's outputs: results.json (everything), results.md (a table per workload) and
plot.png (per workload, throughput and p50 latency against concurrency, a line per system).

The tables follow docs/benchmarks.md: speed-ups are ratios of median output tokens/s against
standard serving with prefix caching (the headline), the large model alone and lockstep at the
same concurrency, measured side by side in the same run.
"""

from __future__ import annotations

import json
from pathlib import Path

from .metrics import Summary
from .results import BenchResult

DAGGER = "†"
PLOT_HINT = "pip install 'tokenrouter[bench]'"


def write_json(result: BenchResult, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _num(v, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ratio(s: Summary, base: Summary | None) -> str:
    if base is None or not base.metrics["tok_per_s"]:
        return "-"
    return f"{s.metrics['tok_per_s'] / base.metrics['tok_per_s']:.2f}"


def markdown(result: BenchResult) -> str:
    """A table per workload: C, system, output tok/s, x standard+pc, x large (alone), x lockstep,
    p50, p99, TTFT p50, tokens each model wrote, hand-offs (medians over repeats)."""
    models = list(result.models)
    lines = []
    cut = mismatch = False
    for name, info in result.workloads.items():
        rows = [s for s in result.summaries if s.workload == name]
        lines += [f"### {name}: {info['description']}", ""]
        lines.append(
            "| C | system | output tok/s | x standard+pc | x large | x lockstep | p50 latency (s) | p99 latency (s) "
            f"| TTFT p50 (s) | tokens {'/'.join(models)} | hand-offs |"
        )
        lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for s in rows:
            same_c = {r.system: r for r in rows if r.concurrency == s.concurrency}
            m = s.metrics
            mark = DAGGER if s.cut_short else ""
            mark += "*" if s.same_tokens_as_routed is False else ""
            cut, mismatch = cut or s.cut_short, mismatch or s.same_tokens_as_routed is False
            tokens = "/".join(_num(m["tokens_by_model"].get(x, 0), "{:g}") for x in models)
            lines.append(
                f"| {s.concurrency} | {s.system} | {m['tok_per_s']:.2f}{mark} | {_ratio(s, same_c.get('standard+pc'))} "
                f"| {_ratio(s, same_c.get('large'))} | {_ratio(s, same_c.get('lockstep'))} "
                f"| {_num(m['p50_s'])} | {_num(m['p99_s'])} "
                f"| {_num(m['ttft_p50_s'])} | {tokens} | {_num(m['handoffs'], '{:g}')} |"
            )
        lines.append("")
    if cut:
        lines.append(
            f"{DAGGER} cut short by --max-run-s: throughput over the time it ran, latencies of the requests "
            "that completed (results.json has the counts)."
        )
    if mismatch:
        lines.append("* greedy tokens differ from routed's (see the warnings in results.json).")
    return "\n".join(lines).rstrip() + "\n"


def pyplot():
    """matplotlib's pyplot on a file-only backend, or None when matplotlib is not installed
    (plots are optional: `pip install 'tokenrouter[bench]'`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path: str | Path, title: str) -> Path:
    """Title, lay out, write as PNG and close a figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot(result: BenchResult, path: str | Path) -> Path | None:
    """plot.png; None when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return None
    names = list(result.workloads)
    fig, axes = plt.subplots(len(names), 2, figsize=(10, 3.2 * len(names)), squeeze=False)
    for row, name in zip(axes, names):
        rows = [s for s in result.summaries if s.workload == name]
        levels = sorted({s.concurrency for s in rows})
        for system in dict.fromkeys(s.system for s in rows):
            mine = sorted((s for s in rows if s.system == system), key=lambda s: s.concurrency)
            xs = [s.concurrency for s in mine]
            row[0].plot(xs, [s.metrics["tok_per_s"] for s in mine], marker="o", label=system)
            p50 = [(s.concurrency, s.metrics["p50_s"]) for s in mine if s.metrics["p50_s"] is not None]
            row[1].plot([c for c, _ in p50], [v for _, v in p50], marker="o", label=system)
        for ax, ylabel in zip(row, ("output tokens/s", "p50 latency (s)")):
            ax.set_title(f"{name}: {ylabel}")
            ax.set_xlabel("concurrency")
            ax.set_ylabel(ylabel)
            if len(levels) > 1 and levels[-1] / levels[0] >= 4:
                ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        row[0].legend(fontsize="small")
    models = ", ".join(f"{m}={Path(p).name}" for m, p in result.models.items())
    return save_figure(fig, path, f"{models}; {result.policy}")


def write_report(result: BenchResult, out_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """Write results.json, results.md and plot.png into `out_dir`; (paths written, notes)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, notes = write_table_and_plot(out, "results.md", markdown(result), "plot.png", lambda p: plot(result, p))
    return {"json": write_json(result, out / "results.json"), **written}, notes


def write_table_and_plot(out: Path, md_name: str, text: str, png_name: str, draw) -> tuple[dict[str, Path], list[str]]:
    """Write the markdown table, and the plot `draw(path)` makes if matplotlib is installed (else a
    note saying how to get it); (paths written, notes)."""
    md = out / md_name
    md.write_text(text, encoding="utf-8")
    written, notes = {"markdown": md}, []
    png = draw(out / png_name)
    if png is None:
        notes.append(f"{png_name} skipped: matplotlib is not installed ({PLOT_HINT})")
    else:
        written["plot"] = png
    return written, notes
