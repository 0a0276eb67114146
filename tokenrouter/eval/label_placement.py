"""Labels for the points of a scatter plot, placed so that none hides another or a point: the
systems of pareto.png often crowd one corner. The placing (`place_labels`) is arithmetic on boxes,
testable without a figure; `annotate_points` measures the labels on a laid-out figure and applies it.
"""

from __future__ import annotations

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


__all__ = ["LABEL_SLOTS", "Box", "annotate_points", "label_box", "overlap", "place_labels"]
