"""The pytest plugin: one item per case and runner against the endpoint chosen for the session.

Suite modules under `sandboxes/` declare a test function with a `case` argument and a `suite` marker;
this plugin parametrizes it over the selected runners and their manifest steps, runs each runner once
(JSON lines, through the recording wire proxy), judges every step against the endpoint's declarations
and records it in the run directory. The session owns the run directory: header at start, footer at
the end (completed, interrupted or aborted), then the report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from .coverage import write_coverage
from .endpoints import Endpoint, EndpointError, PreflightError, preflight, resolve
from .expectations import Expectations, ExpectationsError, judge
from .housekeeping import RUN_METADATA_KEY, kill_survivors, leak_record
from .junit import write_junit
from .model.server import ModelServer
from .redaction import Redactor
from .report import render
from .results import CaseRecord, RunDir, case_id, make_header
from .runners.catalog import Runner, available_runners, default_runners
from .runners.envs import RunnerEnvError
from .runners.manifest import load_steps, with_dependencies
from .runners.protocol import StepResult, run_runner
from .wire import WireProxy

REPO_ROOT = Path(__file__).resolve().parents[1]
SUITE_DIRS = ("sandboxes", "frameworks")  # where suite modules live
EXIT_PREFLIGHT = 2
EXIT_INTERRUPTED = 130
STASH = pytest.StashKey["BenchSession"]()


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
    group.addoption("--results-dir", default=str(REPO_ROOT / "results"), help="where run directories go")
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
    """Everything one recorded run needs, created at configure time and closed at the end."""

    config: pytest.Config
    endpoint: Endpoint
    key: str | None
    runners: list[Runner]
    redactor: Redactor
    expectations: Expectations
    run_dir: RunDir | None = None
    suites: set[str] = field(default_factory=set)
    selected: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (suite, runner) -> step ids
    results: dict[tuple[str, str], dict[str, StepResult]] = field(default_factory=dict)
    jobs: dict[tuple[str, str], Future[dict[str, StepResult]]] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    preflight_error: str | None = None
    exit_code: int | None = None
    model: ModelChoice | None = None  # set when a framework runner is selected
    _local: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def run_id(self) -> str:
        return self.run_dir.path.name if self.run_dir else "unstarted"

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, suites: list[str]) -> None:
        if self.endpoint.kind == "local":
            self._start_local()
        if any(runner.spec.family for runner in self.runners):
            self.model = self._start_model()
        endpoint_info = {
            "name": self.endpoint.name,
            "kind": self.endpoint.kind,
            "api_url": self.endpoint.api_url,
            "sandbox_url": self.endpoint.sandbox_url,
            "key_env": self.endpoint.key_env,
        }
        pins = {runner.name: dict(runner.pins) for runner in self.runners}
        pins["harness"] = harness_pins()
        header = make_header(endpoint_info, pins, sys.argv)
        header["expectations"] = str(self.endpoint.expectations) if self.endpoint.expectations else None
        self.run_dir = RunDir.create(
            Path(self.config.getoption("results_dir")),
            "+".join(suites) or "none",
            self.endpoint.name,
            header,
            self.redactor,
        )

    def _start_local(self) -> None:
        from .localbox.quirks import build
        from .localbox.server import serving

        quirks = build(self.config.getoption("quirk_profile"), self.config.getoption("quirk"))
        local = self._local.enter_context(serving(quirks=quirks))
        self.key = local.api_key
        self.redactor.add(local.api_key)
        self.endpoint = self.endpoint.bound(local.api_url)

    def _start_model(self) -> ModelChoice:
        """A real model when `--model-base-url` is given, else the scripted one, served for the session."""
        base_url = self.config.getoption("model_base_url")
        if base_url:
            key_env = self.config.getoption("model_key_env") or ""
            key = os.environ.get(key_env, "") if key_env else ""
            if key:
                self.redactor.add(key)
            name = self.config.getoption("model") or ""
            return ModelChoice(base_url=base_url.rstrip("/"), name=name, key_env=key_env, key=key, scripted=None)
        from .model import serving_model

        scripted = self._local.enter_context(serving_model(redactor=self.redactor))
        endpoint = scripted.endpoint
        return ModelChoice(endpoint.url, endpoint.model, SCRIPTED_KEY_ENV, SCRIPTED_KEY, scripted=scripted)

    def check_endpoint(self) -> None:
        try:
            preflight(self.endpoint, self.key)
        except PreflightError as exc:
            self.preflight_error = str(exc)

    def stop_runners(self) -> None:
        """Stop every runner still going (each gets SIGTERM, so it can kill its sandboxes) and wait."""
        self.stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self.stop_runners()
        self._local.close()

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
        requested = with_dependencies(steps, self.selected.get((suite, runner.name), []))
        assert self.run_dir is not None
        try:
            executable = runner.prepare()
        except RunnerEnvError as exc:
            message = f"runner environment {runner.name} could not be built: {exc}"
            return {s: StepResult(s, "error", None, message, {}, False) for s in requested}
        self.run_dir.set_pins(runner.name, runner.resolved_versions(executable))
        task = {
            "suite": suite,
            "steps": requested,
            "depends": {s.id: list(s.depends) for s in steps},
            "run_id": self.run_id,
            "runner": runner.name,
            "metadata": {RUN_METADATA_KEY: self.run_id},
            "options": self._options(runner),
        }
        with WireProxy(
            self.endpoint.api_url,
            self.endpoint.sandbox_url,
            self.run_dir.wire_path(runner.name),
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
        if event.get("type") != "transcript" or self.run_dir is None:
            return
        transcript = dict(event.get("transcript") or {})
        if self.model is not None and self.model.scripted is not None:
            transcript["model_exchanges"] = self.model.scripted.transcript.exchanges(runner.name)
        self.run_dir.write_json(f"{runner.name}.json", transcript)

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
        assert self.run_dir is not None
        self.run_dir.record(record)
        return record, verdict.note or ""

    # --- housekeeping -------------------------------------------------------------------------
    def leak_check(self) -> None:
        """Any sandbox of this run still alive is recorded as an error (and killed)."""
        if self.run_dir is None or self.preflight_error or not self.jobs:
            return
        started = time.monotonic()
        survivors: list[str] = []
        error: str | None = None
        try:
            survivors = kill_survivors(self.endpoint.api_url, self.key, self.run_id)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            error = f"leak check could not list sandboxes: {exc}"
        record = leak_record(survivors, error, round((time.monotonic() - started) * 1000, 1))
        self.run_dir.record(record)
        if not record.conformant and self.exit_code == 0:
            self.exit_code = 1


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


def harness_pins() -> dict[str, str]:
    """Versions of what the harness itself runs on (the embedded endpoint speaks through these)."""
    found = {}
    for package in ("e2b", "connectrpc", "protobuf-py", "uvicorn", "starlette", "httptools", "uvloop", "httpx"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    found["python"] = platform.python_version()
    return found


def _suite_mode(config: pytest.Config) -> bool:
    if config.getoption("bench"):
        return True
    suite_roots = [REPO_ROOT / name for name in SUITE_DIRS]
    return any(Path(arg.split("::")[0]).resolve().is_relative_to(root) for arg in config.args for root in suite_roots)


def _bench(config: pytest.Config) -> BenchSession | None:
    return config.stash.get(STASH, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "suite(name): a conformance suite parametrized over runners and steps")
    if not _suite_mode(config):
        return
    try:
        endpoint = _with_profile(resolve(config.getoption("endpoint")), config)
        expectations = Expectations.load(endpoint.expectations)
        runners = _selected_runners(config)
    except (EndpointError, ExpectationsError, KeyError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    key = endpoint.api_key()
    session = BenchSession(
        config=config,
        endpoint=endpoint,
        key=key,
        runners=runners,
        redactor=Redactor([key]),
        expectations=expectations,
    )
    config.stash[STASH] = session


def _with_profile(endpoint: Endpoint, config: pytest.Config) -> Endpoint:
    """The embedded endpoint under a quirk profile is named after it and judged by its declarations."""
    explicit = config.getoption("expectations")
    profile = config.getoption("quirk_profile")
    if endpoint.kind == "local" and (profile != "e2b" or config.getoption("quirk")):
        name = f"local-{profile}" if profile != "e2b" else "local"
        if config.getoption("quirk"):
            name += "+quirks"
        declared = REPO_ROOT / "expectations" / f"{profile}.toml"
        expectations = declared if profile != "e2b" and declared.exists() else endpoint.expectations
        endpoint = dataclasses.replace(endpoint, name=name, expectations=expectations)
    if explicit:
        endpoint = dataclasses.replace(endpoint, expectations=Path(explicit))
    return endpoint


def _selected_runners(config: pytest.Config) -> list[Runner]:
    known = available_runners()
    if config.getoption("matrix"):
        return list(known.values())
    names = config.getoption("runner")
    if not names:
        return default_runners()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown runner {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return [known[n] for n in names]


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
    bench.start(sorted(bench.suites))
    bench.check_endpoint()
    if bench.preflight_error:
        bench.exit_code = EXIT_PREFLIGHT
        _finish(bench, "aborted")
        pytest.exit(f"e2b-bench: {bench.preflight_error}", returncode=EXIT_PREFLIGHT)


@pytest.fixture
def bench_session(request: pytest.FixtureRequest) -> BenchSession:
    session = _bench(request.config)
    if session is None or session.run_dir is None:
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
    if bench is None or bench.run_dir is None or bench.preflight_error:
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    bench.exit_code = 0 if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) else 1
    if interrupted:
        bench.exit_code = EXIT_INTERRUPTED
        bench.stop_runners()
    bench.leak_check()
    status = "interrupted" if interrupted else "completed"
    if exitstatus in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        status = "aborted"
    _finish(bench, status)
    if bench.exit_code != exitstatus and (bench.exit_code == EXIT_INTERRUPTED or exitstatus == pytest.ExitCode.OK):
        session.exitstatus = bench.exit_code


def _finish(bench: BenchSession, status: str) -> None:
    assert bench.run_dir is not None
    if bench.preflight_error:
        bench.run_dir.write_json("preflight.json", {"error": bench.preflight_error})
    bench.run_dir.write_text("junit.xml", write_junit(bench.run_dir.path))
    write_coverage(bench.run_dir.path)
    bench.run_dir.finish(status, bench.exit_code if bench.exit_code is not None else 1)  # type: ignore[arg-type]
    if not bench.config.getoption("no_report"):
        with contextlib.suppress(Exception):
            paths = render([bench.run_dir.path], bench.run_dir.path, bench.redactor)
            bench.report = paths  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    bench = _bench(config)
    if bench is None or bench.run_dir is None:
        return
    terminalreporter.section("e2b-bench")
    if bench.preflight_error:
        terminalreporter.write_line(f"endpoint unusable: {bench.preflight_error}")
    terminalreporter.write_line(f"run directory: {bench.run_dir.path}")
    report = getattr(bench, "report", None)
    if report is not None:
        terminalreporter.write_line(f"report: {report.html}")
        terminalreporter.write_line(f"summary: {report.markdown}")


def pytest_unconfigure(config: pytest.Config) -> None:
    bench = _bench(config)
    if bench is not None:
        bench.close()
