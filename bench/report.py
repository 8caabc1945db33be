"""Self-contained HTML matrix and Markdown summary (for `$GITHUB_STEP_SUMMARY`) from run directories."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from bench.loadview import load_view
from bench.paths import TEMPLATES_DIR
from bench.redaction import Redactor
from bench.remote.budget import cost_line
from bench.repro.commands import follow_ups
from bench.results import ARTIFACT_MODE, OUTCOMES, CaseRecord, Run, atomic_write, read_run
from bench.runners.envs import default_cache_dir
from bench.triage import evidence as case_evidence
from bench.triage.causes import cause_document, endpoint_words, find_causes, headline, message
from bench.verdict import rerun_command, run_problem, verdict

if TYPE_CHECKING:
    import pandas as pd  # imported where a report is built: a run's start and `import bench.report` stay light

TEMPLATES = TEMPLATES_DIR
SYMBOLS = {"pass": "✔", "fail": "✘", "refused": "⊘", "deviation": "≠", "error": "!", "skip": "\u2013"}
ERROR_PREVIEW = 200
SYMPTOM_PREVIEW = 600  # what a failing cell shows of its error: enough for the observed symptom
FAILING = ("fail", "error", "deviation")
WORDS_PREVIEW = 160  # what a cause's row shows of the endpoint's words (the whole message is in its expansion)
ROW_RUNNERS = 3  # runners a cause's row names before "+N"
REGRESSION = 1.2  # a benchmark ratio this much above the first run's is flagged
WIRE_EXCERPT_LINES = 30
TRANSCRIPT_PREVIEW = 6000
COVERAGE_JSON = "coverage.json"
# A sandbox id as an error message names it (`Sandbox jyh2dpakq2c140ijhoa5 not found`): 20 letters and digits.
SANDBOX_ID = re.compile(r"\b(?=[a-z0-9]*\d)(?=[a-z0-9]*[a-z])[a-z0-9]{20}\b")
CASE_FIELDS = ("id", "suite", "runner", "case", "outcome", "expected", "conformant", "duration_ms", "details", "note")
FRAME_COLUMNS = [*("run_id", "endpoint", "stamp", "row", "column"), *CASE_FIELDS, "error", "started_at", "evidence"]


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
    problem: str | None
    coverage: dict[str, Any] | None
    cost: str | None = None  # the footer's cost figure in one line
    left: dict[str, str] = field(default_factory=dict)  # sandboxes the run left itself -> what their kill did


def run_stamp(run: Run) -> str:
    started = str(run.header["started_at"])
    return started[:19].replace("T", " ") + "Z"


def _frame(runs: Sequence[Run]) -> pd.DataFrame:
    import pandas as pd

    rows = [
        {
            "run_id": run.run_id,
            "endpoint": run.header["endpoint"]["name"],
            "stamp": run_stamp(run),
            "runner": case.runner,
            "row": f"{case.suite}/{case.case}",
            "column": f"{run.run_id}/{case.runner}",
            **case.to_dict(),
        }
        for run in runs
        for case in _by_runner(run)
    ]
    frame = pd.DataFrame(rows, columns=FRAME_COLUMNS)
    # A case recorded twice (a retry) shows its last record.
    return frame.drop_duplicates(subset=["row", "column"], keep="last").reset_index(drop=True)


def _by_runner(run: Run) -> list[CaseRecord]:
    """The run's cases runner by runner, in the order its header names the runners (cases are recorded as they
    end, so runners that ran side by side interleave in cases.jsonl); each runner's cases in their order."""
    order = {runner: index for index, runner in enumerate(run.header.get("pins") or {})}
    return sorted(run.cases, key=lambda case: order.get(case.runner, len(order)))


def _summaries(runs: Sequence[Run], frame: pd.DataFrame) -> list[RunSummary]:
    import pandas as pd

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
                started_at=run_stamp(run),
                counts={outcome: int(by_outcome.get(outcome, 0)) for outcome in OUTCOMES},
                conformant=int(good),
                nonconformant=int(total - good),
                pins=run.header["pins"],
                problem=run_problem(run),
                coverage=_coverage(run.path),
                cost=cost_line(run.footer["cost"]) if run.footer and run.footer.get("cost") else None,
                left=dict((run.footer or {}).get("left_by_run") or {}),
            )
        )
    return summaries


