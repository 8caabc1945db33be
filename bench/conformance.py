"""A conformance run: each selected runner runs once for its selected steps (plus their prerequisites)
through its own recording wire proxy, and every step is judged against the endpoint's declarations
into a case record. The pytest plugin (bench/plugin.py) drives it from its hooks; the run's lifecycle
(endpoint, preflight, run directory, leak sweep, footer, report) is bench/lifecycle.py's.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .differential.session import Differential
from .endpoints import Endpoint
from .exits import ExitCode
from .expectations import DECLARED_PREREQUISITE, Expectations, judge
from .expectations import DEFAULT as DEFAULT_DECLARATION
from .housekeeping import ALREADY_GONE, KILLED, kill_left
from .lifecycle import Lifecycle
from .redaction import Redactor
from .remote import capacity
from .remote.budget import Budget, cost_line, retries_figure
from .remote.faults import fault_options
from .remote.ledger import SandboxLedger
from .remote.lifetimes import task_factor, task_lifetime_s
from .remote.rerun import Settled, handed_on, rerun, wants_rerun
from .remote.resume import run_resuming, step_deadlines
from .remote.slowness import scaled, slowness
from .remote.transient import RouteAnswers, is_transient, transient_only, with_conditions
from .results import CaseRecord, case_id
from .runners.catalog import Runner, prepare_all
from .runners.manifest import load_manifest, load_steps, task_steps
from .runners.protocol import INTERRUPTED, Event, RunnerResult, StepResult, make_task, run_runner
from .shards import Shard
from .triage.evidence import StepSeen, Window, WireLogs, bounded, stamped
from .upstream.plan import task_options as upstream_options
from .wire import WireProxy, last_exchange

if TYPE_CHECKING:  # the scripted model is imported only by a run that serves it
    from .model.server import ModelServer


@dataclass(frozen=True)
class RunOptions:
    """How the runners are driven (`--step-timeout`, the model flags, `--attempts`, the budgets)."""

    step_timeout_s: float = 90.0  # a step declaring no `expect_s`, on a quiet host; also the runner's silence
    max_sandboxes: int | None = None  # None: the endpoint's quota (endpoints.toml), if any
    max_minutes: float | None = None
    model_base_url: str | None = None
    model: str | None = None
    model_key_env: str | None = None
    attempts: int = 2


DEPENDS_ON = re.compile(r"depends on (\S+)")  # a step that did not run because a step it needs failed


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
    model: ModelChoice | None = None  # set when a framework case is selected
    created: set[str] = field(default_factory=set)  # sandbox ids the runners' footers say they created
    records: dict[tuple[str, str, str], tuple[CaseRecord, str]] = field(default_factory=dict)  # recorded cases
    observed: dict[tuple[str, str, str], StepResult] = field(default_factory=dict)  # what each recorded case saw
    recorded: threading.Condition = field(default_factory=threading.Condition)
    ledger: SandboxLedger = field(default_factory=SandboxLedger)  # every sandbox the runners created
    budget: Budget = field(default_factory=Budget)
    start_faults: list[str] = field(default_factory=list)  # runners that died before they said hello
    stop_reason: str | None = None  # why the run stopped before its end (a budget), for the cases not run
    left: dict[str, str] = field(default_factory=dict)  # sandboxes left by this run -> what their kill did
    cost: dict[str, Any] | None = None  # the footer's cost figure, once the run ended
    _timer: threading.Timer | None = None
    # (suite, runner, step) -> the retries and transient answers of the endpoint while that step ran
    conditions: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    answers: RouteAnswers = field(default_factory=RouteAnswers)  # how each kind of request was answered
    # (suite, runner, step) of a case judged the endpoint's moment -> what it saw and the conditions around it
    transient: dict[tuple[str, str, str], tuple[StepResult, list[dict[str, Any]]]] = field(default_factory=dict)
    shard: Shard | None = None  # `--shard K/N`: this run is one of N shards
    shard_header: dict[str, Any] | None = None  # what the shard kept, for the run header
    empty_shard_suites: list[str] = field(default_factory=list)  # a shard dealt no case: the selection's suites
    narrowing: list[tuple[str, int]] = field(default_factory=list)  # (what selected, cases left) in order
    progress: Callable[[str], None] = field(default=lambda line: print(f"e2b-bench: {line}", file=sys.stderr))
    on_step: Callable[[str, str, dict[str, Any]], None] | None = None  # (suite, runner, step event) as reported
    steps_seen: dict[tuple[str, str], list[StepSeen]] = field(default_factory=dict)  # (suite, runner): in order
    starts: dict[tuple[str, str, str], datetime] = field(default_factory=dict)  # a step's runner-stamped start
    proxies: dict[tuple[str, str], tuple[WireProxy, dict[str, float]]] = field(
        default_factory=dict
    )  # + step -> read at
    wire_logs: WireLogs = field(default_factory=WireLogs)
    differential: Differential | None = None  # each case judged against its reference trace (bench/differential/)
    gate: capacity.RunnerGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = capacity.RunnerGate(lambda: self.ledger.limit())

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
        # only for framework cases selected: every default selection has framework runners, most no framework case
        if self.lifecycle.preflight_error is None and any(suite == FRAMEWORKS for suite, _ in self.selected):
            self.model = self._start_model()
        used = {name for _, name in self.selected}
        if self.lifecycle.preflight_error is not None or not self.lifecycle.preflight(self.python_sdks()):
            self.exit_code = self.lifecycle.abort(self.lifecycle.preflight_error or "", suite)
            return False
        self._prepare([runner for runner in self.runners if runner.name in used])
        pins = {runner.name: self._pins(runner) for runner in self.runners}
        expectations = self.endpoint.expectations
        header: dict[str, Any] = {"expectations": str(expectations) if expectations else None}
        if self.shard_header is not None:
            header["shard"] = self.shard_header
        self.budget = self.endpoint.budget.with_max(self.options.max_sandboxes)
        self.ledger.max_sandboxes = self.budget.max_sandboxes
        self.ledger.on_capacity = lambda limit, message: self.progress(capacity.sentence(limit, message))
        header["budget"] = {"max_sandboxes": self.budget.max_sandboxes, "max_minutes": self.options.max_minutes}
        header["slowness"] = slowness()
        self.lifecycle.open(suite, pins, **header)
        if self.options.max_minutes is not None:
            self._timer = threading.Timer(self.options.max_minutes * 60, self.spent, (self.options.max_minutes,))
            self._timer.daemon = True
            self._timer.start()
        return True

    def python_sdks(self) -> dict[str, str]:
        """Runner name -> the Python `e2b` it pins, for the selected runners (some SDKs judge the key's form)."""
        used = {name for _, name in self.selected}
        return {
            runner.name: runner.pins["e2b"]
            for runner in self.runners
            if runner.name in used and runner.language == "python" and "e2b" in runner.pins
        }

    def spent(self, minutes: float) -> None:
        """The time budget is reached: runners stop (killing their sandboxes) and every case not finished is
        recorded `not run` with the reason; the run then ends as an interrupted one."""
        self.stop_reason = f"budget of {minutes:g} min reached"
        self.progress(f"{self.stop_reason}: stopping the runners, keeping every finished case")
        self.stop.set()

    def _serve(self) -> None:
        """Start the endpoint; a cold embedded one first builds its base template (tens of seconds)."""
        if self.endpoint.provider.embedded and self.lifecycle.server is None:
            self._build_template("base")
        # A case makes about one sandbox: a run of a few cases has no more made ahead than it will take.
        self.lifecycle.serve(sandboxes=sum(len(steps) for steps in self.selected.values()))

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
        """Why each selected runner could not be had (built, or started): the harness's environment, not the
        endpoint."""
        built = [problem for problem in self.prepared.values() if isinstance(problem, str)]
        return built + self.start_faults

    def _prepare_templates(self) -> None:
        """Build the embedded endpoint's templates the selected suites create from (`templates` of a suite's
        manifest table) before any runner starts, so no runner waits silently on a cold build (minutes).
        A template that cannot be built is left to the create, which answers why."""
        if not self.endpoint.provider.embedded:
            return
        from .localbox.template import TemplateError, template_built

        by_name = {r.name: r for r in self.runners}
        wanted = Counter(
            template
            for suite, name in self.selected
            for template in load_manifest()[suite][by_name[name].table(suite)].get("templates", ())
        )
        for template in sorted(wanted):
            try:
                self._build_template(template)
            except TemplateError as exc:
                self.progress(f"template {template} could not be built: {exc}")
        if self.lifecycle.server is not None:  # about one sandbox of it per runner: started ahead (warm.py)
            self.lifecycle.server.keep_warm({t: n for t, n in wanted.items() if template_built(t)})

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
        if self._timer is not None:
            self._timer.cancel()
        self.stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self.stop_runners()
        self.lifecycle.close()

    # --- running ------------------------------------------------------------------------------
    def step_result(self, suite: str, runner: Runner, step: str) -> StepResult:
        """The observed result of one step, as soon as it is known; the first call starts every selected
        runner at once."""
        if self._pool is None:  # set first: a Ctrl-C inside a submit leaves a runner started but no job kept
            by_name = {r.name: r for r in self.runners}
            self._pool = ThreadPoolExecutor(max_workers=max(len(self.selected), 1), thread_name_prefix="runner")
            for key in self.selected:
                self.jobs[key] = self._pool.submit(self._run, key[0], by_name[key[1]])
        key = (suite, runner.name)
        job = self.jobs[key]
        with self.recorded:
            while (suite, runner.name, step) not in self.observed and not job.done():
                self.recorded.wait(timeout=0.5)
            if (suite, runner.name, step) in self.observed:
                return self.observed[(suite, runner.name, step)]
        if key not in self.results:
            self.results[key] = job.result()
        return self.results[key][step]

    def _run(self, suite: str, runner: Runner) -> dict[str, StepResult]:
        """Run one runner for its steps, each selected step recorded as it ends; a step that outlives its
        deadline is recorded `error` and a fresh runner goes on with the steps after it."""
        results: dict[str, StepResult] = {}
        only: list[str] | None = None  # after a yield: the steps it had not finished
        while True:
            with self.gate.slot(self.stop) as seat:  # as many runners at once as the run's sandbox limit fits
                halt = capacity.Halt(self.stop, self.gate, seat)
                results.update(self._run_runner(suite, runner, halt, only))
            only = [step for step in self.selected.get((suite, runner.name), []) if step not in results]
            if not halt.yielded or self.stop.is_set() or not only:
                return results
            self._kill_left_by(suite, runner.name)  # a stopped runner may leave some: they hold the room it yields
            limit = self.ledger.limit()
            self.progress(f"{runner.name}: stopped to hold the run under {limit} sandboxes at once; "
                          f"its {len(only)} case(s) left resume when a runner ends")  # fmt: skip

    def _kill_left_by(self, suite: str, runner: str) -> None:
        """Kill the sandboxes a stopped runner left alive (the harness's own, as at the end of a run)."""
        mine = [sandbox.id for sandbox in self.ledger.left() if (sandbox.suite, sandbox.runner) == (suite, runner)]
        killed = kill_left(self.endpoint.api_url, self.key, mine)
        self.left.update(killed)
        for sandbox_id, what in killed.items():
            if what in KILLED.values():
                self.ledger.observe("DELETE", f"/sandboxes/{sandbox_id}", 204, None)

    def _run_runner(
        self, suite: str, runner: Runner, halt: capacity.Halt, only: list[str] | None = None
    ) -> dict[str, StepResult]:
        steps = load_steps(suite, runner.table(suite))  # type: ignore[arg-type]
        wanted = self.selected.get((suite, runner.name), [])
        planned = task_steps(steps, wanted if only is None else only)
        run_dir = self.lifecycle.run_dir
        assert run_dir is not None
        executable = self.prepared[runner.name]

        failed_once: dict[str, tuple[StepResult, list[dict[str, Any]]]] = {}  # run again before they are recorded

        def deliver(result: StepResult) -> None:
            if halt.yielded and not result.reported and not self.stop.is_set():
                return  # stopped to yield its seat: run again when it has one
            conditions = self.conditions.get((suite, runner.name, result.id), [])
            if wants_rerun(result, conditions, failed_once) and not self.stop.is_set():
                failed_once[result.id] = (result, self.conditions.pop((suite, runner.name, result.id), []))
            elif result.id in wanted:
                self._deliver(suite, runner, result)

        if not isinstance(executable, Path):
            results = {s: StepResult(s, "error", None, executable, {}, False) for s in planned["steps"]}
            for result in results.values():
                deliver(result)
            return results
        factor = task_factor()  # the host may have got busier since the run began
        deadlines = step_deadlines(steps, self.options.step_timeout_s * factor)
        lifetime = {"sandbox_timeout_s": task_lifetime_s(factor, deadlines.values()), "slowness": round(factor, 2)}
        options = {**self._options(runner), **lifetime, **fault_options()}
        table = load_manifest()[suite][runner.table(suite)]
        extra: dict[str, Any] = {}
        if "steps_from" in table:  # E2B's own tests: their source, what this endpoint cannot serve, their domain
            options.update(upstream_options(table, planned["steps"], self.endpoint.provider.embedded))
            extra["env"] = {"E2B_DOMAIN": self.endpoint.domain or "localhost"}
        task = make_task(suite, runner.name, self.run_id, **planned, options=options, **extra)
        wire = run_dir.wire_path(runner.name)
        with WireProxy(
            self.endpoint.api_url,
            self.endpoint.sandbox_url,
            wire,
            runner.name,
            self.redactor,
            domain=self.endpoint.domain,
            ledger=self.ledger,
            suite=suite,
            on_answer=self.answers.add,
            on_write_error=self._write_failed,
            probes=self._differential().on,
        ) as proxy:
            self.proxies[(suite, runner.name)] = (proxy, {})
            endpoint_env = {"E2B_API_KEY": self.key or "", "E2B_API_URL": proxy.url, "E2B_SANDBOX_URL": proxy.url}
            if runner.has_suite(FRAMEWORKS) and self.model is not None and self.model.key_env:
                endpoint_env[self.model.key_env] = self.model.key

            seen: dict[str, Any] = {}  # the wire when the last deadline ran out, before the runner was stopped

            def look() -> None:
                seen.update(last_exchange=last_exchange(wire), in_flight=proxy.in_flight())

            def run_once(task: dict[str, Any], heard: Callable[[Event], None]) -> RunnerResult:
                return run_runner(
                    runner.for_suite(suite),
                    executable,
                    task,
                    step_timeout_s=self.options.step_timeout_s * factor,
                    deadlines=deadlines,
                    env=runner.environment(endpoint_env),
                    on_event=heard,
                    stop=halt,
                    kill_grace_s=KILL_GRACE_S * factor,
                    on_timeout=look,
                )

            results, runs = run_resuming(
                task,
                run_once,
                on_result=deliver,
                on_event=lambda event: self._on_event(suite, runner, event, proxy),
                evidence=lambda: dict(seen),
                on_restart=self.progress,
            )
            if halt.yielded and not self.stop.is_set():  # what it did not finish runs when it has a seat again
                results = {k: v for k, v in results.items() if v.reported and k not in failed_once}
                proxy.take_conditions()
            elif failed_once:
                runs += self._rerun(suite, runner, task, failed_once, run_once, proxy, lambda: dict(seen))
        for run in runs:
            self.created.update((run.footer or {}).get("cleanup") or {})
            if run.start_failure is not None:
                self.start_faults.append(f"runner {runner.name} could not start: {run.start_failure}")
                self.progress(self.start_faults[-1])
        return results

    def _rerun(
        self,
        suite: str,
        runner: Runner,
        task: dict[str, Any],
        failed: dict[str, tuple[StepResult, list[dict[str, Any]]]],
        run_once: Callable[[dict[str, Any], Callable[[Event], None]], RunnerResult],
        proxy: WireProxy,
        evidence: Callable[[], dict[str, Any]],
    ) -> list[RunnerResult]:
        """Steps that failed after a 429/502/503 reached them run once more in a fresh runner, then are recorded
        (bench/remote/rerun.py); the runs it took."""
        shown = ", ".join(f"{step} ({handed_on(c)[0]['status']})" for step, (_, c) in failed.items() if handed_on(c))
        self.progress(f"{runner.name}: running again on a fresh sandbox, after a 429/502/503 answer: {shown}")
        settled, runs = (
            rerun(
                task,
                failed,
                run_once,
                lambda step: self.conditions.pop((suite, runner.name, step), []),
                on_event=lambda event: self._on_event(suite, runner, event, proxy),
                evidence=evidence,
            )
            if not self.stop.is_set()
            else ({}, [])
        )
        for step, (first, conditions) in failed.items():
            if step not in self.selected.get((suite, runner.name), []):
                continue  # a prerequisite held with the steps that need it: no case of its own
            result, conditions, again = settled.get(step, Settled(first, conditions, False))
            if not again:
                self.conditions[(suite, runner.name, step)] = conditions
                self._deliver(suite, runner, result)
                continue
            self.record(suite, runner, step, result)
            if conditions:  # judged again at the end: a route the endpoint never answered otherwise is refused
                self.transient[(suite, runner.name, step)] = (result, conditions)
        return runs

    def _deliver(self, suite: str, runner: Runner, observed: StepResult) -> None:
        """Record a selected step's case as soon as its result is known (once)."""
        if not observed.reported and observed.error == INTERRUPTED and self.stop_reason:
            observed = StepResult(observed.id, "error", None, f"not run: {self.stop_reason}", observed.details, False)
        self.record(suite, runner, observed.id, observed)

    def not_run(self, reason: str) -> int:
        """Record every selected case that has no record yet as `error` `not run: <reason>`; how many."""
        by_name = {r.name: r for r in self.runners}
        missing = [
            (suite, by_name[name], step)
            for (suite, name), steps in self.selected.items()
            for step in steps
            if (suite, name, step) not in self.records
        ]
        for suite, runner, step in missing:
            self.record(suite, runner, step, StepResult(step, "error", None, f"not run: {reason}", {}, False))
        return len(missing)

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
        """A step is told to `on_step` as it is reported, its start (stamped by its runner) and end are noted
        (its wire evidence is what its runner sent between them) and it takes what the endpoint's conditions did
        while it ran (retries, transient answers: a runner runs its steps one after another); a runner's
        transcript goes to `<runner>.json`, with the scripted model's side of it."""
        if event.get("type") == "start" and isinstance(event.get("id"), str):
            began = stamped(event.get("at"))
            if began is not None:
                self.starts[(suite, runner.name, event["id"])] = began
        if event.get("type") == "step" and isinstance(event.get("id"), str):
            self.conditions[(suite, runner.name, event["id"])] = proxy.take_conditions()
            duration = event.get("duration_ms")
            seen = StepSeen(
                event["id"],
                datetime.now(UTC),
                duration if isinstance(duration, int | float) else None,
                self.starts.pop((suite, runner.name, event["id"]), None),
            )
            self.steps_seen.setdefault((suite, runner.name), []).append(seen)
            self.proxies[(suite, runner.name)][1][event["id"]] = time.monotonic()
            if self.on_step is not None:
                self.on_step(suite, runner.name, event)
        run_dir = self.lifecycle.run_dir
        if event.get("type") != "transcript" or run_dir is None:
            return
        transcript = dict(event.get("transcript") or {})
        if self.model is not None and self.model.scripted is not None:
            transcript["model_exchanges"] = self.model.scripted.transcript.exchanges(runner.name)
        self.lifecycle.guarded(lambda: run_dir.write_json(f"{runner.name}.json", transcript))

    def record(self, suite: str, runner: Runner, step: str, observed: StepResult) -> tuple[CaseRecord, str]:
        """The case's record: written to cases.jsonl the first time, the same record after that."""
        with self.recorded:
            if (suite, runner.name, step) not in self.records:
                self.records[(suite, runner.name, step)] = self._judged(suite, runner, step, observed)
                self.observed[(suite, runner.name, step)] = observed
                self.recorded.notify_all()
            return self.records[(suite, runner.name, step)]

    def _judged(self, suite: str, runner: Runner, step: str, observed: StepResult) -> tuple[CaseRecord, str]:
        conditions = self.conditions.pop((suite, runner.name, step), [])
        observed = self._behind_declared(suite, runner.name, step, observed)
        window = lambda: self._window(suite, runner.name, step)  # noqa: E731
        observed = self._differential().judged(suite, runner.name, observed, window)
        record, note = self._judge(suite, runner.name, step, with_conditions(observed, conditions))
        if is_transient(record.details):  # judged again at the end, with every answer of the run
            self.transient[(suite, runner.name, step)] = (observed, conditions)
        run_dir = self.lifecycle.run_dir
        assert run_dir is not None
        try:
            run_dir.record(record)
        except OSError as exc:
            self._write_failed(exc)
        return record, note

    def _behind_declared(self, suite: str, runner: str, step: str, observed: StepResult) -> StepResult:
        """A case that did not run because a case it needs failed as declared (the endpoint's known difference)
        is a conformant skip naming it, unless the case itself is declared: one difference, one verdict. Its
        prerequisite is recorded first (a runner reports prerequisites before the steps needing them)."""
        needed = DEPENDS_ON.match(observed.error or "") if observed.outcome == "error" else None
        if needed is None or self.expectations.for_case(case_id(suite, runner, step)) is not DEFAULT_DECLARATION:
            return observed
        found = self.records.get((suite, runner, needed[1]))
        prerequisite = found[0] if found is not None else None
        behind = prerequisite is not None and prerequisite.details.get("skip_reason") == DECLARED_PREREQUISITE
        if (
            prerequisite is None
            or not prerequisite.conformant
            or (prerequisite.outcome in ("pass", "skip") and not behind)
        ):
            return observed
        whose = (
            f"whose {prerequisite.outcome} is declared" if not behind else "itself kept from running by one declared"
        )
        why = f"skipped: it depends on {needed[1]}, {whose} for this endpoint"
        details = {**observed.details, "skip_reason": DECLARED_PREREQUISITE, "depends_on": needed[1]}
        return StepResult(observed.id, "skip", observed.duration_ms, why, details, observed.reported)

    def _write_failed(self, exc: OSError) -> None:
        """A write of the run's record failed: a full disk stops the run (what is recorded stays valid, the
        rest is not run, exit 3); any other failure is raised as before."""
        if not self.lifecycle.no_room(exc):
            raise exc
        if self.stop_reason is None:
            self.stop_reason = self.lifecycle.fault
            self.progress(f"{self.stop_reason}: stopping the runners")
            self.stop.set()

    def _judge(
        self, suite: str, runner: str, step: str, observed: StepResult, evidence: Any = None
    ) -> tuple[CaseRecord, str]:
        identifier = case_id(suite, runner, step)
        declared = self.expectations.for_case(identifier)
        verdict = judge(observed.outcome, observed.details, observed.error, declared)
        if verdict.outcome != observed.outcome:  # keep what the runner saw before judgement
            observed.details.setdefault("observed_outcome", observed.outcome)
        record = CaseRecord(
            id=identifier,
            suite=suite,
            runner=runner,
            case=step,
            outcome=verdict.outcome,
            expected=verdict.expected,
            conformant=verdict.conformant,
            duration_ms=observed.duration_ms,
            error=observed.error,
            details=observed.details,
            note=verdict.note,
            evidence=None if verdict.conformant else evidence or self._evidence(suite, runner, step),
        )
        return record, verdict.note or ""

    def _refused_routes(self) -> None:
        """Cases judged the endpoint's moment whose kind of request it never answered otherwise in the whole
        run are judged again as conformance failures naming the route (cases.jsonl is amended in place)."""
        amended = []
        for (suite, runner, step), (observed, conditions) in sorted(self.transient.items()):
            again = with_conditions(observed, conditions, self.answers)
            if is_transient(again.details):
                continue
            evidence = self.records[(suite, runner, step)][0].evidence
            self.records[(suite, runner, step)] = self._judge(suite, runner, step, again, evidence)
            amended.append(self.records[(suite, runner, step)][0])
        if amended:
            run_dir = self.lifecycle.run_dir
            assert run_dir is not None
            self.lifecycle.guarded(lambda: run_dir.amend(amended))

    def retries(self) -> dict[str, Any]:
        """How many answers of the endpoint the wire proxies retried, in all and by status."""
        by_status: Counter[int] = Counter()
        for proxy, _ in self.proxies.values():
            by_status.update(proxy.retried)
        return retries_figure(by_status)

    def footer_lines(self) -> list[str]:
        """What the terminal says about the run's cost, its stop and the sandboxes it left."""
        if self.lifecycle.run_dir is None or self._pool is None:
            return []
        lines = [f"cost: {cost_line(self.cost or self.budget.cost(self.ledger.sandbox_seconds()))}"]
        retries = self.retries()
        if retries["total"]:
            shown = ", ".join(f"{count} after {status}" for status, count in retries["by_status"].items())
            lines.append(f"retries: {retries['total']} ({shown})")
        if self.stop_reason:
            lines.append(f"stopped: {self.stop_reason}")
        if self.ledger.capacity is not None:
            limit = self.ledger.capacity
            lines.append(f"capacity: the endpoint refused {self.ledger.capacity_answers} create(s) past {limit} "
                         f"sandboxes at once; pass --max-sandboxes {limit} next time")  # fmt: skip
        # a sandbox the ledger saw alive whose kill found it gone was not left (it ended by a way the wire did not
        # show, e.g. its timeout): the footer keeps it, the terminal does not say it was left
        left = {sandbox: what for sandbox, what in self.left.items() if what != ALREADY_GONE}
        if left:
            shown = ", ".join(f"{sandbox} ({what})" for sandbox, what in left.items())
            lines.append(f"left by this run and killed on the way out: {shown}")
        return lines

    def _evidence(self, suite: str, runner: str, step: str) -> list[dict[str, Any]] | None:
        """The exchanges the runner made while the step ran (None when it never reported the step)."""
        window = self._window(suite, runner, step)
        return None if window is None else bounded(window)

    def _window(self, suite: str, runner: str, step: str) -> list[dict[str, Any]] | None:
        """Every wire log line of the exchanges the runner made while the step ran (None: it never reported it)."""
        seen = self.steps_seen.get((suite, runner), [])
        index = next((i for i, event in enumerate(seen) if event.step == step), None)
        run_dir = self.lifecycle.run_dir
        if index is None or run_dir is None or (suite, runner) not in self.proxies:
            return None
        proxy, read_at = self.proxies[(suite, runner)]
        if step in read_at:  # the step's last exchange may still be on its way to the log
            proxy.wait_logged(read_at[step], scaled(EVIDENCE_WAIT_S))
        return self.wire_logs.window(run_dir.wire_path(runner), suite, Window.of_step(seen, index))

    def _differential(self) -> Differential:
        if self.differential is None:
            assert self.lifecycle.run_dir is not None
            self.differential = Differential(self.lifecycle.run_dir.path)
        return self.differential

    def end(self, status: str, exit_code: int) -> int:
        """Cases not run recorded with the reason, the sandboxes this run left killed, the leak sweep (when
        runners were started), then JUnit, footer (with the cost) and report; returns the exit code. A run whose
        only failures are the endpoint's transient answers, or one some runner could not run at all, says so in
        its exit code (2, 3) rather than as a conformance failure (1)."""
        if status != "completed" and self.not_run(self.stop_reason or "the run was interrupted"):
            exit_code = exit_code if exit_code != ExitCode.OK else ExitCode.NONCONFORMANT
        swept = True
        if self._pool is not None:
            # Every case is recorded once its runner reports it, before the runner kills its own sandboxes: let
            # that clean-up finish (bounded) before anything it has not killed counts as left by this run.
            futures.wait(list(self.jobs.values()), timeout=scaled(RUNNER_END_S))
            self.stop_runners()
            self.left |= kill_left(self.endpoint.api_url, self.key, [sandbox.id for sandbox in self.ledger.left()])
            for sandbox_id, what in self.left.items():
                if what in KILLED.values():
                    self.ledger.observe("DELETE", f"/sandboxes/{sandbox_id}", 204, None)
            swept = self.lifecycle.sweep(self.created | self.ledger.ids()).conformant
            if not swept and exit_code == ExitCode.OK:
                exit_code = ExitCode.NONCONFORMANT
        self._refused_routes()
        failed = [record.details for record, _ in self.records.values() if not record.conformant]
        transient = transient_only(failed) if swept and status == "completed" else None
        if exit_code == ExitCode.NONCONFORMANT and transient is not None:
            self.progress(transient)
            exit_code = ExitCode.USAGE  # the endpoint's moment, kept apart from a conformance failure
        if exit_code == ExitCode.NONCONFORMANT and self.harness_faults:
            exit_code = ExitCode.HARNESS  # some cases could not run here at all: no verdict on the endpoint
        self.cost = self.budget.cost(self.ledger.sandbox_seconds())
        extra: dict[str, Any] = {"cost": self.cost, "left_by_run": self.left, "retries": self.retries()}
        if self.stop_reason:
            extra["stop_reason"] = self.stop_reason
        if self.ledger.capacity is not None:
            ledger = self.ledger
            extra["capacity"] = {
                "limit": ledger.capacity, "answers": ledger.capacity_answers, "message": ledger.capacity_message
            }  # fmt: skip
        self.exit_code = self.lifecycle.finish(status, exit_code, **extra)  # type: ignore[arg-type]
        return self.exit_code


EVIDENCE_WAIT_S = 1.0  # how long a failing case waits for its last exchange to reach the wire log (quiet host)
KILL_GRACE_S = 5.0  # a stopped runner's time to kill its sandboxes on a quiet host (then SIGKILL)
RUNNER_END_S = 30.0  # a runner's time, after its last step, to kill its sandboxes and end on a quiet host
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
