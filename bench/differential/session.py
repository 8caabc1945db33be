"""The differential judgement as a run uses it (bench/conformance.py calls `Differential.judged` for each case).

A case's trace is written to the run directory (traces/<suite>.<runner>.jsonl: what `e2b-bench reference`
makes references from), and a case that passed is compared with its reference traces: what differs becomes the
case's outcome, `deviation` "differs from E2B: FIELD expected … got …" (every difference in
`details.differential`). A declaration pins a known difference as any other deviation (`outcome = "deviation"`,
`match` naming the field). Off with `run --no-differential` (E2B_BENCH_DIFFERENTIAL=0), and for a case with no
reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.paths import FIELD_POLICY_PATH, REFERENCE_TRACES_DIR
from bench.remote.slowness import scaled
from bench.results import append_line
from bench.runners.protocol import StepResult

from .capture import enabled, judging
from .judge import Judge
from .policy import DELTA_S, load_rules
from .reference import References, run_traces_path
from .trace import case_trace

PREFIX = "differs from E2B: "
# A run's id (`YYYYmmddTHHMMSSZ-<suites>-<endpoint>...`): cases put it, and names made of it, in what they send.
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[A-Za-z0-9._-]+")


TAIL = 8  # the shortest end of a run's id a name made of it is taken to hold


def neutral(value: Any, run_id: str | None = None) -> Any:
    """`value` with every run id in its strings as `{run}`, and the longest end of `run_id` (the run the value is
    from) a string holds as `{run-end}`: a run's own name, or one a case made of it, is no difference from E2B."""
    if isinstance(value, str):
        value = RUN_ID.sub("{run}", value)
        for size in range(len(run_id or ""), TAIL - 1, -1):
            if run_id and run_id[-size:] in value:
                return value.replace(run_id[-size:], "{run-end}")
        return value
    if isinstance(value, list):
        return [neutral(item, run_id) for item in value]
    if isinstance(value, dict):
        return {key: neutral(item, run_id) for key, item in value.items()}
    return value


@dataclass
class Differential:
    run_dir: Path
    on: bool = field(default_factory=enabled)  # traces written
    judges: bool = field(default_factory=judging)  # and cases judged
    policy_path: Path = FIELD_POLICY_PATH
    references: References = field(default_factory=lambda: References(REFERENCE_TRACES_DIR))
    _judge: Judge | None = None

    def judge(self) -> Judge:
        if self._judge is None:
            self._judge = Judge(load_rules(self.policy_path), scaled(DELTA_S))
        return self._judge

    def judged(
        self, suite: str, runner: str, observed: StepResult, entries: Callable[[], list[dict[str, Any]] | None]
    ) -> StepResult:
        """`observed`, or the deviation its trace shows against its reference."""
        if not self.on or not observed.reported:
            return observed
        window = entries()
        if window is None:
            return observed
        trace = case_trace(window)
        run_id = self.run_dir.name
        append_line(
            run_traces_path(self.run_dir, suite, runner),
            {"case": observed.id, "outcome": observed.outcome, "run_id": run_id, "trace": trace},
        )
        refs = self.references.runs(suite, runner, observed.id) if self.judges else []
        if observed.outcome != "pass" or not refs or not self.judges:
            return observed
        found = self.judge().differences([neutral(ref, made_by) for ref, made_by in refs], neutral(trace, run_id))
        if not found:
            return observed
        more = f" (and {len(found) - 1} more difference(s))" if len(found) > 1 else ""
        details = {**observed.details, "differential": [difference.as_dict() for difference in found]}
        return replace(observed, outcome="deviation", error=PREFIX + found[0].text() + more, details=details)
