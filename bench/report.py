"""Self-contained HTML matrix and Markdown summary (for `$GITHUB_STEP_SUMMARY`) from run directories."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from bench.loadview import load_view
from bench.redaction import Redactor
from bench.results import OUTCOMES, Run, atomic_write, read_run

TEMPLATES = Path(__file__).resolve().parents[1] / "reports" / "templates"
SYMBOLS = {"pass": "✔", "fail": "✘", "refused": "⊘", "deviation": "≠", "error": "!", "skip": "\u2013"}
ERROR_PREVIEW = 200
SYMPTOM_PREVIEW = 600  # what a failing cell shows of its error: enough for the observed symptom
FAILING = ("fail", "error", "deviation")
REGRESSION = 1.2  # a benchmark ratio this much above the first run's is flagged
FRAME_COLUMNS = [
    *("run_id", "endpoint", "stamp", "row", "column"),
    *("id", "runner", "outcome", "expected", "conformant", "duration_ms", "error", "note", "details"),
]


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path


@dataclass(frozen=True)
class Column:
    """One (run, runner) pair: a column of the matrix."""

    key: str
    run_id: str
    runner: str
    label: str


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    endpoint: str
    suite: str
    status: str
    started_at: str
    counts: dict[str, int]
    conformant: int
    nonconformant: int
    pins: dict[str, dict[str, str]]


def _stamp(run: Run) -> str:
    started = str(run.header["started_at"])
    return started[:19].replace("T", " ") + "Z"


def _frame(runs: Sequence[Run]) -> pd.DataFrame:
    rows = [
        {
            "run_id": run.run_id,
            "endpoint": run.header["endpoint"]["name"],
            "stamp": _stamp(run),
            "runner": case.runner,
            "row": f"{case.suite}/{case.case}",
            "column": f"{run.run_id}/{case.runner}",
            **case.to_dict(),
        }
        for run in runs
        for case in run.cases
    ]
    frame = pd.DataFrame(rows, columns=FRAME_COLUMNS)
    # A case recorded twice (a retry) shows its last record.
    return frame.drop_duplicates(subset=["row", "column"], keep="last").reset_index(drop=True)


def _summaries(runs: Sequence[Run], frame: pd.DataFrame) -> list[RunSummary]:
    counts = pd.crosstab(frame["run_id"], frame["outcome"]) if len(frame) else pd.DataFrame()
    conformant = frame.groupby("run_id")["conformant"].agg(["sum", "size"])
    summaries = []
    for run in runs:
        by_outcome = counts.loc[run.run_id] if run.run_id in counts.index else {}
        good, total = conformant.loc[run.run_id] if run.run_id in conformant.index else (0, 0)
        summaries.append(
            RunSummary(
                run_id=run.run_id,
                endpoint=run.header["endpoint"]["name"],
                suite=run.header["suite"],
                status=run.status,
                started_at=_stamp(run),
                counts={outcome: int(by_outcome.get(outcome, 0)) for outcome in OUTCOMES},
                conformant=int(good),
                nonconformant=int(total - good),
                pins=run.header["pins"],
            )
        )
    return summaries


def _preview(error: str | None, limit: int = ERROR_PREVIEW) -> str:
    """The error on one line, at most `limit` characters."""
    text = " ".join((error or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cell(index: int, record: pd.Series, label: str) -> dict[str, Any]:
    duration = record["duration_ms"]
    has_duration = duration is not None and not (isinstance(duration, float) and math.isnan(duration))
    title = f"{record['outcome']} · {duration:.1f} ms" if has_duration else str(record["outcome"])
    if not record["conformant"]:
        title += f" · non-conformant (expected {record['expected']})"
    error = record["error"] if isinstance(record["error"], str) else None
    symptom = _preview(error, SYMPTOM_PREVIEW) if record["outcome"] in FAILING else ""
    return {
        "anchor": f"case-{index}",
        "id": record["id"],
        "row": record["row"],
        "run_id": record["run_id"],
        "runner": record["runner"],
        "label": label,
        "outcome": record["outcome"],
        "expected": record["expected"],
        "conformant": bool(record["conformant"]),
        "symbol": SYMBOLS[record["outcome"]],
        "title": title,
        "duration": f"{duration:.1f} ms" if has_duration else "—",
        "note": record["note"] if isinstance(record["note"], str) else None,
        "error": error,
        "error_preview": _preview(error),
        "symptom": symptom,
        "details_json": json.dumps(record["details"], indent=2, sort_keys=True, ensure_ascii=False),
    }


def _columns(frame: pd.DataFrame) -> list[Column]:
    columns: list[Column] = []
    for key, group in frame.groupby("column", sort=False):
        first = group.iloc[0]
        label = f"{first['endpoint']} · {first['runner']} · {first['stamp']}"
        if any(column.label == label for column in columns):
            label += f" ({first['run_id']})"
        columns.append(Column(key=str(key), run_id=first["run_id"], runner=first["runner"], label=label))
    return columns


def _model(runs: Sequence[Run], redactor: Redactor) -> dict[str, Any]:
    frame = _frame(runs)
    columns = _columns(frame)
    labels = {column.key: column.label for column in columns}
    cells = [_cell(int(index), record, labels[record["column"]]) for index, record in frame.iterrows()]
    grid = frame.reset_index().pivot(index="row", columns="column", values="index")
    matrix = [
        {
            "row": row,
            "cells": [
                None if pd.isna(grid.at[row, column.key]) else cells[int(grid.at[row, column.key])]
                for column in columns
            ],
        }
        for row in sorted(grid.index)
    ]
    bench = _bench_model(runs, redactor)
    model: dict[str, Any] = redactor.redact_obj(
        {
            "runs": [asdict(summary) for summary in _summaries(runs, frame)],
            "columns": [asdict(column) for column in columns],
            "matrix": matrix,
            "cells": cells,
            "nonconformant": [cell for cell in cells if not cell["conformant"]],
            "failing": [cell for cell in cells if cell["symptom"]],
            "symbols": SYMBOLS,
        }
    )
    model["bench"] = bench  # its charts are markup, already redacted
    return model


def _bench_table_row(measure_id: str, doc: dict[str, Any]) -> dict[str, Any]:
    from .benchmark import comparison_text

    stats = doc["stats"]
    figures = {key: stats[f"{key}_ms"] for key in ("median", "p95", "p99", "min", "max")}
    return {
        "measure": measure_id,
        "title": doc["title"],
        "ok": f"{stats['ok']}/{stats['attempted']}",
        "failed": stats["ok"] < stats["attempted"],
        **{key: "—" if value is None else f"{value:.2f}" for key, value in figures.items()},
        "all_ready": f"{doc['all_ready_ms']:.0f} ms" if doc.get("all_ready_ms") and doc["mode"] != "sequential" else "",
        "comparison": comparison_text(doc),
        "target": doc["target"]["text"] if doc["target"] else "",
        "met": None if doc["target"] is None else doc["target"]["met"],
        "stopped": doc.get("stopped"),
    }


def _bench_model(runs: Sequence[Run], redactor: Redactor) -> dict[str, Any]:
    """The benchmark section: per run and runner a distribution chart and table; across runs, the ratios."""
    from markupsafe import Markup

    from .benchmark import read_bench
    from .charts import Distribution, distribution_chart

    documents = [(run, doc) for run in runs if (doc := read_bench(run.path)) is not None]
    entries = []
    for run, doc in documents:
        baseline_rows = [
            Distribution(
                f"baseline: {name}", b["samples"], b["stats"]["median_ms"] or 0, b["stats"]["p95_ms"] or 0, True
            )
            for name, b in doc["baselines"].items()
        ]
        runners = []
        for name, entry in doc["runners"].items():
            rows = [
                Distribution(
                    measure_id,
                    [s["ms"] for s in m["samples"] if s["ok"] and s["ms"] is not None],
                    m["stats"]["median_ms"] or 0,
                    m["stats"]["p95_ms"] or 0,
                )
                for measure_id, m in entry["measures"].items()
            ]
            chart = distribution_chart([*rows, *baseline_rows], f"{name} latency distributions, {run.run_id}")
            table = {
                "name": name,
                "rows": [_bench_table_row(mid, m) for mid, m in entry["measures"].items()],
                "error": entry["error"],
            }
            runners.append({**redactor.redact_obj(table), "svg": Markup(redactor.redact_text(chart))})
        summary = redactor.redact_obj(
            {
                "run_id": run.run_id,
                "endpoint": run.header["endpoint"]["name"],
                "stamp": _stamp(run),
                "settings": doc["settings"],
                "baselines": [
                    {"name": name, "title": b["title"], "median": f"{b['stats']['median_ms'] or 0:.2f}"}
                    for name, b in doc["baselines"].items()
                ],
                "notes": doc["notes"],
            }
        )
        entries.append({**summary, "runners": runners})
    return {"runs": entries, "comparison": _bench_comparison(documents, redactor)}


def _bench_comparison(documents: list[tuple[Run, dict[str, Any]]], redactor: Redactor) -> dict[str, Any] | None:
    """Ratios of the same runner x measure across runs; one more than REGRESSION x the first run's is flagged."""
    from markupsafe import Markup

    from .charts import Point, comparison_chart

    if len(documents) < 2:
        return None
    keys = list(
        dict.fromkeys(
            (runner, measure)
            for _, doc in documents
            for runner, e in doc["runners"].items()
            for measure in e["measures"]
        )
    )
    legend = [f"{run.header['endpoint']['name']} · {_stamp(run)}" for run, _ in documents]
    points, table = [], []
    for runner, measure in keys:
        row = f"{runner} {measure}"
        ratios = [
            doc["runners"].get(runner, {}).get("measures", {}).get(measure, {}).get("ratio") for _, doc in documents
        ]
        reference = next((r for r in ratios if r), None)
        cells = []
        for series, ratio in enumerate(ratios):
            if ratio:
                points.append(Point(row, series, ratio, f"{legend[series]}: {ratio:.2f}x baseline"))
            cells.append(
                {
                    "text": f"{ratio:.2f}x" if ratio else "—",
                    "regression": bool(ratio and reference and ratio > reference * REGRESSION),
                }
            )
        table.append({"row": redactor.redact_text(row), "cells": cells})
    chart = comparison_chart([f"{r} {m}" for r, m in keys], points, legend, "x baseline")
    return {"svg": Markup(redactor.redact_text(chart)), "legend": redactor.redact_obj(legend), "rows": table}


def _detection(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Rows of the quirk x flagged-cases table, from `e2b-bench detect` runs."""
    return [
        {
            "run": run.run_id,
            "quirk": case.case,
            "detected": case.conformant,
            "flagged": list(case.details.get("flagged", [])),
        }
        for run in runs
        for case in run.cases
        if case.suite == "detection"
    ]


def _environment(templates: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(
    run_dirs: Sequence[Path],
    out_dir: Path,
    redactor: Redactor | None = None,
    templates: Path = TEMPLATES,
) -> ReportPaths:
    """Write `report.html` and `summary.md` for the runs (truncated runs included) into `out_dir`."""
    redactor = redactor or Redactor()
    runs = [read_run(path, allow_truncated=True) for path in run_dirs]
    model = _model(runs, redactor)
    model["detection"] = _detection(runs)
    model["load"] = load_view(runs, redactor)  # `e2b-bench load` runs: bench/loadview.py
    environment = _environment(templates)
    paths = ReportPaths(html=out_dir / "report.html", markdown=out_dir / "summary.md")
    for template, path in (("report.html.j2", paths.html), ("summary.md.j2", paths.markdown)):
        atomic_write(path, redactor.redact_text(environment.get_template(template).render(**model)))
    return paths
