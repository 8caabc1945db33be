"""One framework runner through `e2b-bench run frameworks`, for the framework test modules after the first wave.

Each module runs its own runner (`--runner NAME`) faithful and against `b3os-beta`, with request bodies in
the wire log (`--wire-bodies`), so what the framework's E2B backend really sent can be asserted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from run_cli import e2b_bench, only_run_dir
from test_frameworks import FrameworkRun

from bench.results import read_run
from bench.runners.catalog import available_runners
from bench.runners.manifest import load_steps

WIRE_BODY_BYTES = "4096"


def runner_of(family: str) -> str:
    """The one runner of a framework's folder."""
    (name,) = [name for name, r in available_runners().items() if r.spec.family == family]
    return name


@dataclass(frozen=True)
class SingleRun(FrameworkRun):
    """A run of one framework runner."""

    runner: str
    family: str

    def steps(self) -> list[str]:
        return [s.id for s in load_steps("frameworks", self.family)]

    def own_case(self, step: str) -> Any:
        return self.case(self.runner, step)

    def own_transcript(self) -> dict[str, Any]:
        return self.transcript(self.runner)

    def wire(self) -> list[dict[str, Any]]:
        lines = (self.run.path / "wire" / f"{self.runner}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def creates(self) -> list[dict[str, Any]]:
        """The sandbox creations the runner's SDK sent, bodies decoded."""
        return [
            {**e, "body": json.loads(e["request_body"])}
            for e in self.wire()
            if e["method"] == "POST" and e["url"].endswith("/sandboxes")
        ]


def run_framework(family: str, results: Path, *args: str) -> SingleRun:
    runner = runner_of(family)
    done = e2b_bench(
        "run", "frameworks", "--runner", runner, "--wire-bodies", WIRE_BODY_BYTES, "--results-dir", str(results),
        *args, timeout=1800,
    )  # fmt: skip
    return SingleRun(done, read_run(only_run_dir(results)), runner, family)
