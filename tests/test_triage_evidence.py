"""Evidence per case (bench/triage/evidence.py): the exchanges a runner's proxy logged while one step ran."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.results import schema_errors
from bench.triage.evidence import (
    MAX_EXCHANGES,
    SOURCE_MARGIN_S,
    WINDOW_MARGIN_S,
    StepSeen,
    Window,
    WireLogs,
    lines,
    stamped,
)

T0 = datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC)


def line(at_s: float, path: str, status: int | None = 200, suite: str = "probes", **extra: Any) -> dict[str, Any]:
    stamp = (T0 + timedelta(seconds=at_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "ts": stamp,
        "runner": "py-e2b-2.63.0",
        "suite": suite,
        "method": "POST",
        "url": f"http://127.0.0.1:4100{path}",
        "status": status,
        "duration_ms": 5.0,
        **extra,
    }


def write_log(tmp_path: Path, entries: list[dict[str, Any]]) -> Path:
    path = tmp_path / "wire" / "py-e2b-2.63.0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_step_gets_the_exchanges_of_its_suite_that_started_while_it_ran(tmp_path: Path) -> None:
    path = write_log(
        tmp_path,
        [
            line(0.4, "/previous-step"),
            line(1.05, "/process.Process/Start", frames=['end: {"error": {"code": "invalid_argument"}}']),
            line(1.2, "/other-suite", suite="refusals"),
            line(1.4, "/sandboxes/x/metrics", 404, response_excerpt='{"message": "no metrics"}'),
            line(1.95, "/next-step"),
        ],
    )
    # the step ran from 1.0 s to 1.9 s; a busy host read its event only at 2.0 s, after the next step began at
    # 1.93 s (its event read at 2.5 s after 570 ms)
    seen = [StepSeen("pr04", at(0.95), 900), StepSeen("pr05", at(2.0), 900), StepSeen("pr06", at(2.5), 570)]

    evidence = WireLogs().evidence(path, "probes", Window.of_step(seen, 1))

    assert [(e["path"], e["status"]) for e in evidence] == [
        ("/process.Process/Start", 200),
        ("/sandboxes/x/metrics", 404),
    ]
    assert evidence[0]["frames"] == ['end: {"error": {"code": "invalid_argument"}}']
    assert evidence[1]["response"] == '{"message": "no metrics"}'
    assert schema_errors("case", _case_with(evidence)) == []


def test_a_step_its_runner_stamped_keeps_its_first_exchange_however_late_its_event_was_read(tmp_path: Path) -> None:
    path = write_log(
        tmp_path,
        [
            line(0.99, "/previous-step"),
            line(1.001, "/process.Process/Start", frames=['data: {"stdout": "/workspace"}']),
            line(1.5, "/sandboxes/x/metrics", 404),
            line(1.91, "/next-step"),
        ],
    )
    # the step began at 1.0 s (its runner's stamp) and ran 900 ms; the harness, busy, read its event 2 s late,
    # after the next step (stamped 1.905 s) had begun
    seen = [
        StepSeen("pr01", at(3.0), 900, started=at(1.0)),
        StepSeen("pr02", at(3.1), 50, started=at(1.905)),
    ]

    evidence = WireLogs().evidence(path, "probes", Window.of_step(seen, 0))

    assert [e["path"] for e in evidence] == ["/process.Process/Start", "/sandboxes/x/metrics"]
    assert Window.of_step(seen, 0) == Window(at(1.0), at(1.9 + SOURCE_MARGIN_S))


def test_an_unstamped_step_ends_where_the_next_stamped_step_began() -> None:
    seen = [StepSeen("pr01", at(3.0), 900), StepSeen("pr02", at(3.1), 50, started=at(1.905))]

    assert Window.of_step(seen, 0) == Window(at(1.905 - 0.9 - WINDOW_MARGIN_S), at(1.905))


def test_a_start_stamp_that_is_no_moment_is_ignored() -> None:
    assert [stamped(value) for value in (None, True, "1.0", 1e30, -1e30)] == [None] * 5
    assert stamped(1796188271.5) == datetime(2026, 12, 2, 5, 11, 11, 500000, tzinfo=UTC)


def test_the_last_step_ends_when_its_event_was_read() -> None:
    window = Window.of_step([StepSeen("pr01", at(3.0), 200)], 0)

    assert (window.start, window.end) == (at(3.0 - 0.2 - WINDOW_MARGIN_S), at(3.0))


def test_evidence_is_bounded_keeping_the_failed_exchanges(tmp_path: Path) -> None:
    entries = [line(i * 0.01, f"/files?n={i}") for i in range(40)]
    entries[3] = line(0.03, "/files?n=3", 500, error="upstream stream broken")
    path = write_log(tmp_path, entries)

    evidence = WireLogs().evidence(path, "probes", Window(T0, T0 + timedelta(seconds=1)))

    assert len(evidence) == MAX_EXCHANGES
    assert evidence[0]["omitted"] == 40 - MAX_EXCHANGES
    assert [e["path"] for e in evidence] == ["/files?n=3", *(f"/files?n={i}" for i in range(29, 40))]
    shown = lines(evidence)
    assert shown[0] == f"… {40 - MAX_EXCHANGES} earlier exchange(s) of this case left out"
    assert shown[1] == "20:00:00.030 POST /files?n=3 → 500 (5.0 ms) error: upstream stream broken"


def test_a_log_that_grew_is_read_again(tmp_path: Path) -> None:
    logs = WireLogs()
    path = write_log(tmp_path, [line(0.1, "/first")])
    window = Window(T0, T0 + timedelta(seconds=1))
    assert [e["path"] for e in logs.evidence(path, "probes", window)] == ["/first"]

    with path.open("a") as handle:
        handle.write(json.dumps(line(0.2, "/second")) + "\n" + '{"ts": "cut sh')

    assert [e["path"] for e in logs.evidence(path, "probes", window)] == ["/first", "/second"]


def _case_with(evidence: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "probes/py-e2b-2.63.0/pr05_stdin",
        "suite": "probes",
        "runner": "py-e2b-2.63.0",
        "case": "pr05_stdin",
        "outcome": "refused",
        "expected": "pass",
        "conformant": False,
        "duration_ms": 1500.0,
        "error": "x",
        "details": {},
        "started_at": "2026-12-01T20:00:00.000Z",
        "evidence": evidence,
    }
