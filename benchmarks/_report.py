"""Shared by the benchmarks: percentiles, writing a section of docs/performance.md, and
drawing the section's ratio chart into docs/img/bench/<section>.png.

A benchmark builds its :class:`Chart` from the figures of its tables (one
:class:`Panel` per ratio it reports, one :class:`Bar` per row), puts
:func:`chart_link` under its tables, and hands both to :func:`write_section`, which
draws the PNG and rewrites the section: the table and its picture always come from the
same run.
"""

from __future__ import annotations

import re
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "IMAGES",
    "Bar",
    "Chart",
    "Panel",
    "chart_link",
    "draw_chart",
    "percentile",
    "write_section",
]

DOCS = Path(__file__).resolve().parents[1] / "docs"
PERFORMANCE = DOCS / "performance.md"
IMAGES = DOCS / "img" / "bench"
"""Where :func:`write_section` draws each section's chart (``<section>.png``)."""
HEADER = """# Performance

Measured on this project's CI machine (2 cores) by the benchmarks under `benchmarks/`;
each table is rewritten by the command named above it, which also draws the section's
ratios as the chart under its tables (`docs/img/bench/<section>.png`: green bars meet
their goal, red ones miss it, blue ones are not judged; whiskers span the runs). Every
figure is a ratio against a baseline measured in the same run, so the numbers compare
like with like.
"""

WIDTH_IN, DPI = 9.0, 100
"""Charts are ``WIDTH_IN`` inches at ``DPI`` dots per inch: 900 pixels wide."""
_GOOD, _BAD, _PLAIN, _GRID = "#2e7d32", "#c62828", "#5c6bc0", "#9e9e9e"


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``, by linear interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return (
        float(statistics.quantiles(ordered, n=1000, method="inclusive")[int(q * 10) - 1])
        if len(ordered) > 1
        else ordered[0]
    )


@dataclass(frozen=True)
class Bar:
    """One row of a table as a bar: its median ratio and the min–max across runs.

    Args:
        label: the row (Markdown backticks are dropped in the chart).
        value: the median ratio (a share 0–1 in a ``percent`` panel).
        low, high: the smallest and largest per-run value, or ``None`` for no range.
        judged: whether the panel's goal applies to this row (``False``: a reference row,
            drawn in a neutral colour, as a table leaves its ✔ / ✘ off).
    """

    label: str
    value: float
    low: float | None = None
    high: float | None = None
    judged: bool = True


@dataclass(frozen=True)
class Panel:
    """One ratio of a section: a horizontal bar per row, the goal as a dashed line.

    Args:
        title: what the ratio is (subject / baseline).
        bars: the rows.
        goal: the goal's ratio, or ``None``.
        better: ``"lower"`` (goal ≤) or ``"higher"`` (goal ≥).
        percent: the values are shares drawn as percentages (no 1× line).
    """

    title: str
    bars: Sequence[Bar]
    goal: float | None = None
    better: Literal["lower", "higher"] = "lower"
    percent: bool = False

    def met(self, bar: Bar) -> bool | None:
        """Whether ``bar`` meets the goal; ``None`` when nothing is judged."""
        if self.goal is None or not bar.judged:
            return None
        return bar.value <= self.goal if self.better == "lower" else bar.value >= self.goal

    def shown(self, value: float) -> str:
        return f"{value:.0%}" if self.percent else f"{value:.2f}×"

    def shown_goal(self) -> str:
        assert self.goal is not None
        return f"{self.goal:.0%}" if self.percent else f"{self.goal:g}×"


@dataclass(frozen=True)
class Chart:
    """The picture of one section of docs/performance.md: its panels, stacked."""

    title: str
    panels: Sequence[Panel]


def chart_link(name: str, alt: str) -> str:
    """The Markdown image of section ``name``'s chart, as docs/performance.md embeds it."""
    return f"![{alt}](img/bench/{name}.png)"


def _label(text: str) -> str:
    return textwrap.fill(text.replace("`", ""), width=34)


def draw_chart(chart: Chart, path: Path) -> Path:
    """Draw ``chart`` as a PNG at ``path`` (parent folders made), with matplotlib's Agg
    backend (no display needed); returns ``path``.

    The image is 900 pixels wide and 100 dpi; its height grows with the rows.

    Raises:
        ValueError: the chart has no panel, or a panel has no bar.
        OSError: ``path`` cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not chart.panels or any(not p.bars for p in chart.panels):
        raise ValueError(f"chart {chart.title!r}: every panel needs at least one bar")
    heights = [0.55 * len(p.bars) + 0.9 for p in chart.panels]
    fig = Figure(figsize=(WIDTH_IN, sum(heights) + 0.6), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(chart.title, fontsize=12, fontweight="bold", x=0.02, ha="left")
    axes = fig.subplots(len(chart.panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, panel in zip(axes, chart.panels, strict=True):
        bars = list(reversed(panel.bars))  # the table's first row on top
        ys = list(range(len(bars)))
        values = [b.value for b in bars]
        colours = [
            _PLAIN if panel.met(b) is None else _GOOD if panel.met(b) else _BAD for b in bars
        ]
        lows = [b.value - (b.low if b.low is not None else b.value) for b in bars]
        highs = [(b.high if b.high is not None else b.value) - b.value for b in bars]
        ranged = any(b.low is not None or b.high is not None for b in bars)
        ax.barh(
            ys,
            values,
            color=colours,
            height=0.6,
            xerr=[lows, highs] if ranged else None,
            capsize=3,
        )
        top = max(
            [b.high if b.high is not None else b.value for b in bars]
            + [panel.goal or 0.0, 0.0 if panel.percent else 1.0]
        )
        ax.set_xlim(0, top * 1.18 if top > 0 else 1.0)
        for y, bar in zip(ys, bars, strict=True):
            end = bar.high if bar.high is not None else bar.value
            ax.annotate(
                panel.shown(bar.value),
                (end, y),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85},
            )
        if not panel.percent:
            ax.axvline(1.0, color=_GRID, linewidth=1)
        if panel.goal is not None:
            sign = "≤" if panel.better == "lower" else "≥"
            ax.axvline(
                panel.goal,
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"goal {sign} {panel.shown_goal()}",
            )
            ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        if panel.percent:
            ax.xaxis.set_major_formatter(lambda x, _pos: f"{x:.0%}")
        else:
            ax.xaxis.set_major_formatter(lambda x, _pos: f"{x:g}×")
        ax.set_yticks(ys, [_label(b.label) for b in bars], fontsize=8)
        ax.set_title(panel.title.replace("`", ""), loc="left", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.5)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.supxlabel(
        "green: meets its goal · red: misses it · blue: not judged · whiskers: min–max "
        "across runs · grey line: 1× (the baseline)",
        fontsize=8,
        color="#616161",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def write_section(name: str, markdown: str, chart: Chart | None = None) -> None:
    """Replace (or append) the section ``name`` of docs/performance.md; with ``chart``,
    first draw it to ``docs/img/bench/<name>.png``.

    Raises:
        ValueError: a ``chart`` is given but ``markdown`` does not embed it
            (:func:`chart_link`), or the chart is empty (:func:`draw_chart`).
    """
    if chart is not None:
        if f"(img/bench/{name}.png)" not in markdown:
            raise ValueError(f"section {name!r} draws a chart but does not embed it")
        draw_chart(chart, IMAGES / f"{name}.png")
    text = PERFORMANCE.read_text(encoding="utf-8") if PERFORMANCE.exists() else HEADER
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    PERFORMANCE.write_text(text, encoding="utf-8")
