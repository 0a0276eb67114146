"""results.md and pareto.png, made from results.jsonl alone (so committed raw results can be audited).

Per system, over the problems it finished:

- pass@1: greedy, one answer per problem, the share whose program passed `check` in the sandbox;
- the share of output tokens each model wrote;
- tokens processed per model (what its forwards took in: prompt, catch-ups, recomputation) and
  engine steps per model, each per problem;
- hand-offs per problem;
- relative cost: sum over problems and models of tokens processed x the model's FLOPs per token,
  over the same sum for the largest model alone on the same problems (1.0 is large alone);
- quality s/problem: the quality phase's wall time per problem (planning only: it shares the CPU
  with the sandbox and whatever else ran);
- output tok/s and p50 latency: the speed phase (closed loop at C in flight, see runner.py), the
  median over its runs at the latest setting (C, requests), with their range when there are
  several.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..bench.report import pyplot, save_figure, write_table_and_plot
from .results import RESULTS, ResultsFile, header


@dataclass
class Speed:
    """A system's speed-phase runs at one setting (C in flight over the first N problems)."""

    concurrency: int
    requests: int
    runs: list[dict]

    @property
    def tok_per_s(self) -> float:
        return statistics.median(r["tok_per_s"] for r in self.runs)

    @property
    def p50_s(self) -> float:
        return statistics.median(r["p50_s"] for r in self.runs)

    def cell(self) -> str:
        """Median output tok/s, and the range over the runs when there are several."""
        if len(self.runs) == 1:
            return f"{self.tok_per_s:.2f}"
        rates = [r["tok_per_s"] for r in self.runs]
        return f"{self.tok_per_s:.2f} ({min(rates):.1f}-{max(rates):.1f})"


@dataclass
class Row:
    system: str
    n: int = 0
    passed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    tokens_by_model: dict[str, int] = field(default_factory=dict)
    tokens_processed: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    handoffs: int = 0
    capped: int = 0  # answers cut at max_tokens
    wall_s: float = 0.0
    wall_problems: int = 0
    relative_cost: float | None = None
    cost_problems: int = 0  # problems the relative cost is over (shared with the reference)
    speed_runs: list[dict] = field(default_factory=list)  # every speed record, in file order
    policy: str = ""
    dtype: dict[str, str] = field(default_factory=dict)

    @property
    def pass_at_1(self) -> float | None:
        return self.passed / self.n if self.n else None

    @property
    def output_tokens(self) -> int:
        return sum(self.tokens_by_model.values())

    def share(self, model: str) -> float | None:
        return self.tokens_by_model.get(model, 0) / self.output_tokens if self.output_tokens else None

    @property
    def speed(self) -> Speed | None:
        """The runs at the setting of the latest one (an older setting's runs are not the same work)."""
        if not self.speed_runs:
            return None
        last = self.speed_runs[-1]
        c, n = last["concurrency"], last["requests"]
        return Speed(c, n, [r for r in self.speed_runs if (r["concurrency"], r["requests"]) == (c, n)])


@dataclass
class Summary:
    run: dict
    rows: list[Row]
    reference: str | None  # the system costs are relative to
    models: list[str]

    def plotted(self) -> list[Row]:
        """The systems pareto.png shows: those that finished as many problems as the most
        finished one. A system still running has its pass@1 over the problems done so far, the
        first ones of the file, which are not the same work as everyone else's."""
        most = max((r.n for r in self.rows), default=0)
        return [r for r in self.rows if r.n and r.n == most]


