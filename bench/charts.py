"""Inline SVG charts of benchmark samples for the HTML report: no script, no external asset.

Both charts use a logarithmic axis, so a 2 ms baseline and a 2 s burst fit on one line and equal
distances mean equal ratios.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from .stats import quartiles

WIDTH, LABEL_W, RIGHT_PAD, ROW_H, AXIS_H, TOP = 820, 210, 20, 26, 34, 8
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
BASELINE_COLOR, MEASURE_COLOR = "#8a8a8a", "#1f4e9a"


@dataclass(frozen=True)
class Distribution:
    """One row of a distribution chart: every successful sample of a measure or a baseline."""

    label: str
    samples: Sequence[float]
    median: float
    p95: float
    baseline: bool = False


@dataclass(frozen=True)
class Point:
    """One dot of a comparison chart: a run's value for a row."""

    row: str
    series: int  # which run (colour)
    value: float
    title: str


class LogAxis:
    """Maps positive values to x pixels, decade ticks labelled 1-2-5."""

    def __init__(self, values: Sequence[float], left: float, right: float) -> None:
        positive = [v for v in values if v > 0] or [1.0]
        self.low = 10 ** math.floor(math.log10(min(positive)))
        self.high = 10 ** math.ceil(math.log10(max(positive)))
        if self.high <= self.low:
            self.high = self.low * 10
        self.left, self.right = left, right

    def x(self, value: float) -> float:
        value = min(max(value, self.low), self.high)
        span = math.log10(self.high) - math.log10(self.low)
        return self.left + (math.log10(value) - math.log10(self.low)) / span * (self.right - self.left)

    def ticks(self) -> list[float]:
        found: list[float] = []
        decade = self.low
        while decade <= self.high * 1.0001:
            found.extend(m * decade for m in (1, 2, 5) if m * decade <= self.high * 1.0001)
            decade *= 10
        return found


def _color(series: int) -> str:
    return PALETTE[series % len(PALETTE)]


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k" if value < 1e6 else f"{value:.0e}"
    return f"{value:g}"


def _axis(axis: LogAxis, top: float, bottom: float, unit: str) -> list[str]:
    parts = [f'<line x1="{axis.left:.1f}" y1="{bottom:.1f}" x2="{axis.right:.1f}" y2="{bottom:.1f}" stroke="#999"/>']
    for tick in axis.ticks():
        x = axis.x(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{bottom + 14:.1f}" text-anchor="middle">{_number(tick)}</text>')
    parts.append(f'<text x="{axis.right:.1f}" y="{bottom + 28:.1f}" text-anchor="end">{escape(unit)} (log)</text>')
    return parts


def _svg(height: float, label: str, body: list[str], kind: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {kind}" role="img" aria-label={quoteattr(label)} '
        f'width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" '
        'font-family="system-ui, sans-serif" font-size="11">' + "".join(body) + "</svg>"
    )


def distribution_chart(rows: Sequence[Distribution], label: str) -> str:
    """Box (quartiles), whiskers (min-max), median bar, p95 tick and every sample as a dot, one row each."""
    axis = LogAxis([v for row in rows for v in row.samples], LABEL_W, WIDTH - RIGHT_PAD)
    bottom = TOP + ROW_H * len(rows)
    body = _axis(axis, TOP, bottom, "ms")
    for index, row in enumerate(rows):
        middle = TOP + ROW_H * index + ROW_H / 2
        color = BASELINE_COLOR if row.baseline else MEASURE_COLOR
        body.append(f'<g class="row" data-label={quoteattr(row.label)}>')
        body.append(
            f"<title>{escape(row.label)}: n={len(row.samples)}, median {row.median:.2f} ms, "
            f"p95 {row.p95:.2f} ms</title>"
        )
        body.append(f'<text x="{LABEL_W - 8}" y="{middle + 4:.1f}" text-anchor="end">{escape(row.label)}</text>')
        if not row.samples:
            body.append(f'<text x="{LABEL_W + 4}" y="{middle + 4:.1f}" fill="#b00020">no successful sample</text></g>')
            continue
        low, high = axis.x(min(row.samples)), axis.x(max(row.samples))
        q1, q3 = (axis.x(q) for q in quartiles(row.samples))
        body.append(f'<line x1="{low:.1f}" y1="{middle:.1f}" x2="{high:.1f}" y2="{middle:.1f}" stroke="{color}"/>')
        body.append(
            f'<rect class="box" x="{q1:.1f}" y="{middle - 7:.1f}" width="{max(q3 - q1, 1):.1f}" height="14" '
            f'fill="{color}" fill-opacity="0.18" stroke="{color}"/>'
        )
        for number, value in enumerate(row.samples):
            jitter = ((number * 7919) % 11 - 5) * 1.1
            body.append(
                f'<circle cx="{axis.x(value):.1f}" cy="{middle + jitter:.1f}" r="1.8" fill="{color}" '
                'fill-opacity="0.45"/>'
            )
        median, p95 = axis.x(row.median), axis.x(row.p95)
        body.append(f'<line class="median" x1="{median:.1f}" y1="{middle - 9:.1f}" x2="{median:.1f}" '
                    f'y2="{middle + 9:.1f}" stroke="#000" stroke-width="2"/>')  # fmt: skip
        body.append(f'<line class="p95" x1="{p95:.1f}" y1="{middle - 5:.1f}" x2="{p95:.1f}" y2="{middle + 5:.1f}" '
                    'stroke="#b00020" stroke-width="1.5"/>')  # fmt: skip
        body.append("</g>")
    return _svg(bottom + AXIS_H, label, body, "distribution")


def comparison_chart(rows: Sequence[str], points: Sequence[Point], legend: Sequence[str], unit: str) -> str:
    """One row per measure, one coloured dot per run: a regression is a dot further right."""
    axis = LogAxis([p.value for p in points] + [1.0], LABEL_W, WIDTH - RIGHT_PAD)
    legend_h = 16 * len(legend)
    top = TOP + legend_h
    bottom = top + ROW_H * len(rows)
    body = [
        f'<g class="legend"><circle cx="{LABEL_W + 6}" cy="{TOP + 16 * i + 4}" r="4" fill="{_color(i)}"/>'
        f'<text x="{LABEL_W + 16}" y="{TOP + 16 * i + 8}">{escape(name)}</text></g>'
        for i, name in enumerate(legend)
    ]
    body += _axis(axis, top, bottom, unit)
    one_x = axis.x(1.0)
    body.append(f'<line x1="{one_x:.1f}" y1="{top:.1f}" x2="{one_x:.1f}" y2="{bottom:.1f}" stroke="#999" '
                'stroke-dasharray="3 3"/>')  # fmt: skip
    for index, row in enumerate(rows):
        middle = top + ROW_H * index + ROW_H / 2
        body.append(f'<text x="{LABEL_W - 8}" y="{middle + 4:.1f}" text-anchor="end">{escape(row)}</text>')
        for point in (p for p in points if p.row == row):
            color = _color(point.series)
            body.append(
                f'<circle class="point" data-series="{point.series}" cx="{axis.x(point.value):.1f}" cy="{middle:.1f}" '
                f'r="5" fill="{color}" fill-opacity="0.8"><title>{escape(point.title)}</title></circle>'
            )
    return _svg(bottom + AXIS_H, "ratio to baseline across runs", body, "comparison")
