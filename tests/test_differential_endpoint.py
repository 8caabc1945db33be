"""The differential judgement against the embedded endpoint: each quirk of a detail no case asserts is flagged by
it alone, naming the field with E2B's value beside the endpoint's; a declaration pins such a difference; the
faithful endpoint gives no difference, also on a host kept busy by a CPU hog; `--no-differential` judges nothing.

The quirk runs are those of tests/test_quirk_detection.py (`quirk_run`, shared per worker): there each is flagged
by exactly its cases; here by the differential judgement, naming its field. The references are the stored ones
(sandboxes/e2b/reference/, `e2b-bench reference --write`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from run_cli import e2b_bench
from shared_runs import Shared, quirk_key, quirk_params, quirk_run, shares

from bench.detection import DIFFERENTIAL_DETECTED_BY, flagged
from bench.differential.session import PREFIX
from bench.expectations import Declaration, judge
from bench.results import read_run

# behaviours of each area the differential judges, run under a hog and with the judgement off
CASES = "sync_metrics or sync_set_timeout or sync_run_envs_cwd_user or sync_run_streams or sync_file_metadata_replaced"


@pytest.mark.parametrize("quirk", quirk_params(sorted(DIFFERENTIAL_DETECTED_BY)))
def test_each_quirk_of_an_unasserted_detail_is_flagged_by_the_differential_naming_its_field(
    shared: Shared, quirk: str
) -> None:
    cases, field = DIFFERENTIAL_DETECTED_BY[quirk]
    judged = [case for case in read_run(quirk_run(shared, quirk)).cases if f"{case.suite}/{case.case}" in cases]

    assert len(judged) == len(cases)
    for case in judged:
        assert case.outcome == "deviation" and (case.error or "").startswith(PREFIX), (case.id, case.error)
        named = [d for d in case.details["differential"] if field in d["field"]]
        assert named, (case.id, case.details["differential"])
        assert named[0]["expected"] != named[0]["got"]


@shares(quirk_key("metrics_in_mib"))
def test_a_declaration_pins_a_field_difference(shared: Shared) -> None:
    run = read_run(quirk_run(shared, "metrics_in_mib"))
    (case,) = [c for c in run.cases if c.case == "sync_metrics"]
    pinned = Declaration(outcome="deviation", match="differs from E2B: GET /sandboxes/{id}/metrics [].")
    other = Declaration(outcome="deviation", match="differs from E2B: GET /sandboxes/{id} cpuCount")

    assert judge(case.outcome, case.details, case.error, pinned).conformant
    assert not judge(case.outcome, case.details, case.error, other).conformant


def _hog(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


def test_the_faithful_endpoint_gives_no_difference_under_a_cpu_hog(tmp_path: Path) -> None:
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_hog, args=(stop,), daemon=True) for _ in range(2 * (os.cpu_count() or 1))]
    for hog in hogs:
        hog.start()
    try:
        done = e2b_bench("run", "--runner", "py-e2b-2.63.0", "--results-dir", str(tmp_path), "--no-report", "-k",
                         CASES, "behaviours", timeout=900)  # fmt: skip
    finally:
        stop.set()
        for hog in hogs:
            hog.join()
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert flagged(run_dir) == [], done.stdout[-2000:]
    judged = {c.case: c.outcome for c in read_run(run_dir).cases if c.suite == "behaviours"}
    assert set(judged) >= {"sync_metrics", "sync_set_timeout", "sync_run_envs_cwd_user", "sync_run_streams"}
    assert set(judged.values()) == {"pass"}
    assert (run_dir / "traces" / "behaviours.py-e2b-2.63.0.jsonl").is_file()


def test_no_differential_captures_and_judges_nothing(tmp_path: Path) -> None:
    done = e2b_bench("run", "--runner", "py-e2b-2.63.0", "--results-dir", str(tmp_path), "--no-report",
                     "--no-differential", "--quirk", "metrics_in_mib", "-k", "sync_metrics", "behaviours")  # fmt: skip
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert flagged(run_dir) == [], done.stdout[-2000:]
    lines = [json.loads(line) for line in (run_dir / "wire" / "py-e2b-2.63.0.jsonl").read_text().splitlines()]
    assert lines and not any("trace" in line for line in lines)
    assert not (run_dir / "traces").exists()