def _add(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def _cost(problem: dict, flops: dict[str, int]) -> float:
    return sum(n * flops.get(m, 0) for m, n in problem["tokens_processed"].items())


def summarize(records: list[dict]) -> Summary:
    run = header(records)
    if run is None:
        raise ValueError("not an eval results file: the first record is not a run record")
    models = list(run["models"])
    flops = {m: info["flops_per_token"] for m, info in run["models"].items()}
    rows: dict[str, Row] = {}
    problems: dict[str, dict[str, dict]] = {}  # system -> task_id -> record (the last wins)
    singles: dict[str, str] = {}  # system -> its one model
    for r in records:
        t = r.get("type")
        if t in ("system", "problem", "segment", "speed"):
            row = rows.setdefault(r["system"], Row(r["system"]))
        if t == "system":
            row.policy, row.dtype = r["policy"], r.get("dtype", {})
            if r["kind"] in ("small", "large", "single"):
                singles[r["system"]] = r["models"][0]
        elif t == "problem":
            problems.setdefault(r["system"], {})[r["task_id"]] = r
        elif t == "segment":
            row.wall_s += r["wall_s"]
            row.wall_problems += r["problems"]
        elif t == "speed":
            row.speed_runs.append(r)
    for name, row in rows.items():
        for p in problems.get(name, {}).values():
            row.n += 1
            row.passed += bool(p["passed"])
            row.statuses[p["status"]] = row.statuses.get(p["status"], 0) + 1
            _add(row.tokens_by_model, p["tokens_by_model"])
            _add(row.tokens_processed, p["tokens_processed"])
            _add(row.steps, p["steps_delta"])
            row.handoffs += p["handoffs"]
            row.capped += p.get("finish_reason") == "length"
    # The reference: the largest model (by FLOPs per token) alone, if it ran.
    largest = max(models, key=lambda m: flops[m])
    reference = next((s for s, m in singles.items() if m == largest and problems.get(s)), None)
    if reference is not None:
        ref = problems[reference]
        for name, row in rows.items():
            mine = problems.get(name, {})
            common = sorted(set(mine) & set(ref))
            base = sum(_cost(ref[t], flops) for t in common)
            if common and base > 0:
                row.relative_cost = sum(_cost(mine[t], flops) for t in common) / base
                row.cost_problems = len(common)
    return Summary(run, list(rows.values()), reference, models)


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
    dtypes = {}
    for row in s.rows:
        for m, d in row.dtype.items():
            dtypes.setdefault(m, set()).add(d)
    for m, info in run["models"].items():
        computed = f", computed in {'/'.join(sorted(dtypes[m]))}" if m in dtypes else ""
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


def pareto_front(points: list[tuple[float, float]], lower_x_better: bool) -> list[int]:
    """Indices of the points no other point beats on both axes (higher y, and lower or higher x)."""
    front = []
    for i, (x, y) in enumerate(points):
        beaten = False
        for j, (x2, y2) in enumerate(points):
            if j == i:
                continue
            better_x = x2 <= x if lower_x_better else x2 >= x
            strictly = (x2 != x) or (y2 != y)
            if better_x and y2 >= y and strictly:
                beaten = True
                break
        if not beaten:
            front.append(i)
    return front


Box = tuple[float, float, float, float]  # x0, y0, x1, y1, in points on the figure

# Where a label may go relative to its point, in points (dx, dy of its lower corner) and which
# side of the point it sits on: right, right a line down, left, left a line down, then ever more
# lines up or down on either side (the far ones, drawn with a leader line, for crowded corners).
LABEL_SLOTS: tuple[tuple[float, float, str], ...] = (
    (5, 3, "left"),
    (5, -12, "left"),
    (-5, 3, "right"),
    (-5, -12, "right"),
    (5, 13, "left"),
    (5, -22, "left"),
    (-5, 13, "right"),
    (-5, -22, "right"),
    (5, 23, "left"),
    (5, -32, "left"),
    (-5, 23, "right"),
    (-5, -32, "right"),
    (5, 33, "left"),
    (5, -42, "left"),
    (-5, 33, "right"),
    (-5, -42, "right"),
    (5, -52, "left"),
    (-5, -52, "right"),
    (5, -62, "left"),
    (-5, -62, "right"),
)


def label_box(anchor: tuple[float, float], size: tuple[float, float], slot: tuple[float, float, str]) -> Box:
    """The box a label of `size` (w, h) takes when set at `slot` from its point `anchor`."""
    (x, y), (w, h), (dx, dy, ha) = anchor, size, slot
    x0 = x + dx if ha == "left" else x + dx - w
    return (x0, y + dy, x0 + w, y + dy + h)


def overlap(a: Box, b: Box) -> float:
    """The area two boxes share."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def place_labels(
    anchors: list[tuple[float, float]],
    sizes: list[tuple[float, float]],
    bounds: Box,
    obstacles: list[Box] | None = None,
    marker: float = 4.0,
) -> list[tuple[float, float, str]]:
    """A slot (LABEL_SLOTS) per label, so that labels of nearby points are not printed over
    each other: in order, each takes the first slot whose box stays inside `bounds` and touches
    neither a label placed before it, nor an obstacle (the legend), nor any point's marker (a
    square of side 2 x `marker`); when none is free, the slot that overlaps least. Everything in
    points on the figure."""
    fixed = [(x - marker, y - marker, x + marker, y + marker) for x, y in anchors] + list(obstacles or [])
    placed: list[Box] = []
    slots = []
    for anchor, size in zip(anchors, sizes):

        def clash(slot, anchor=anchor, size=size) -> float:
            box = label_box(anchor, size, slot)
            inside = box[0] >= bounds[0] and box[1] >= bounds[1] and box[2] <= bounds[2] and box[3] <= bounds[3]
            hit = sum(overlap(box, other) for other in placed + fixed)
            return hit + (0.0 if inside else size[0] * size[1])

        best = min(LABEL_SLOTS, key=clash)  # min keeps the first of equals: the preferred slot
        slots.append(best)
        placed.append(label_box(anchor, size, best))
    return slots


def annotate_points(ax, names: list[str], pts: list[tuple[float, float]]) -> None:
    """Label each point of a laid-out axes with its name, the labels placed by `place_labels`
    from their measured sizes, so that none hides another."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    to_pt = 72.0 / fig.dpi  # window extents are in pixels; offsets and fonts in points

    def box(extent) -> Box:
        return (extent.x0 * to_pt, extent.y0 * to_pt, extent.x1 * to_pt, extent.y1 * to_pt)

    texts = [
        ax.annotate(
            name,
            xy,
            textcoords="offset points",
            xytext=(0, 0),
            fontsize="small",
            va="bottom",
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey", "shrinkA": 1, "shrinkB": 3},
        )
        for name, xy in zip(names, pts)
    ]
    sizes = [(b[2] - b[0], b[3] - b[1]) for b in (box(t.get_window_extent(renderer)) for t in texts)]
    anchors = [(float(x) * to_pt, float(y) * to_pt) for x, y in ax.transData.transform(pts)] if pts else []
    legend = ax.get_legend()
    obstacles = [box(legend.get_window_extent(renderer))] if legend is not None else []
    for text, (dx, dy, ha) in zip(texts, place_labels(anchors, sizes, box(ax.get_window_extent(renderer)), obstacles)):
        text.xyann = (dx, dy)
        text.set_horizontalalignment(ha)


