"""The report's load view: per load run a table of operations and, as inline SVG, RPS and p95 over time."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from .charts import PALETTE, WIDTH, LogAxis, _number, _svg
from .redaction import Redactor
from .results import Run
from .soak.pace import pace_line, retries_line

LOAD_JSON = "load.json"


def read_load(run_dir: Path) -> dict[str, Any] | None:
    """The run's load.json, or None when it is not a load run."""
    path = run_dir / LOAD_JSON
    return json.loads(path.read_text("utf-8")) if path.is_file() else None


HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 210, 60, 170, 22, 34
FAILURE_COLOR = "#b00020"


@dataclass(frozen=True)
class Series:
    """One line of a time chart: (seconds since the start, value) points; None values are gaps."""

    label: str
    points: Sequence[tuple[float, float | None]]
    color: str


class LinearAxis:
    """Maps 0..high (rounded up to a 1-2-5 step) onto pixels, with about five ticks."""

    def __init__(self, values: Sequence[float], start: float, end: float) -> None:
        top = max([v for v in values if v > 0] or [1.0])
        step = 10 ** math.floor(math.log10(top / 5)) if top > 0 else 1.0
        step = next(m * step for m in (1, 2, 5, 10) if top / (m * step) <= 5)
        self.high, self.step, self.start, self.end = step * math.ceil(top / step), step, start, end

    def at(self, value: float) -> float:
        return self.start + min(max(value, 0.0), self.high) / self.high * (self.end - self.start)

    def ticks(self) -> list[float]:
        return [self.step * i for i in range(round(self.high / self.step) + 1)]


def time_chart(series: Sequence[Series], label: str, unit: str, log: bool) -> str:
    """Lines over time; y linear from 0, or logarithmic (latencies) so that equal distances are equal ratios."""
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    values = [v for s in series for _, v in s.points if v is not None]
    times = [t for s in series for t, _ in s.points] or [1.0]
    x = LinearAxis(times, LEFT, right)
    y: LinearAxis | LogAxis = LogAxis(values, bottom, TOP) if log else LinearAxis(values, bottom, TOP)
    to_y = y.x if isinstance(y, LogAxis) else y.at
    body = [f'<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#999"/>']
    for tick in y.ticks():
        at = to_y(tick)
        body.append(f'<line x1="{LEFT}" y1="{at:.1f}" x2="{right}" y2="{at:.1f}" stroke="#eee"/>')
        body.append(f'<text x="{LEFT - 6}" y="{at + 4:.1f}" text-anchor="end">{_number(tick)}</text>')
    for tick in x.ticks():
        at = x.at(tick)
        body.append(f'<text x="{at:.1f}" y="{bottom + 14}" text-anchor="middle">{_number(tick)}</text>')
    body.append(f'<text x="{right}" y="{bottom + 28}" text-anchor="end">seconds since the start</text>')
    body.append(f'<text x="6" y="{TOP - 8}">{escape(unit)}{" (log)" if log else ""}</text>')
    for index, line in enumerate(series):
        pairs = [(x.at(t), to_y(v)) for t, v in line.points if v is not None]
        legend_y = TOP + 14 * index + 8
        body.append(
            f'<g class="series" data-label="{escape(line.label)}">'
            f'<polyline fill="none" stroke="{line.color}" stroke-width="1.5" '
            f'points="{" ".join(f"{px:.1f},{py:.1f}" for px, py in pairs)}"/>'
            f'<line x1="{right + 10}" y1="{legend_y - 4}" x2="{right + 24}" y2="{legend_y - 4}" stroke="{line.color}" '
            f'stroke-width="2"/><text x="{right + 28}" y="{legend_y}">{escape(line.label)}</text></g>'
        )
    return _svg(HEIGHT, label, body, "timeline")


def charts(document: dict[str, Any]) -> tuple[str, str]:
    """The RPS (and failures) chart and the per-operation p95 chart of one load.json."""
    points = document["timeline"]["points"]
    width = float(document["timeline"]["bucket_s"])
    middle = [p["t"] + width / 2 for p in points]
    rate = [
        Series("requests/s", list(zip(middle, (p["rps"] for p in points), strict=True)), PALETTE[0]),
        Series("failures/s", list(zip(middle, (p["failures"] / width for p in points), strict=True)), FAILURE_COLOR),
        Series("users", list(zip(middle, (float(p["users"]) for p in points), strict=True)), PALETTE[2]),
    ]
    names = sorted({name for p in points for name in p["p95_ms"]})
    latency = [
        Series(name, [(t, p["p95_ms"].get(name)) for t, p in zip(middle, points, strict=True)], PALETTE[i % 8])
        for i, name in enumerate(names)
    ]
    run_id = document["run_id"]
    return (
        time_chart(rate, f"requests, failures and users over time, {run_id}", "per second / users", log=False),
        time_chart(latency, f"p95 latency per operation over time, {run_id}", "p95 ms", log=True),
    )


def memory_chart(document: dict[str, Any]) -> str | None:
    """The endpoint's memory over the load (its own processes, and with its sandboxes), when it was sampled."""
    memory = document.get("memory")
    if not memory or not memory["timeline"]:
        return None
    points = [row for row in memory["timeline"] if row[0] >= 0]
    series = [
        Series("endpoint", [(t, own) for t, own, _, _ in points], PALETTE[0]),
        Series("with its sandboxes", [(t, tree) for t, _, tree, _ in points], PALETTE[1]),
    ]
    return time_chart(series, f"endpoint memory over time, {document['run_id']}", "MiB", log=False)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def load_view(runs: Sequence[Run], redactor: Redactor) -> list[dict[str, Any]]:
    """The report's load section: one entry per run with a load.json."""
    from markupsafe import Markup

    entries = []
    for run in runs:
        document = read_load(run.path)
        if document is None:
            continue
        rate_svg, latency_svg = charts(document)
        p95 = document["run_true_p95"]
        summary = {
            "run_id": run.run_id,
            "endpoint": run.header["endpoint"]["name"],
            "mode": document["mode"],
            "settings": document["settings"],
            "rows": [
                {"name": name, **f, **{k: _ms(f[k]) for k in ("p50_ms", "p95_ms", "p99_ms")}}
                for name, f in document["operations"].items()
            ],
            "run_true": None
            if p95["ratio"] is None
            else f"{_ms(p95['load_ms'])} ms under load, {_ms(p95['idle_ms'])} ms idle: {p95['ratio']:.2f}x",
            "failures": document["failures"],
            "sandboxes": document["sandboxes"],
            "client_cpu": document["client_cpu"],
            "retries": retries_line(document["refused"]) if "refusals" in document["refused"] else None,
            "pace": pace_line(document["pace"]) if document.get("pace") else None,
            "host": document.get("host"),
            "memory": {k: v for k, v in document.get("memory", {}).items() if k != "timeline"} or None,
        }
        svgs = {"rate_svg": rate_svg, "latency_svg": latency_svg}
        memory_svg = memory_chart(document)
        if memory_svg is not None:
            svgs["memory_svg"] = memory_svg
        markup = {key: Markup(redactor.redact_text(svg)) for key, svg in svgs.items()}
        entries.append({**redactor.redact_obj(summary), **markup})
    return entries
