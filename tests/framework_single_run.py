"""One framework runner's `e2b-bench run frameworks`, read back: cases, its transcript, its wire log."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from run_cli import e2b_bench, only_run_dir

from bench.results import CaseRecord, Run, read_run
from bench.runners.catalog import available_runners


def runner_of(family: str) -> str:
    """The default runner of a framework family (its folder's pinned environment)."""
    (name,) = [name for name, r in available_runners().items() if r.spec.family == family]
    return name


@dataclass(frozen=True)
class FrameworkRun:
    runner: str
    done: subprocess.CompletedProcess[str]
    run: Run

    def cases(self) -> list[CaseRecord]:
        return [c for c in self.run.cases if c.runner == self.runner]

    def case(self, step: str) -> CaseRecord:
        (found,) = [c for c in self.cases() if c.case == step]
        return found

    def transcript(self) -> dict[str, Any]:
        return dict(json.loads((self.run.path / f"{self.runner}.json").read_text()))

    def wire(self) -> list[dict[str, Any]]:
        lines = (self.run.path / "wire" / f"{self.runner}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def failure(self) -> str:
        return self.done.stdout[-3000:] + self.done.stderr[-3000:]


def bench_run(results: Path, runner: str, *args: str, env: dict[str, str] | None = None) -> FrameworkRun:
    done = e2b_bench(
        "run", "frameworks", "--results-dir", str(results), "--runner", runner, *args, env=env, timeout=1800
    )
    return FrameworkRun(runner, done, read_run(only_run_dir(results)))
