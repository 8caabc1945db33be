"""The pytest plugin: one item per case and runner against the endpoint chosen for the session.

Suite modules under `sandboxes/` declare a test function with a `case` argument and a `suite` marker;
this plugin parametrizes it over the selected runners and their manifest steps, runs each runner once
(JSON lines, through the recording wire proxy), judges every step against the endpoint's declarations
and records it in the run directory. The session owns the run directory: header at start, footer at
the end (completed, interrupted or aborted), then the report.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .endpoints import Endpoint
from .exits import ExitCode
from .expectations import Expectations, judge
from .lifecycle import Lifecycle
from .model.server import ModelServer
from .paths import RESULTS_DIR, SUITE_DIRS
from .redaction import Redactor
from .results import CaseRecord, case_id
from .runners.catalog import Runner, default_runners
from .runners.envs import RunnerEnvError
from .runners.manifest import load_steps, task_steps
from .runners.protocol import StepResult, make_task, run_runner
from .selection import SelectionError, select
from .wire import WireProxy

STASH = pytest.StashKey["BenchSession"]()
MARKERS = (
    "suite(name): a conformance suite parametrized over runners and steps",
    "slow: takes more than a few seconds of waiting (excluded by default in CI)",
    "bench: benchmarks (excluded by default)",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("e2b-bench", "e2b-bench conformance runs")
    group.addoption("--bench", action="store_true", help="record a run (implied when sandboxes/ suites are collected)")
    group.addoption(
        "--endpoint",
        default=os.environ.get("E2B_BENCH_ENDPOINT", "local"),
        help="local (embedded, default) | env (E2B_API_KEY + E2B_API_URL/E2B_SANDBOX_URL or E2B_DOMAIN) | a name "
        "from endpoints.toml",
    )
    group.addoption("--runner", action="append", default=[], help="runner name (repeatable); default: one per language")
    group.addoption("--matrix", action="store_true", help="every registered runner (all SDK pins)")
    group.addoption("--results-dir", default=str(RESULTS_DIR), help="where run directories go")
    group.addoption("--step-timeout", type=float, default=90.0, help="seconds a runner may stay silent")
    group.addoption("--quirk-profile", default="e2b", help="quirk profile of the embedded endpoint")
    group.addoption("--quirk", action="append", default=[], help="NAME[=VALUE] quirk of the embedded endpoint")
    group.addoption("--no-report", action="store_true", help="do not render the report at the end")
    group.addoption("--expectations", default=None, help="declarations file to judge against (default: the endpoint's)")
    group.addoption(
        "--model-base-url",
        default=None,
        help="OpenAI-compatible base URL of a real model for the framework suite (default: the scripted model)",
    )
    group.addoption("--model", default=None, help="model name to ask for (with --model-base-url)")
    group.addoption(
        "--model-key-env",
        default=None,
        help="NAME of the environment variable holding the model's API key (never the key itself)",
    )
    group.addoption("--attempts", type=int, default=2, help="tries of a framework's proof task before it fails")


@dataclass
class BenchSession:
    """What the pytest hooks share for one recorded run; the run itself is `lifecycle`'s."""

    config: pytest.Config
    lifecycle: Lifecycle
    runners: list[Runner]
    expectations: Expectations
    suites: set[str] = field(default_factory=set)
    selected: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (suite, runner) -> step ids
    prepared: dict[str, Path | str] = field(default_factory=dict)  # runner -> executable, or why it is unusable
    results: dict[tuple[str, str], dict[str, StepResult]] = field(default_factory=dict)
    jobs: dict[tuple[str, str], Future[dict[str, StepResult]]] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None
    model: ModelChoice | None = None  # set when a framework runner is selected
    created: set[str] = field(default_factory=set)  # sandbox ids the runners' footers say they created

    @property
    def endpoint(self) -> Endpoint:
        return self.lifecycle.endpoint

    @property
    def key(self) -> str | None:
        return self.lifecycle.key

    @property
    def redactor(self) -> Redactor:
        return self.lifecycle.redactor

    @property
    def preflight_error(self) -> str | None:
        return self.lifecycle.preflight_error

    @property
    def run_id(self) -> str:
        return self.lifecycle.run_id

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, suites: list[str]) -> bool:
        """Endpoint, model, preflight, pinned runners, run directory; False when the preflight failed."""
        suite = "+".join(suites) or "none"
        try:
            self.lifecycle.serve()
        except Exception as exc:  # the embedded endpoint cannot start here (host, template): unusable
            self.lifecycle.preflight_error = f"the embedded endpoint could not start: {exc}"
        if self.lifecycle.preflight_error is None and any(runner.spec.family for runner in self.runners):
            self.model = self._start_model()
        if self.lifecycle.preflight_error is not None or not self.lifecycle.preflight():
            self.exit_code = self.lifecycle.abort(self.lifecycle.preflight_error or "", suite)
            return False
        used = {name for _, name in self.selected}
        self._prepare([runner for runner in self.runners if runner.name in used])
        pins = {runner.name: self._pins(runner) for runner in self.runners}
        expectations = self.endpoint.expectations
        self.lifecycle.open(suite, pins, expectations=str(expectations) if expectations else None)
        return True

    def _prepare(self, runners: list[Runner]) -> None:
        """Build (or reuse) every runner's pinned environment at once, before the header names their pins."""

        def prepare(runner: Runner) -> Path | str:
            try:
                return runner.prepare()
            except RunnerEnvError as exc:
                return f"runner environment {runner.name} could not be built: {exc}"

        with ThreadPoolExecutor(max_workers=max(len(runners), 1), thread_name_prefix="prepare") as pool:
            self.prepared = dict(zip([r.name for r in runners], pool.map(prepare, runners), strict=True))

    def _pins(self, runner: Runner) -> dict[str, str]:
        executable = self.prepared.get(runner.name)
        return runner.resolved_versions(executable) if isinstance(executable, Path) else dict(runner.pins)

    def _start_model(self) -> ModelChoice:
        """A real model when `--model-base-url` is given, else the scripted one, served for the session."""
        base_url = self.config.getoption("model_base_url")
        if base_url:
            key_env = self.config.getoption("model_key_env") or ""
            key = os.environ.get(key_env, "") if key_env else ""
            self.redactor.add(key)
            name = self.config.getoption("model") or ""
            return ModelChoice(base_url=base_url.rstrip("/"), name=name, key_env=key_env, key=key, scripted=None)
        from .model import serving_model

        scripted = self.lifecycle.stack.enter_context(serving_model(redactor=self.redactor))
        endpoint = scripted.endpoint
        return ModelChoice(endpoint.url, endpoint.model, SCRIPTED_KEY_ENV, SCRIPTED_KEY, scripted=scripted)

    def stop_runners(self) -> None:
        """Stop every runner still going (each gets SIGTERM, so it can kill its sandboxes) and wait."""
        self.stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self.stop_runners()
        self.lifecycle.close()

    # --- running ------------------------------------------------------------------------------
    def step_result(self, suite: str, runner: Runner, step: str) -> StepResult:
        """The observed result of one step; the first call starts every selected runner at once."""
        if not self.jobs:
            by_name = {r.name: r for r in self.runners}
            self._pool = ThreadPoolExecutor(max_workers=max(len(self.selected), 1), thread_name_prefix="runner")
            for key in self.selected:
                self.jobs[key] = self._pool.submit(self._run, key[0], by_name[key[1]])
        key = (suite, runner.name)
        if key not in self.results:
            self.results[key] = self.jobs[key].result()
        return self.results[key][step]

    def _run(self, suite: str, runner: Runner) -> dict[str, StepResult]:
        steps = load_steps(suite, runner.table(suite))  # type: ignore[arg-type]
        planned = task_steps(steps, self.selected.get((suite, runner.name), []))
        run_dir = self.lifecycle.run_dir
        assert run_dir is not None
        executable = self.prepared[runner.name]
        if not isinstance(executable, Path):
            return {s: StepResult(s, "error", None, executable, {}, False) for s in planned["steps"]}
        task = make_task(suite, runner.name, self.run_id, **planned, options=self._options(runner))
        with WireProxy(
            self.endpoint.api_url,
            self.endpoint.sandbox_url,
            run_dir.wire_path(runner.name),
            runner.name,
            self.redactor,
            domain=self.endpoint.domain,
        ) as proxy:
            endpoint_env = {"E2B_API_KEY": self.key or "", "E2B_API_URL": proxy.url, "E2B_SANDBOX_URL": proxy.url}
            if runner.spec.family and self.model is not None and self.model.key_env:
                endpoint_env[self.model.key_env] = self.model.key
            result = run_runner(
                runner.for_suite(suite),
                executable,
                task,
                step_timeout_s=self.config.getoption("step_timeout"),
                env=runner.environment(endpoint_env),
                on_event=lambda event: self._on_event(runner, event),
                stop=self.stop,
            )
        self.created.update((result.footer or {}).get("cleanup") or {})
        return {step.id: step for step in result.step_results()}

    def _options(self, runner: Runner) -> dict[str, Any]:
        """Task options: a framework runner is told which model to use and what to ask it."""
        if not runner.spec.family or self.model is None:
            return {}
        from .model import TASK_PROMPT

        return {
            "model": self.model.for_runner(runner.name),
            "prompt": TASK_PROMPT,
            "attempts": self.config.getoption("attempts"),
        }

    def _on_event(self, runner: Runner, event: dict[str, Any]) -> None:
        """A runner's transcript goes to `<runner>.json`, with the scripted model's side of it."""
        run_dir = self.lifecycle.run_dir
        if event.get("type") != "transcript" or run_dir is None:
            return
        transcript = dict(event.get("transcript") or {})
        if self.model is not None and self.model.scripted is not None:
            transcript["model_exchanges"] = self.model.scripted.transcript.exchanges(runner.name)
        run_dir.write_json(f"{runner.name}.json", transcript)

    def record(self, suite: str, runner: Runner, step: str, observed: StepResult) -> tuple[CaseRecord, str]:
        identifier = case_id(suite, runner.name, step)
        declared = self.expectations.for_case(identifier)
        verdict = judge(observed.outcome, observed.details, observed.error, declared)
        if verdict.outcome != observed.outcome:  # keep what the runner saw before judgement
            observed.details.setdefault("observed_outcome", observed.outcome)
        record = CaseRecord(
            id=identifier,
            suite=suite,
            runner=runner.name,
            case=step,
            outcome=verdict.outcome,
            expected=verdict.expected,
            conformant=verdict.conformant,
            duration_ms=observed.duration_ms,
            error=observed.error,
            details=observed.details,
            note=verdict.note,
        )
        assert self.lifecycle.run_dir is not None
        self.lifecycle.run_dir.record(record)
        return record, verdict.note or ""

    def end(self, status: str, exit_code: int) -> int:
        """Leak sweep (when runners ran), then JUnit, footer and report; returns the exit code."""
        if self.jobs and not self.lifecycle.sweep(self.created).conformant and exit_code == ExitCode.OK:
            exit_code = ExitCode.NONCONFORMANT
        self.exit_code = self.lifecycle.finish(status, exit_code)  # type: ignore[arg-type]
        return self.exit_code


