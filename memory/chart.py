"""edge-profile's charts: memory over time by phase, and tokens/s against budget.

The HTML page is self-contained (inline SVG drawn here, inline CSS, no script and no CDN), so it opens offline and
can be attached to a bug report. A PNG is drawn with matplotlib when it is installed; edge does not depend on it.
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edge.errors import EdgeError

MiB = 1 << 20
PHASE_COLORS = ("#dbe9f6", "#fde2c8", "#d9f0d3", "#eadcf0", "#f6f1c6", "#f3d4d4")
WIDTH, HEIGHT = 760, 320
MARGIN = (64, 20, 24, 44)  # left, right, top, bottom


@dataclass(frozen=True)
class Band:
    """A phase drawn as a shaded span of the time axis."""

    label: str
    start: float
    end: float


@dataclass(frozen=True)
class Line:
    label: str
    value: float
    color: str = "#c0392b"


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # label -> points
    bands: list[Band] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)  # horizontal reference lines (budget, predicted peak)
    markers: list[tuple[str, float, float]] = field(default_factory=list)  # labelled single points
    step: bool = False  # draw series as steps (a planner's choices change at thresholds)


class ChartError(EdgeError):
    """A chart cannot be written where it was asked for."""


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    span = hi - lo or abs(hi) or 1.0
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = (lo // step) * step
    return [first + i * step for i in range(count + 3) if first + i * step <= hi + step * 1e-9]


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.3g}"


def svg(chart: Chart) -> str:
    """The chart as an SVG element."""
    points = [p for pts in chart.series.values() for p in pts] + [(m[1], m[2]) for m in chart.markers]
    xs = [x for x, _ in points] + [b.start for b in chart.bands] + [b.end for b in chart.bands]
    ys = [y for _, y in points] + [line.value for line in chart.lines]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y_lo, y_hi = 0.0, (max(ys) * 1.08 if ys else 1.0)
    x_hi = x_hi if x_hi > x_lo else x_lo + 1.0
    left, right, top, bottom = MARGIN
    plot_w, plot_h = WIDTH - left - right, HEIGHT - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo or 1.0) * plot_h

    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{e(chart.title)}">',
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#999"/>']
    for i, band in enumerate(chart.bands):
        x0, x1 = sx(band.start), sx(band.end)
        out.append(f'<rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 0.5):.1f}" height="{plot_h}" '
                   f'fill="{PHASE_COLORS[i % len(PHASE_COLORS)]}"><title>{e(band.label)}</title></rect>')
        out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{top + 12}" font-size="10" text-anchor="middle">'
                   f'{e(band.label)}</text>')
    for tick in _ticks(y_lo, y_hi):
        if tick <= y_hi:
            out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}" '
                       f'stroke="#eee"/><text x="{left - 6}" y="{sy(tick) + 4:.1f}" font-size="10" '
                       f'text-anchor="end">{_fmt(tick)}</text>')
    for tick in _ticks(x_lo, x_hi):
        if x_lo <= tick <= x_hi:
            out.append(f'<text x="{sx(tick):.1f}" y="{top + plot_h + 14}" font-size="10" '
                       f'text-anchor="middle">{_fmt(tick)}</text>')
    colors = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b")
    for i, (label, pts) in enumerate(chart.series.items()):
        if not pts:
            continue
        coords = []
        for j, (x, y) in enumerate(pts):
            if chart.step and j:
                coords.append(f"{sx(x):.1f},{sy(pts[j - 1][1]):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
        out.append(f'<polyline fill="none" stroke="{colors[i % len(colors)]}" stroke-width="1.8" '
                   f'points="{" ".join(coords)}"><title>{e(label)}</title></polyline>')
        for x, y in pts if len(pts) <= 40 else []:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colors[i % len(colors)]}"/>')
    for i, line in enumerate(chart.lines):
        y = sy(line.value)
        # labels alternate between the right and the left end, so two close lines stay readable
        x, anchor = (left + plot_w - 4, "end") if i % 2 == 0 else (left + 4, "start")
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{line.color}" '
                   f'stroke-dasharray="6 4"/><text x="{x}" y="{y - 4:.1f}" font-size="10" '
                   f'text-anchor="{anchor}" fill="{line.color}">{e(line.label)}</text>')
    for label, x, y in chart.markers:
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="5" fill="#d62728"/>'
                   f'<text x="{sx(x) + 8:.1f}" y="{sy(y) - 6:.1f}" font-size="10">{e(label)}</text>')
    legend = [f'<tspan fill="{colors[i % len(colors)]}">&#9632; {e(label)}</tspan> '
              for i, label in enumerate(chart.series)]
    out.append(f'<text x="{left}" y="{HEIGHT - 6}" font-size="11">{e(chart.x_label)} &#8594;   {"".join(legend)}'
               f'</text><text x="14" y="{top + plot_h / 2:.0f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">{e(chart.y_label)}</text></svg>')
    return "\n".join(out)


def html_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_page(title: str, charts: Sequence[Chart], tables: Sequence[tuple[str, str]] = (), notes: str = "") -> str:
    """A standalone page: the tables (caption, table HTML), then each chart under its title."""
    e = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;"
             "margin:8px 0 20px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "th{background:#f4f4f4}pre{background:#f8f8f8;padding:8px}</style></head><body>",
             f"<h1>{e(title)}</h1>"]
    if notes:
        parts.append(f"<pre>{e(notes)}</pre>")
    for caption, table in tables:
        parts.append(f"<h2>{e(caption)}</h2>{table}")
    for chart in charts:
        parts.append(f"<h2>{e(chart.title)}</h2>{svg(chart)}")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write to a temporary file in the same folder, then rename: a reader never sees half a chart."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ChartError(f"cannot write {path}: folder {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_png(path: str | Path, charts: Sequence[Chart]) -> bool:
    """Draw the charts into one PNG with matplotlib; False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(charts), 1, figsize=(9, 3.6 * len(charts)), squeeze=False)
    for ax, chart in zip(axes[:, 0], charts):
        for i, band in enumerate(chart.bands):
            ax.axvspan(band.start, band.end, color=PHASE_COLORS[i % len(PHASE_COLORS)], label=band.label)
        for label, pts in chart.series.items():
            if pts:
                xs, ys = zip(*pts)
                (ax.step if chart.step else ax.plot)(xs, ys, label=label, **({"where": "post"} if chart.step else {}))
        for line in chart.lines:
            ax.axhline(line.value, color=line.color, linestyle="--", label=line.label)
        for label, x, y in chart.markers:
            ax.plot([x], [y], "o", color="#d62728")
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
        ax.set_title(chart.title)
        ax.set_xlabel(chart.x_label)
        ax.set_ylabel(chart.y_label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return True