def _preview(error: str | None, limit: int = ERROR_PREVIEW) -> str:
    """The error on one line, at most `limit` characters."""
    text = " ".join((error or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class CaseSources:
    """What a case's click-through shows beside its record: the runner's transcript and wire log."""

    def __init__(self, runs: Sequence[Run]) -> None:
        self._runs = {run.run_id: run for run in runs}
        self._cache: dict[tuple[str, str], Any] = {}

    def _load(self, run_id: str, name: str, lines: bool) -> Any:
        key = (run_id, name)
        if key not in self._cache:
            path = self._runs[run_id].path / name
            try:
                text = path.read_text("utf-8")
                parsed = [json.loads(x) for x in text.split("\n") if x.strip()] if lines else json.loads(text)
                self._cache[key] = parsed
            except (OSError, ValueError):
                self._cache[key] = None
        return self._cache[key]

    def transcript(self, run_id: str, runner: str) -> dict[str, Any] | None:
        document = self._load(run_id, f"{runner}.json", lines=False)
        return document if isinstance(document, dict) else None

    def wire_excerpt(self, run_id: str, runner: str, sandboxes: set[str]) -> tuple[str, list[str]]:
        """The runner's exchanges with these sandboxes or, lacking ids, those that failed; with a caption."""
        entries = self._load(run_id, f"wire/{runner}.jsonl", lines=True) or []
        key = (run_id, f"wire/{runner}.jsonl#text")
        if key not in self._cache:
            self._cache[key] = [json.dumps(entry) for entry in entries]
        texts = self._cache[key]
        chosen = [entry for entry, text in zip(entries, texts, strict=True) if any(s in text for s in sandboxes)]
        caption = f"exchanges with sandbox {', '.join(sorted(sandboxes))}"
        if not chosen:
            caption = f"exchanges of {runner} that failed (the wire log does not say which step sent them)"
            chosen = [e for e in entries if e.get("error") or e.get("status") is None or e["status"] >= 400]
        shown = [_wire_line(entry) for entry in chosen[:WIRE_EXCERPT_LINES]]
        if len(chosen) > WIRE_EXCERPT_LINES:
            shown.append(f"… {len(chosen) - WIRE_EXCERPT_LINES} more in wire/{runner}.jsonl")
        return caption, shown


def _wire_line(entry: dict[str, Any]) -> str:
    line = f"{str(entry.get('ts', ''))[11:23]} {entry.get('method')} {entry.get('url')} → {entry.get('status')}"
    line += f" ({entry.get('duration_ms', 0):.1f} ms)"
    if entry.get("error"):
        line += f" error: {entry['error']}"
    for part in ("request_body", "response_body"):
        if entry.get(part):
            line += f"\n    {part.split('_')[0]}: {_preview(str(entry[part]), ERROR_PREVIEW)}"
    return line


def _sandbox_ids(document: Any) -> set[str]:
    """Every `sandbox_id` member anywhere in a transcript or case details."""
    if isinstance(document, dict):
        found = {str(v) for k, v in document.items() if k == "sandbox_id" and v}
        return found.union(*(_sandbox_ids(v) for v in document.values()))
    if isinstance(document, list):
        return set().union(*(_sandbox_ids(item) for item in document))
    return set()


def _click_through(record: pd.Series, sources: CaseSources, failing: bool) -> dict[str, Any]:
    """Transcript and wire excerpt of a case: for framework runners always, for others when it failed."""
    transcript = sources.transcript(record["run_id"], record["runner"])
    exchanges = record["evidence"] if isinstance(record["evidence"], list) else None
    if transcript is None and not failing and not exchanges:
        return {"transcript": None, "wire_caption": None, "wire": []}
    text = None
    if transcript is not None:
        shown = {k: v for k, v in transcript.items() if k != "model_exchanges"}
        text = json.dumps(shown, indent=2, ensure_ascii=False)
        if len(text) > TRANSCRIPT_PREVIEW:
            text = text[:TRANSCRIPT_PREVIEW] + f"\n… (the whole transcript is {record['runner']}.json)"
    if exchanges:
        caption, wire = "exchanges while this case ran", case_evidence.lines(exchanges)
    elif exchanges is not None:
        caption, wire = "no exchange while this case ran", ["(the case sent no request to the endpoint)"]
    else:  # recorded before cases carried their evidence, or never reported by its runner
        named = SANDBOX_ID.findall(record["error"] if isinstance(record["error"], str) else "")
        ids = _sandbox_ids(transcript) | _sandbox_ids(record["details"]) | set(named)
        caption, wire = sources.wire_excerpt(record["run_id"], record["runner"], ids)
    return {"transcript": text, "wire_caption": caption if wire else None, "wire": wire}


NOT_RUN = "not run"  # the error of a case the run never got to (a budget, an interruption): bench/conformance.py


def _not_run(outcome: str, error: str | None) -> bool:
    return outcome == "error" and (error or "").startswith(NOT_RUN)


def _state(outcome: str, conformant: bool, error: str | None = None) -> str:
    """How a case reads: `pass`, `declared` (not a pass, but as declared: a known difference, not a failure),
    `nc` (not as declared: the only red), `notrun` (the run never got to it: no verdict on the endpoint) or
    `skip`."""
    if _not_run(outcome, error):
        return "notrun"
    if not conformant:
        return "nc"
    return outcome if outcome in ("pass", "skip") else "declared"


def _cell(anchor: str, record: pd.Series, label: str, run: Run, sources: CaseSources) -> dict[str, Any]:
    duration = record["duration_ms"]
    has_duration = duration is not None and not (isinstance(duration, float) and math.isnan(duration))
    title = f"{record['outcome']} · {duration:.1f} ms" if has_duration else str(record["outcome"])
    if not record["conformant"]:
        title += f" · non-conformant (expected {record['expected']})"
    elif record["outcome"] not in ("pass", "skip"):
        title += " · declared difference (conformant)"
    error = record["error"] if isinstance(record["error"], str) else None
    symptom = _preview(error, SYMPTOM_PREVIEW) if record["outcome"] in FAILING else ""
    case = CaseRecord(
        **{key: record[key] for key in ("id", "suite", "runner", "case", "outcome", "expected")},
        conformant=bool(record["conformant"]),
    )
    return {
        "anchor": anchor,
        "id": record["id"],
        "row": record["row"],
        "suite": case.suite,
        "case": case.case,
        "run_id": record["run_id"],
        "runner": record["runner"],
        "label": label,
        "outcome": record["outcome"],
        "expected": record["expected"],
        "conformant": bool(record["conformant"]),
        "state": _state(str(record["outcome"]), bool(record["conformant"]), error),
        "symbol": SYMBOLS[record["outcome"]],
        "title": title,
        "duration": f"{duration:.1f} ms" if has_duration else "—",
        "note": record["note"] if isinstance(record["note"], str) else None,
        "error": error,
        "error_preview": _preview(error),
        "symptom": symptom,
        "one_line": _preview(error) or (record["note"] if isinstance(record["note"], str) else "") or "",
        "rerun": rerun_command(run, case),
        **follow_ups(run, case, bool(record["conformant"])),  # repro, diff and the first difference (bench/repro)
        "details_json": json.dumps(record["details"], indent=2, sort_keys=True, ensure_ascii=False),
        **_click_through(record, sources, bool(symptom) or not record["conformant"]),
    }


def _columns(frame: pd.DataFrame, single_run: bool) -> list[Column]:
    columns: list[Column] = []
    for key, group in frame.groupby("column", sort=False):
        first = group.iloc[0]
        label = first["runner"] if single_run else f"{first['endpoint']} · {first['runner']} · {first['stamp']}"
        if any(column.label == label for column in columns):
            label += f" ({first['run_id']})"
        columns.append(Column(key=str(key), run_id=first["run_id"], runner=first["runner"], label=label))
    return columns


def _groups(frame: pd.DataFrame, columns: list[Column], cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The matrix by suite: one row per case, one column per (run, runner); each suite lists its own columns."""
    import pandas as pd

    grid = frame.reset_index().pivot(index="row", columns="column", values="index")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(grid.index):
        line = [
            None if pd.isna(grid.at[row, column.key]) else cells[int(grid.at[row, column.key])] for column in columns
        ]
        present = [cell for cell in line if cell is not None]
        suite, _, case = row.partition("/")
        groups.setdefault(suite, []).append(
            {
                "row": row,
                "case": case,
                "cells": line,
                "nc": any(not cell["conformant"] for cell in present),
                "declared": any(cell["state"] == "declared" for cell in present),
            }
        )
    result = []
    for suite, rows in groups.items():
        used = [i for i, _ in enumerate(columns) if any(r["cells"][i] is not None for r in rows)]
        result.append(
            {
                "suite": suite,
                "rows": rows,
                "nonconformant": sum(r["nc"] for r in rows),
                "declared": sum(r["declared"] for r in rows),
                "columns": [columns[i] for i in used],
                "md_rows": [{**r, "cells": [r["cells"][i] for i in used]} for r in rows],
            }
        )
    return result


def _model(runs: Sequence[Run], redactor: Redactor) -> dict[str, Any]:
    frame = _frame(runs)
    columns = _columns(frame, single_run=len(runs) == 1)
    labels = {column.key: column.label for column in columns}
    by_id = {run.run_id: run for run in runs}
    sources = CaseSources(runs)
    single = len(runs) == 1
    cells = [
        _cell(
            str(record["id"]) if single else f"{record['run_id']}/{record['id']}",  # a case's own id is its anchor
            record,
            labels[record["column"]],
            by_id[record["run_id"]],
            sources,
        )
        for _, record in frame.iterrows()
    ]
    gate = verdict(runs)
    bench = _bench_model(runs, redactor)
    by_case = {(cell["run_id"], cell["id"]): cell for cell in cells}
    model: dict[str, Any] = redactor.redact_obj(
        {
            "verdict": asdict(gate),
            "runs": [asdict(summary) for summary in _summaries(runs, frame)],
            "columns": [asdict(column) for column in columns],
            "groups": [{**g, "columns": [asdict(c) for c in g["columns"]]} for g in _groups(frame, columns, cells)],
            "cells": cells,
            "nonconformant": [cell for cell in cells if cell["state"] == "nc"],  # not the cases not run
            "failing": [cell for cell in cells if cell["symptom"]],
            "symbols": SYMBOLS,
            "causes": [_causes(run, by_case, number) for number, run in enumerate(runs, start=1)],
        }
    )
    model["bench"] = bench  # its charts are markup, already redacted
    return model


def _short_runners(runners: Sequence[str]) -> str:
    shown = ", ".join(runners[:ROW_RUNNERS])
    return shown + (f" +{len(runners) - ROW_RUNNERS}" if len(runners) > ROW_RUNNERS else "")


def _cause_rows(
    run: Run, cases: Sequence[CaseRecord], by_case: dict[tuple[str, str], dict[str, Any]], prefix: str, declared: bool
) -> list[dict[str, Any]]:
    """One row per cause (bench/triage/causes.py), largest first: its count, suites, runners, the endpoint's
    words and its first case; its cases (each with its re-run), the cause's re-run and wire evidence for the
    expansion. Pins are not repeated here: the run section names them once."""
    rows = []
    for number, cause in enumerate(find_causes(cases), start=1):
        document = cause_document(run, cause)
        example = cause.representative
        words = endpoint_words(example) or message(example)
        linked = [by_case[(run.run_id, case)] for case in document["cases"] if (run.run_id, case) in by_case]
        rows.append(
            {
                **{key: document[key] for key in ("key", "outcome", "outcomes", "expected", "count", "suites")},
                **{key: document[key] for key in ("runners", "message", "match", "representative")},
                "number": number,
                "id": f"{prefix}{number}",
                "declared": declared,
                "runners_short": _short_runners(document["runners"]),
                "words": _preview(words, WORDS_PREVIEW),
                "message_preview": _preview(document["message"], SYMPTOM_PREVIEW),
                "from_endpoint": endpoint_words(example) is not None,
                "anchor": by_case.get((run.run_id, example.id), {}).get("anchor", ""),
                "evidence_lines": case_evidence.lines(document["representative"]["evidence"]),
                "linked": linked,
            }
        )
    return rows


def _causes(run: Run, by_case: dict[tuple[str, str], dict[str, Any]], index: int) -> dict[str, Any]:
    """A run's causes, then its declared differences grouped the same way (conformant: as declared, not red)."""
    prefix = "cause-" if index == 1 else f"cause-{index}-"
    latest = {case.id: case for case in run.cases}
    skipped = [case for case in latest.values() if _not_run(case.outcome, case.error)]
    ran = [case for case in latest.values() if not _not_run(case.outcome, case.error)]
    causes = find_causes(ran)
    differing = [
        replace(case, conformant=False)  # grouped as causes are; shown as declared
        for case in latest.values()
        if case.conformant and case.outcome not in ("pass", "skip")
    ]
    declared = _cause_rows(run, differing, by_case, prefix.replace("cause", "declared"), declared=True)
    return {
        "run_id": run.run_id,
        "headline": headline(causes),
        "causes": _cause_rows(run, ran, by_case, prefix, declared=False),
        "not_run": len(skipped),
        "not_run_why": "; ".join(sorted({(case.error or "")[len(NOT_RUN) :].strip(" :") for case in skipped})),
        "declared": declared,
        "declared_count": sum(row["count"] for row in declared),
    }


def _coverage(run_path: Path) -> dict[str, Any] | None:
    """coverage.json of a run, with each operation's missing statuses and each runner's untested methods."""
    try:
        document = json.loads((run_path / COVERAGE_JSON).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    spec = document.get("spec") or {}
    operations = [
        {**op, "missing": [s for s in op.get("documented", []) if s not in op.get("seen", [])]}
        for op in spec.get("operations", [])
    ]
    sdk = {
        runner: {
            "percent": entry.get("percent", 0.0),
            "methods": entry.get("methods", []),
            "gaps": [m["name"] for m in entry.get("methods", []) if not m.get("cases")],
        }
        for runner, entry in (document.get("sdk") or {}).items()
    }
    return {"spec_percent": spec.get("percent"), "operations": operations, "sdk": sdk}


def _bench_table_row(measure_id: str, doc: dict[str, Any]) -> dict[str, Any]:
    from .benchdoc import comparison_text, not_measured_text, phases_text

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
        "phases": phases_text(doc),
        "target": doc["target"]["text"] if doc["target"] else "",
        "met": None if doc["target"] is None else doc["target"]["met"],
        "stopped": not_measured_text(doc) if doc.get("limit_s") is not None else None,
    }


def bench_documents(runs: Sequence[Run]) -> list[tuple[Run, dict[str, Any]]]:
    """The runs that are benchmark runs, each with its bench.json."""
    from .benchdoc import read_bench

    return [(run, doc) for run in runs if (doc := read_bench(run.path)) is not None]


def _bench_model(runs: Sequence[Run], redactor: Redactor) -> dict[str, Any]:
    """The benchmark section: per run and runner a distribution chart and table; across runs, the ratios."""
    from markupsafe import Markup

    from .benchdoc import pool_text
    from .charts import Distribution, distribution_chart

    documents = bench_documents(runs)
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
                "stamp": run_stamp(run),
                "settings": doc["settings"],
                "pool": pool_text(doc["header"]),
                "baselines": [
                    {"name": name, "title": b["title"], "median": f"{b['stats']['median_ms'] or 0:.2f}"}
                    for name, b in doc["baselines"].items()
                ],
                "notes": doc["notes"],
            }
        )
        entries.append({**summary, "runners": runners})
    return {"runs": entries, "comparison": bench_comparison(documents, redactor)}


def bench_comparison(documents: list[tuple[Run, dict[str, Any]]], redactor: Redactor) -> dict[str, Any] | None:
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
    legend = [f"{run.header['endpoint']['name']} · {run_stamp(run)}" for run, _ in documents]
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


AUTOESCAPED = ("html", "html.j2")
COMPILED_TEMPLATES = "report-templates"  # under the cache directory: Jinja's compiled templates
# What an environment compiles a template with, besides its source (its syntax and whitespace control)
COMPILED_WITH = (
    *("block_start_string", "block_end_string", "variable_start_string", "variable_end_string"),
    *("comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix"),
    *("trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized"),
)


def template_environment(templates: Path, cache_dir: Path | None = None) -> jinja2.Environment:
    """The report's templates, compiled once per template source and kept under `cache_dir` (default: the
    harness's cache) for the next run."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        autoescape=jinja2.select_autoescape(list(AUTOESCAPED)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.bytecode_cache = _compiled_templates(environment, cache_dir or default_cache_dir())
    return environment


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Jinja's file cache, keyed by each template's source checksum and the Python version (Jinja's own key);
    an entry it cannot read is compiled again, a directory it cannot write is no cache: the report renders all
    the same."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # a damaged entry: compiled again, and replaced
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _compiled_templates(environment: jinja2.Environment, cache_dir: Path) -> jinja2.BytecodeCache | None:
    # Compiled code also depends on Jinja's version and on what the environment compiles with (its syntax,
    # whitespace control, extensions, autoescaping), which Jinja's key leaves out: they name the directory.
    compiles_with = [
        jinja2.__version__,
        *(getattr(environment, name) for name in COMPILED_WITH),
        sorted(environment.extensions),
        AUTOESCAPED,
    ]
    identity = hashlib.sha256(json.dumps(compiles_with).encode()).hexdigest()[:16]
    directory = cache_dir / COMPILED_TEMPLATES / identity
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return _CompiledTemplates(str(directory))


def publish(path: Path, text: str) -> Path:
    """Write an artifact atomically with the one mode every artifact of the harness has."""
    atomic_write(path, text)
    os.chmod(path, ARTIFACT_MODE)
    return path


def render(
    run_dirs: Sequence[Path],
    out_dir: Path,
    redactor: Redactor | None = None,
    templates: Path = TEMPLATES,
    changes: dict[str, Any] | None = None,
) -> ReportPaths:
    """Write `report.html` and `summary.md` for the runs (truncated runs included) into `out_dir`.

    `changes` (from `bench.compare`) adds a "what changed since the baseline" section to both.
    """
    redactor = redactor or Redactor()
    runs = [read_run(path, allow_truncated=True) for path in run_dirs]
    model = _model(runs, redactor)
    model["detection"] = _detection(runs)
    model["changes"] = redactor.redact_obj(changes) if changes else None
    model["load"] = load_view(runs, redactor)  # `e2b-bench load` runs: bench/loadview.py
    environment = template_environment(templates)
    paths = ReportPaths(html=out_dir / "report.html", markdown=out_dir / "summary.md")
    publish(paths.html, redactor.redact_text(environment.get_template("report.html.j2").render(**model)))
    publish(paths.markdown, summary_text(environment, model, redactor))
    return paths


SUMMARY_BYTES = 64 * 1024  # a CI step summary is read in one screen (and its host cuts it off far above this)
# What summary.md lists, from everything to the least: the first that fits SUMMARY_BYTES is written; the rest
# of the run is in report.html, which each cut-off list names.
EVERY = 10**9
SUMMARY_LIMITS: tuple[dict[str, Any], ...] = (
    {
        "causes": EVERY,
        "declared": EVERY,
        "cases": EVERY,
        "changes": EVERY,
        "failing": EVERY,
        "matrix": True,
        "pins": True,
    },
    {"causes": 50, "declared": 20, "cases": 100, "changes": 100, "failing": 50, "matrix": True, "pins": False},
    {"causes": 30, "declared": 10, "cases": 30, "changes": 50, "failing": 20, "matrix": False, "pins": False},
    {"causes": 15, "declared": 5, "cases": 10, "changes": 20, "failing": 0, "matrix": False, "pins": False},
    {"causes": 5, "declared": 0, "cases": 0, "changes": 5, "failing": 0, "matrix": False, "pins": False},
)
SUMMARY_CUT = "\n\n… (summary.md is cut at {limit} bytes: the rest is in report.html)\n"


def summary_text(environment: jinja2.Environment, model: dict[str, Any], redactor: Redactor) -> str:
    """summary.md for a CI step summary: verdict, causes, what changed, the runs, and as much of the cases
    and the matrix as fits SUMMARY_BYTES (UTF-8), whatever the run."""
    template = environment.get_template("summary.md.j2")
    text = ""
    for limits in SUMMARY_LIMITS:
        text = redactor.redact_text(template.render(**model, limits=limits))
        if len(text.encode()) <= SUMMARY_BYTES:
            return text
    # Still too long (a huge headline, problems or benchmark): cut at a line, and say so.
    cut = SUMMARY_CUT.format(limit=SUMMARY_BYTES)
    data = text.encode()[: SUMMARY_BYTES - len(cut.encode())]
    kept = data.decode("utf-8", errors="ignore").rsplit("\n", 1)[0]
    return kept + cut