SCRIPTED_KEY_ENV = "E2B_BENCH_MODEL_KEY"
SCRIPTED_KEY = "e2b-bench-scripted-model"  # the scripted model checks no key; OpenAI clients need one


@dataclass(frozen=True)
class ModelChoice:
    """The model framework runners talk to: a real one (`--model-base-url`) or the session's scripted one."""

    base_url: str
    name: str
    key_env: str
    key: str = field(repr=False)
    scripted: ModelServer | None

    def for_runner(self, runner: str) -> dict[str, Any]:
        """What a runner's task says about the model: never the key, only the variable holding it."""
        base_url = self.scripted.endpoint.base_url(runner) if self.scripted is not None else self.base_url
        return {"base_url": base_url, "name": self.name, "key_env": self.key_env, "scripted": self.scripted is not None}


def _suite_mode(config: pytest.Config) -> bool:
    if config.getoption("bench"):
        return True
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return any(path.is_relative_to(root) for path in paths for root in SUITE_DIRS)


def _bench(config: pytest.Config) -> BenchSession | None:
    return config.stash.get(STASH, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not _suite_mode(config):
        return
    try:
        chosen = select(
            config.getoption("endpoint"),
            profile=config.getoption("quirk_profile"),
            quirks=config.getoption("quirk"),
            expectations=config.getoption("expectations"),
            runners=config.getoption("runner"),
            matrix=config.getoption("matrix"),
        )
    except SelectionError as exc:
        raise pytest.UsageError(str(exc)) from exc
    lifecycle = Lifecycle(
        chosen.endpoint,
        results_dir=Path(config.getoption("results_dir")),
        redactor=Redactor(),
        quirks=chosen.quirks,
        report=not config.getoption("no_report"),
    )
    session = BenchSession(config=config, lifecycle=lifecycle, runners=chosen.runners, expectations=chosen.expectations)
    config.stash[STASH] = session


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("suite")
    if marker is None or "case" not in metafunc.fixturenames:
        return
    session = _bench(metafunc.config)
    suite = marker.args[0]
    runners = session.runners if session else default_runners()
    cases = []
    for runner in runners:
        if not runner.has_suite(suite):
            continue
        for step in load_steps(suite, runner.table(suite)):  # type: ignore[arg-type]
            marks = [pytest.mark.slow] if step.slow else []
            cases.append(pytest.param((suite, runner, step.id), id=f"{runner.name}/{step.id}", marks=marks))
    metafunc.parametrize("case", cases)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: record only what will really run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = _bench(config)
    if session is None:
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        # Not a tuple: pytest's placeholder for a suite that none of the selected runners has (skipped).
        if callspec and isinstance(callspec.params.get("case"), tuple):
            suite, runner, step = callspec.params["case"]
            session.suites.add(suite)
            session.selected.setdefault((suite, runner.name), []).append(step)


def pytest_collection_finish(session: pytest.Session) -> None:
    bench = _bench(session.config)
    if bench is None or not bench.suites:
        return
    if not bench.start(sorted(bench.suites)):
        pytest.exit(f"e2b-bench: {bench.preflight_error}", returncode=ExitCode.USAGE)


@pytest.fixture
def bench_session(request: pytest.FixtureRequest) -> BenchSession:
    session = _bench(request.config)
    if session is None or session.lifecycle.run_dir is None:
        pytest.skip("not a recorded e2b-bench run")
    return session


def check_case(session: BenchSession, case: tuple[str, Runner, str]) -> None:
    """Run (once per runner) and judge one case; the pytest outcome says whether it conformed."""
    suite, runner, step = case
    observed = session.step_result(suite, runner, step)
    record, note = session.record(suite, runner, step, observed)
    if not record.conformant:
        detail = f"{record.outcome} (declared {record.expected})"
        reason = f": {record.error}" if record.error else ""
        pytest.fail(f"{detail}{reason}{f' — {note}' if note else ''}", pytrace=False)
    if record.outcome == "skip":
        pytest.skip(record.error or "skipped")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bench = _bench(session.config)
    if bench is None or bench.lifecycle.run_dir is None or bench.preflight_error:
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    code: int = (
        ExitCode.OK
        if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        else ExitCode.NONCONFORMANT
    )
    status = "completed"
    if interrupted:
        code, status = ExitCode.INTERRUPTED, "interrupted"
        bench.stop_runners()
    elif exitstatus in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        status = "aborted"
    code = bench.end(status, code)
    if code != exitstatus and (code == ExitCode.INTERRUPTED or exitstatus == pytest.ExitCode.OK):
        session.exitstatus = code


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    bench = _bench(config)
    if bench is None or bench.lifecycle.run_dir is None:
        return
    terminalreporter.section("e2b-bench")
    if bench.preflight_error:
        terminalreporter.write_line(f"endpoint unusable: {bench.preflight_error}")
    terminalreporter.write_line(f"run directory: {bench.lifecycle.run_dir.path}")
    report = bench.lifecycle.report_paths
    if report is not None:
        terminalreporter.write_line(f"report: {report.html}")
        terminalreporter.write_line(f"summary: {report.markdown}")


def pytest_unconfigure(config: pytest.Config) -> None:
    bench = _bench(config)
    if bench is not None:
        bench.close()