def plot(s: Summary, path: str | Path) -> Path | None:
    """pareto.png: pass@1 against relative cost and against output tok/s, one point per system
    that has finished (`Summary.plotted`), the Pareto front joined. None when matplotlib is not
    installed."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (
        (axes[0], "relative cost (large alone = 1)", lambda r: r.relative_cost, True),
        (axes[1], "output tokens/s (speed phase)", lambda r: r.speed.tok_per_s if r.speed else None, False),
    )
    colours = {r.system: f"C{i % 10}" for i, r in enumerate(s.rows)}  # one colour per system in both panels
    labels = []
    for ax, xlabel, getx, lower in panels:
        rows = [r for r in s.plotted() if getx(r) is not None]
        pts = [(getx(r), r.pass_at_1) for r in rows]
        front = set(pareto_front(pts, lower))
        for i, (r, (x, y)) in enumerate(zip(rows, pts)):
            ax.scatter(
                [x],
                [y],
                s=60 if i in front else 30,
                marker="o",
                zorder=3,
                color=colours[r.system],
                edgecolors="black" if i in front else "none",
            )
        line = sorted(pts[i] for i in front)
        if len(line) > 1:
            ax.plot([p[0] for p in line], [p[1] for p in line], "k--", lw=1, zorder=2, label="Pareto front")
            # the corner the front leaves empty: it rises to the right on cost, falls on speed
            ax.legend(fontsize="small", loc="lower right" if lower else "upper right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("pass@1")
        ax.grid(True, alpha=0.3)
        if not rows:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        # the front's labels first, so that theirs get the places next to their points
        order = sorted(range(len(rows)), key=lambda i: (i not in front, i))
        labels.append((ax, [rows[i].system for i in order], [pts[i] for i in order]))
    models = ", ".join(f"{m}: {info['description'].split(';')[0]}" for m, info in s.run["models"].items())
    title = f"HumanEval pass@1; {models}"
    fig.suptitle(title, fontsize="small")
    fig.tight_layout()  # labels are placed on the final layout (save_figure's own changes nothing)
    for ax, names, pts in labels:
        annotate_points(ax, names, pts)
    return save_figure(fig, path, title)


def write_report(out_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """results.md and pareto.png from `out_dir/results.jsonl`; (paths written, notes)."""
    out = Path(out_dir)
    rf = ResultsFile(out / RESULTS)
    if not rf.exists():
        raise FileNotFoundError(f"{rf.path}: no results to report on")
    summary = summarize(rf.read())
    return write_table_and_plot(out, "results.md", markdown(summary), "pareto.png", lambda p: plot(summary, p))
