"""A conformance run: each selected runner runs once for its selected steps (plus their prerequisites)
through its own recording wire proxy, and every step is judged against the endpoint's declarations
into a case record. The pytest plugin (bench/plugin.py) drives it from its hooks; the run's lifecycle
(endpoint, preflight, run directory, leak sweep, footer, report) is bench/lifecycle.py's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .endpoints import Endpoint
from .exits import ExitCode
from .expectations import Expectations, judge
from .lifecycle import Lifecycle
from .model.server import ModelServer
from .redaction import Redactor
from .remote.transient import transient_only, with_conditions
from .results import CaseRecord, case_id
from .runners.catalog import Runner, prepare_all
from .runners.manifest import load_manifest, load_steps, task_steps
from .runners.protocol import StepResult, make_task, run_runner
from .shards import Shard
from .wire import WireProxy


@dataclass(frozen=True)
class RunOptions:
    """How the runners are driven (`--step-timeout`, the model flags, `--attempts`)."""

    step_timeout_s: float = 90.0
    model_base_url: str | None = None
    model: str | None = None
    model_key_env: str | None = None
    attempts: int = 2


@dataclass
class BenchSession:
    """One conformance run: which runners run which steps, their results, judged into case records.
    Its lifecycle (endpoint, run directory, sweep, footer) is `lifecycle`'s; the pytest hooks drive it."""

    options: RunOptions
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
    # (suite, runner, step) -> the retries and transient answers of the endpoint while that step ran
    conditions: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)  # the details of each non-conformant case
    shard: Shard | None = None  # `--shard K/N`: this run is one of N shards
    shard_header: dict[str, Any] | None = None  # what the shard kept, for the run header
    progress: Callable[[str], None] = field(default=lambda line: print(f"e2b-bench: {line}", file=sys.stderr))

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
        disk = self.lifecycle.disk_fault()
        if disk is not None:  # before anything starts: a full disk mid-run would lose the run
            self.lifecycle.preflight_error = disk
            self.exit_code = self.lifecycle.abort(disk, suite, code=ExitCode.HARNESS)
            return False
        try:
            self._serve()
        except Exception as exc:  # the embedded endpoint cannot start here (host, template): unusable
            self.lifecycle.preflight_error = f"the embedded endpoint could not start: {exc}"
        if self.lifecycle.preflight_error is None and any(runner.has_suite(FRAMEWORKS) for runner in self.runners):
            self.model = self._start_model()
        used = {name for _, name in self.selected}
        python_sdks = {
            runner.name: runner.pins["e2b"]
            for runner in self.runners
            if runner.name in used and runner.language == "python" and "e2b" in runner.pins
        }
        if self.lifecycle.preflight_error is not None or not self.lifecycle.preflight(python_sdks):
            self.exit_code = self.lifecycle.abort(self.lifecycle.preflight_error or "", suite)
            return False
        self._prepare([runner for runner in self.runners if runner.name in used])
        pins = {runner.name: self._pins(runner) for runner in self.runners}
        expectations = self.endpoint.expectations
        header: dict[str, Any] = {"expectations": str(expectations) if expectations else None}
        if self.shard_header is not None:
            header["shard"] = self.shard_header
        self.lifecycle.open(suite, pins, **header)
        return True

    def _serve(self) -> None:
        """Start the endpoint; a cold embedded one first builds its base template (tens of seconds)."""
        if self.endpoint.provider.embedded and self.lifecycle.server is None:
            self._build_template("base")
        self.lifecycle.serve()

    def _build_template(self, name: str) -> None:
        """Build an embedded endpoint's template unless cached, naming the build on the terminal (it takes
        tens of seconds to minutes); a template that cannot be built raises TemplateError."""
        from .localbox.template import ensure_template, template_built

        if template_built(name):
            return
        started = time.monotonic()
        self.progress(f"building the embedded endpoint's template {name}, cached for later runs")
        ensure_template(name=name)
        self.progress(f"template {name} ready after {time.monotonic() - started:.0f} s")

    def _prepare(self, runners: list[Runner]) -> None:
        """Build (or reuse) every runner's pinned environment at once, before the header names their pins;
        a runner that cannot be had is named now (its cases are recorded `error`, the run exits 3)."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="templates") as pool:
            templates = pool.submit(self._prepare_templates)
            self.prepared = prepare_all(runners, self.progress)
            templates.result()
        for problem in self.harness_faults:
            self.progress(problem)

    @property
    def harness_faults(self) -> list[str]:
        """Why each selected runner could not be had: the harness's environment, not the endpoint."""
        return [problem for problem in self.prepared.values() if isinstance(problem, str)]

    def _prepare_templates(self) -> None:
        """Build the embedded endpoint's templates the selected suites create from (`templates` of a suite's
        manifest table) before any runner starts, so no runner waits silently on a cold build (minutes).
        A template that cannot be built is left to the create, which answers why."""
        if not self.endpoint.provider.embedded:
            return
        from .localbox.template import TemplateError

        by_name = {r.name: r for r in self.runners}
        wanted = {
            template
            for suite, name in self.selected
            for template in load_manifest()[suite][by_name[name].table(suite)].get("templates", ())
        }
        for template in sorted(wanted):
            try:
                self._build_template(template)
            except TemplateError as exc:
                self.progress(f"template {template} could not be built: {exc}")

    def _pins(self, runner: Runner) -> dict[str, str]:
        executable = self.prepared.get(runner.name)
        return runner.resolved_versions(executable) if isinstance(executable, Path) else dict(runner.pins)

    def _start_model(self) -> ModelChoice:
        """A real model when `--model-base-url` is given, else the scripted one, served for the session."""
        base_url = self.options.model_base_url
        if base_url:
            key_env = self.options.model_key_env or ""
            key = os.environ.get(key_env, "") if key_env else ""
            self.redactor.add(key)
            name = self.options.model or ""
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
        if self._pool is None:  # set first: a Ctrl-C inside a submit leaves a runner started but no job kept
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
            if runner.has_suite(FRAMEWORKS) and self.model is not None and self.model.key_env:
                endpoint_env[self.model.key_env] = self.model.key
            result = run_runner(
                runner.for_suite(suite),
                executable,
                task,
                step_timeout_s=self.options.step_timeout_s,
                env=runner.environment(endpoint_env),
                on_event=lambda event: self._on_event(suite, runner, event, proxy),
                stop=self.stop,
            )
        self.created.update((result.footer or {}).get("cleanup") or {})
        return {step.id: step for step in result.step_results()}

    def _options(self, runner: Runner) -> dict[str, Any]:
        """Task options: a framework runner is told which model to use and what to ask it."""
        if not runner.has_suite(FRAMEWORKS) or self.model is None:
            return {}
        from .model import TASK_PROMPT

        return {
            "model": self.model.for_runner(runner.name),
            "prompt": TASK_PROMPT,
            "attempts": self.options.attempts,
        }

    def _on_event(self, suite: str, runner: Runner, event: dict[str, Any], proxy: WireProxy) -> None:
        """A step's end takes what the endpoint's conditions did while it ran (a runner runs its steps one
        after another); a runner's transcript goes to `<runner>.json`, with the scripted model's side of it."""
        if event.get("type") == "step":
            self.conditions[(suite, runner.name, str(event.get("id")))] = proxy.take_conditions()
        run_dir = self.lifecycle.run_dir
        if event.get("type") != "transcript" or run_dir is None:
            return
        transcript = dict(event.get("transcript") or {})
        if self.model is not None and self.model.scripted is not None:
            transcript["model_exchanges"] = self.model.scripted.transcript.exchanges(runner.name)
        run_dir.write_json(f"{runner.name}.json", transcript)

    def record(self, suite: str, runner: Runner, step: str, observed: StepResult) -> tuple[CaseRecord, str]:
        identifier = case_id(suite, runner.name, step)
        observed = with_conditions(observed, self.conditions.pop((suite, runner.name, step), []))
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
        if not record.conformant:
            self.failed.append(record.details)
        return record, verdict.note or ""

    def end(self, status: str, exit_code: int) -> int:
        """Leak sweep (when runners were started), then JUnit, footer and report; returns the exit code."""
        swept = self._pool is None or self.lifecycle.sweep(self.created).conformant
        if not swept and exit_code == ExitCode.OK:
            exit_code = ExitCode.NONCONFORMANT
        transient = transient_only(self.failed) if swept and status == "completed" else None
        if exit_code == ExitCode.NONCONFORMANT and transient is not None:
            self.progress(transient)
            exit_code = ExitCode.USAGE  # the endpoint's moment, kept apart from a conformance failure
        if exit_code == ExitCode.NONCONFORMANT and self.harness_faults:
            exit_code = ExitCode.HARNESS  # some cases could not run here at all: no verdict on the endpoint
        self.exit_code = self.lifecycle.finish(status, exit_code)  # type: ignore[arg-type]
        return self.exit_code


FRAMEWORKS = "frameworks"  # the suite whose runners talk to a model (other runner families, e.g. SDKs, do not)
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
