"""Running framework runners through `e2b-bench run frameworks` and reading what the run recorded.

Shared by the framework modules (tests/test_frameworks*.py): the run, its cases, the `<runner>.json`
transcripts and wire logs (`SingleRun` for a run of one runner, request bodies included), and a scripted
model served as a *real* one (through `--model-base-url`) that also records the Authorization header
each request carried.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from run_cli import e2b_bench, only_run_dir, served_with
from shared_runs import Shared

from bench.model import ModelServer
from bench.model.server import serving_model
from bench.results import CaseRecord, Run, read_run
from bench.runners.catalog import available_runners
from bench.runners.manifest import load_manifest, load_steps

PROOF = "/home/user/proof.txt"
# fw03 through a backend that reports the command's output and its end faithfully
LATE_OUTPUT = {"command": "sleep 1; echo late", "exit_code": 0, "stdout": "late\n", "stderr": ""}


def runner_of(family: str) -> str:
    """The name of the (only) runner of a framework family."""
    (name,) = [name for name, r in available_runners().items() if r.spec.family == family]
    return name


@dataclass(frozen=True)
class FrameworkRun:
    done: subprocess.CompletedProcess[str]
    run: Run

    def case(self, runner: str, step: str) -> CaseRecord:
        (found,) = [c for c in self.run.cases if c.runner == runner and c.case == step]
        return found

    def transcript(self, runner: str) -> dict[str, Any]:
        return dict(json.loads((self.run.path / f"{runner}.json").read_text()))

    def wire(self, runner: str) -> list[dict[str, Any]]:
        lines = (self.run.path / "wire" / f"{runner}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def output(self) -> str:
        return self.done.stdout[-3000:] + self.done.stderr[-3000:]


def bench_run(results: Path, runner: str, *args: str, env: dict[str, str] | None = None) -> FrameworkRun:
    # the report tests render it themselves, from the run's records
    args = ("--results-dir", str(results), "--runner", runner, "--no-report", *args)
    done = e2b_bench("run", "frameworks", *args, env=env, timeout=1800)
    return FrameworkRun(done, read_run(only_run_dir(results)))


WIRE_BODY_BYTES = "4096"


@dataclass(frozen=True)
class SingleRun(FrameworkRun):
    """A run of one framework runner (`family`'s): its own cases, transcript and wire log."""

    runner: str
    family: str

    def steps(self) -> list[str]:
        return [s.id for s in load_steps("frameworks", self.family)]

    def cases(self) -> list[CaseRecord]:
        return [c for c in self.run.cases if c.runner == self.runner]

    def own_case(self, step: str) -> CaseRecord:
        return self.case(self.runner, step)

    def own_transcript(self) -> dict[str, Any]:
        return self.transcript(self.runner)

    def own_wire(self) -> list[dict[str, Any]]:
        return self.wire(self.runner)

    def processes(self) -> list[dict[str, Any]]:
        """The `process` member of each process Start the SDK sent, in order (bodies cut short are left out)."""
        found = []
        for e in self.own_wire():
            if e["url"].endswith("process.Process/Start"):
                with contextlib.suppress(ValueError):
                    found.append(json.loads(e["request_body"])["process"])
        return found

    def creates(self) -> list[dict[str, Any]]:
        """The sandbox creations the runner's SDK sent, bodies decoded."""
        return [
            {**e, "body": json.loads(e["request_body"])}
            for e in self.own_wire()
            if e["method"] == "POST" and e["url"].endswith("/sandboxes")
        ]


def run_framework(family: str, results: Path, *args: str, env: dict[str, str] | None = None) -> SingleRun:
    """`e2b-bench run frameworks` with the family's runner only, request bodies in the wire log."""
    runner = runner_of(family)
    done = bench_run(results, runner, "--wire-bodies", WIRE_BODY_BYTES, *args, env=env)
    return SingleRun(done.done, done.run, runner, family)


# The shared runs' request bodies: whole enough for a code cell's source (smolagents sends each as one body).
SHARED_WIRE_BODY_BYTES = "65536"
PROFILES = {"faithful": (), "b3os": ("--profile", "b3os-beta")}


def frameworks_run(shared: Shared, profile: str, served: dict[str, str]) -> FrameworkRun:
    """`e2b-bench run frameworks` with every framework runner, request bodies in the wire log, made once in the
    session: `faithful` at the test worker's embedded endpoint (`served`), `b3os` under that profile's own."""

    def make(results: Path) -> FrameworkRun:
        args = ("--results-dir", str(results), "--no-report", "--wire-bodies", SHARED_WIRE_BODY_BYTES)
        if PROFILES[profile]:
            done = e2b_bench("run", "frameworks", *args, *PROFILES[profile], timeout=1800)
        else:
            templates = [t for family in families() for t in load_manifest()["frameworks"][family].get("templates", [])]
            done = e2b_bench("run", "frameworks", *args, env=served_with(served, *templates), timeout=1800)
        return FrameworkRun(done, read_run(only_run_dir(results)))

    return shared.once(f"frameworks {profile}", make)


def families() -> list[str]:
    return sorted(load_manifest()["frameworks"])


def run_fixture(name: str, family: str) -> Any:
    """A module-scoped fixture `name` (`faithful` or `b3os`): the family's runner's part of the session's shared
    run of every framework (`frameworks_run`)."""

    def fixture(shared: Shared, served: dict[str, str]) -> SingleRun:
        made = frameworks_run(shared, name, served)
        return SingleRun(made.done, made.run, runner_of(family), family)

    return pytest.fixture(scope="module", name=name)(fixture)


def served_for(family: str, served: dict[str, str]) -> dict[str, str]:
    """`served` once the templates the family's runner creates from are built."""
    return served_with(served, *load_manifest()["frameworks"][family].get("templates", []))


def check_every_case_passes(done: FrameworkRun, runner: str) -> None:
    """Every step of the runner's family ran, in manifest order, and passed; no sandbox was left behind."""
    family = available_runners()[runner].spec.family
    cases = [c for c in done.run.cases if c.suite == "frameworks" and c.runner == runner]
    assert done.done.returncode == 0, done.output()
    assert [c.case for c in cases] == [s.id for s in load_steps("frameworks", str(family))]
    assert {(c.outcome, c.conformant) for c in cases} == {("pass", True)}
    assert [c.outcome for c in done.run.cases if c.case == "leak_check"] == ["pass"]


def check_judged_by_b3os_declarations(done: FrameworkRun) -> None:
    """The run was against the b3os-beta profile, judged by its declarations, and every case conforms."""
    assert done.run.header["endpoint"]["name"] == "local-b3os-beta"
    assert str(done.run.header["expectations"]).endswith("expectations/b3os-beta.toml")
    assert done.done.returncode == 0, done.output()
    assert all(c.conformant for c in done.run.cases)


@dataclass
class RecordingModel:
    """The scripted model on loopback, given to a run as a real model; `requests`: (method, path,
    Authorization header) as received."""

    server: ModelServer
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def authorizations(self, method: str = "POST") -> list[str | None]:
        return [auth for m, _, auth in self.requests if m == method]

    def base_url(self, tag: str) -> str:
        return self.server.endpoint.base_url(tag)


@contextlib.contextmanager
def recording_model() -> Iterator[RecordingModel]:
    with serving_model() as server:
        recording = RecordingModel(server)
        app = server.app.app

        async def record(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                value = dict(scope["headers"]).get(b"authorization")
                auth = value.decode() if value is not None else None
                recording.requests.append((scope["method"], scope["path"], auth))
            await app(scope, receive, send)

        server.app.app = record  # type: ignore[assignment]
        yield recording


MODEL_NAME = "named-model"
MODEL_KEY_ENV = "E2B_BENCH_TEST_MODEL_KEY"
MODEL_KEY = "sk-e2b-bench-test-3f9c1d"


def check_the_real_model_switch(
    results: Path, runner: str, requests: int, served: dict[str, str]
) -> tuple[FrameworkRun, RecordingModel]:
    """Run `runner` with `--model-base-url/--model/--model-key-env` naming the scripted model served on its
    own, against the test worker's endpoint (`served`): the proof task passes, every one of the `requests` the
    framework sent named the model and carried the key, the transcript says which model ran, and the key is
    nowhere in the run directory."""
    with recording_model() as model:
        base_url = model.base_url("real")
        flags = ("--model-base-url", base_url, "--model", MODEL_NAME, "--model-key-env", MODEL_KEY_ENV)
        env = {**served_for(str(available_runners()[runner].spec.family), served), MODEL_KEY_ENV: MODEL_KEY}
        done = bench_run(results, runner, *flags, env=env)
        exchanges = model.server.transcript.exchanges("real")

    assert done.done.returncode == 0, done.output()
    assert done.case(runner, "fw01_proof_task").outcome == "pass"
    assert [e["request"]["model"] for e in exchanges] == [MODEL_NAME] * requests
    assert model.authorizations() == [f"Bearer {MODEL_KEY}"] * requests  # the harness's own check is a GET
    assert done.transcript(runner)["model"] == {"base_url": base_url, "name": MODEL_NAME, "scripted": False}
    assert not any(MODEL_KEY in p.read_text(errors="replace") for p in done.run.path.rglob("*") if p.is_file())
    return done, model
