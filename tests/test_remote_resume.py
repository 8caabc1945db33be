"""A hung case is one case: a step that outlives its deadline is `error` "no answer in N s", the steps
needing it `error` "depends on", and a fresh runner runs the others (their prerequisites again first)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bench.remote.resume import TYPICAL_STEP_S, run_resuming, step_deadlines
from bench.runners import RunnerSpec, run_runner
from bench.runners.manifest import Step
from bench.runners.protocol import Event, RunnerResult, make_task

SPEC = RunnerSpec(name="fixture-kit", language="python", pins={}, entry="tests/fixtures/runners/kit_hangs.py")
# s2, s3 and s5 need s1; s4 needs s3.
DEPENDS = {"s1": [], "s2": ["s1"], "s3": ["s1"], "s4": ["s3"], "s5": ["s1"]}
DEADLINE_S = 4.0  # far above what a step that answers takes, even on a loaded host


def resumed(tmp_path: Path, hang_in: str) -> tuple[dict[str, Any], list[RunnerResult], list[Event], list[str]]:
    ran = tmp_path / "ran.txt"
    options = {"hang_in": hang_in, "ran": str(ran)}
    task = make_task("quickstart", "fixture", "run-1", steps=list(DEPENDS), depends=DEPENDS, options=options)
    events: list[Event] = []
    streamed: list[str] = []

    def once(task: dict[str, Any], heard: Any) -> RunnerResult:
        return run_runner(SPEC, sys.executable, task, step_timeout_s=DEADLINE_S, on_event=heard, kill_grace_s=2)

    results, runs = run_resuming(
        task, once, on_result=lambda result: streamed.append(result.id), on_event=events.append,
        evidence=lambda: {"seen": "wire"},
    )  # fmt: skip
    assert streamed == list(dict.fromkeys(streamed))  # each step's result is delivered once
    return {k: (v.outcome, v.error) for k, v in results.items()}, runs, events, ran.read_text().split()


def test_a_hung_step_is_one_error_and_the_steps_after_it_run_in_a_fresh_runner(tmp_path: Path) -> None:
    results, runs, events, ran = resumed(tmp_path, hang_in="s3")

    assert results == {
        "s1": ("pass", None),
        "s2": ("pass", None),
        "s3": ("error", f"no answer in {DEADLINE_S:.0f} s in step s3"),
        "s4": ("error", "depends on s3"),
        "s5": ("pass", None),
    }
    # The second runner was given s5 and its prerequisite s1 (run again), nothing else.
    assert [run.requested for run in runs] == [tuple(DEPENDS), ("s1", "s5")]
    assert ran == ["s1", "s2", "s3", "s1", "s5"]
    assert [(e["type"], e.get("id")) for e in events if e["type"] in ("start", "step")][:5] == [
        ("start", "s1"), ("step", "s1"), ("start", "s2"), ("step", "s2"), ("start", "s3"),
    ]  # fmt: skip


def test_the_hung_step_carries_the_evidence_and_its_deadline(tmp_path: Path) -> None:
    task = make_task(
        "quickstart", "fixture", "run-1", steps=["s1"], depends={"s1": []},
        options={"hang_in": "s1", "ran": str(tmp_path / "ran.txt")},
    )  # fmt: skip

    results, runs = run_resuming(
        task,
        lambda task, heard: run_runner(SPEC, sys.executable, task, step_timeout_s=DEADLINE_S, on_event=heard),
        evidence=lambda: {"in_flight": ["POST /process.Process/Start"]},
    )

    assert results["s1"].details["in_flight"] == ["POST /process.Process/Start"]
    assert results["s1"].details["deadline_s"] == DEADLINE_S
    assert len(runs) == 1  # nothing was left to run


def test_a_step_deadline_grows_with_the_duration_its_manifest_declares() -> None:
    steps = [
        Step("quick", "", ()),
        Step("short", "", (), expect_s=5),
        Step("long", "", (), expect_s=3 * TYPICAL_STEP_S),
    ]

    assert step_deadlines(steps, 90.0) == {"quick": 90.0, "short": 90.0, "long": 270.0}


def test_a_step_is_held_to_its_own_deadline_from_its_start_event_not_to_the_silence_deadline(tmp_path: Path) -> None:
    task = make_task(
        "quickstart", "fixture", "run-1", steps=["s1", "s2"], depends={"s1": [], "s2": []},
        options={"hang_in": "s2", "ran": str(tmp_path / "ran.txt")},
    )  # fmt: skip
    started = time.monotonic()

    result = run_runner(SPEC, sys.executable, task, step_timeout_s=300, deadlines={"s2": DEADLINE_S}, kill_grace_s=2)

    assert time.monotonic() - started < 300  # the silence deadline never came into it
    assert [(r.id, r.outcome, r.error) for r in result.step_results()] == [
        ("s1", "pass", None),
        ("s2", "error", f"no answer in {DEADLINE_S:.0f} s in step s2"),
    ]
    assert (result.hung_in, result.hung_after_s) == ("s2", DEADLINE_S)
