"""pareto.png: pass@1 against relative cost and against speed, one point per system, the Pareto
front joined. Apart from the table (report.py) because it alone needs matplotlib, which is
optional: without it the report is the table alone.
"""

from __future__ import annotations

from pathlib import Path

from ..bench import pyplot, save_figure
from .label_placement import annotate_points
from .summary import Summary


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


__all__ = ["pareto_front", "plot"]
