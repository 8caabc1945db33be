"""`e2b-bench bench`: time the unmodified SDKs against an endpoint, next to local baselines of the same run.

Each runner (a pinned SDK environment) gets one task listing its measures (`plan`): time to
interactive (create -> first `commands.run("true")` done) sequential, staggered and in a burst;
`commands.run("true")` on a ready sandbox; an upload and a download of the transfer size, verified by
SHA-256. Sequential time to interactive, `run_true` and the transfers each have a reference twin
(`<kind>_http`, right after it): the same requests sent with the language's plain HTTP client and no
SDK, on sandboxes of its own, so the SDK's median minus its twin's is what the client library adds and
the rest is the endpoint's. Each transfer also has a floor (`<kind>_floor`): the same SDK call against
the harness's own floor server (bench/floor.py), which only discards or serves bytes; where the SDK
cannot reach the disk target even there, the endpoint's target becomes "within FLOOR_RATIO x its floor".
Runners go one after another, so they never compete for the endpoint; every sample they report is kept.
Per measure, the medians of the samples' parts (create, first command, kill; a transfer's first byte)
are its phases: they show whether the control plane or envd takes the time.

Bounds: a count per measure and a wall clock (`max_seconds`, shared between the runners). At the limit
no new operation starts; an operation still going gets `STOP_GRACE_S` more before its runner is
stopped (SIGTERM: it kills its sandboxes). At the end every sandbox tagged with the run id is listed
and killed. Against a non-local endpoint the count must be given: the sandboxes cost money.

Results: a run directory (suite `bench`) with one case per runner x measure (cases.jsonl, junit.xml,
so CI can gate on it) and `bench.json` (bench.schema.json): samples, statistics (bench/stats.py),
the baseline each measure is compared with and the ratio to it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from . import baselines as base
from . import floor, selection
from .benchdoc import (
    BENCH_JSON,
    BENCH_SCHEMA,
    TRANSFER_KINDS,
    comparison_text,
    ms,
    not_measured_text,
    phases_text,
    pool_text,
    read_bench,
    target_text,
)
from .endpoints import Endpoint, EndpointError, resolve
from .exits import ExitCode, defer_interrupts, interrupted_code
from .expectations import Expectations, ExpectationsError, judge
from .lifecycle import Lifecycle
from .paths import RESULTS_DIR
from .remote.slowness import scaled
from .results import CaseRecord, RunDir, case_id, utc_now, validate
from .runners.catalog import Runner
from .runners.envs import RunnerEnvError
from .runners.protocol import Event, make_task, run_runner
from .stats import METHOD, TRIM_FRACTION, Summary, summarize

if TYPE_CHECKING:
    from .localbox.server import LocalServer

__all__ = ["BenchOptions", "comparison_text", "read_bench", "run_bench", "target_text"]

SUITE = "bench"
MODES = ("sequential", "staggered", "burst")
DEFAULT_LOCAL_COUNT = 100
POOL_READY_S = 120.0  # the embedded endpoint's prepared sandboxes are ready before the baselines and the clock
DEFAULT_INTERVAL_MS = 50.0
DEFAULT_MAX_SECONDS = 180.0  # the default run measures everything on 2 cores, its settles between measures too
DEFAULT_TRANSFER_MIB = 20
TRANSFER_COUNT = 10  # at most, each way and client
STOP_GRACE_S = 10.0
BASELINE_COUNT = 30  # each of the two times the baselines are measured: before the runners and after
DRIFT_NOTE = 0.25  # a baseline median that moved this much between the two is noted
BURST_TARGET = (100, 1500.0)  # a burst of 100 all ready within 1.5 s (E2B's own cloud: 1.59 s, #30)
TTI_KINDS = ("tti", "tti_http", "tti_snapshot", "tti_fork", "tti_cell")
CELL_TEMPLATE = "code-interpreter-v1"  # tti.code_interpreter's: its server answers the first cell
CELL_COUNT = 3  # tti.code_interpreter's samples at most: each holds a kernel warm, prepared within the wall clock
PLAIN_HTTP = "the same with a plain HTTP client (no SDK)"
FLOOR = "the same SDK call against a server that only moves bytes (the client's floor)"
FLOOR_RATIO = 1.5  # an endpoint this close to the SDK's floor is as fast as that SDK lets it be
LIMIT_ERRORS = ("not run: the wall-clock limit", "stopped: the wall-clock limit")  # a runner's, at the limit


class BenchError(Exception):
    """The benchmark cannot run as asked; the message says what to do."""


@dataclass(frozen=True)
class Measure:
    """One thing a runner times, and what it is compared with."""

    id: str
    kind: str
    title: str
    baseline: tuple[str, ...]  # summed medians of these baselines
    max_ratio: float | None  # the embedded endpoint's target, as median / baseline
    mode: str | None = None
    languages: tuple[str, ...] = ("python", "js")
    floor: str | None = None  # the measure of the same SDK call against the floor server
    # The embedded endpoint's pool when the measure starts: its usual size, that plus the measure's count ("burst"),
    # its usual size told nothing of the burst, the rest made on demand as a user's endpoint makes them, the pool
    # growing as creates find it empty ("default": measured against the embedded endpoint only), or its count of
    # the code interpreter's kept warm ("warm": as E2B's snapshot of that template has its server running).
    pool: str = "usual"


MEASURES: tuple[Measure, ...] = (
    *(
        Measure(f"tti.{mode}", "tti", f"create -> first commands.run('true') done, {mode}", (base.SPAWN,), 10.0, mode,
                pool="burst" if mode == "burst" else "usual")
        for mode in MODES
    ),
    Measure("tti.burst_on_demand", "tti", "create -> first commands.run('true') done, burst, on the endpoint's usual "
            "pool (nothing prepared for the burst: the rest made on demand)", (base.SPAWN,), None, "burst",
            pool="default"),
    Measure("tti_http.sequential", "tti_http", f"{PLAIN_HTTP}: create + Start", (base.SPAWN,), None, "sequential"),
    Measure("run_true", "run_true", "commands.run('true') on a ready sandbox", (base.SPAWN, base.LOOPBACK), 3.0),
    Measure("run_true_http", "run_true_http", f"{PLAIN_HTTP}: the Start RPC", (base.SPAWN, base.LOOPBACK), None),
    Measure("upload", "upload", "files.write of the transfer size, SHA-256 verified", (base.DISK_COPY,), 2.0,
            floor="upload_floor"),
    Measure("upload_http", "upload_http", f"{PLAIN_HTTP}: POST /files, one multipart part", (base.DISK_COPY,), None),
    Measure("upload_floor", "upload_floor", f"{FLOOR}: files.write", (base.DISK_COPY,), None),
    Measure("download", "download", "files.read of the transfer size, SHA-256 verified", (base.DISK_COPY,), 2.0,
            floor="download_floor"),
    Measure("download_http", "download_http", f"{PLAIN_HTTP}: GET /files, streamed", (base.DISK_COPY,), None),
    Measure("download_floor", "download_floor", f"{FLOOR}: files.read", (base.DISK_COPY,), None),
    *(
        Measure(kind, kind, f"{what} -> first commands.run('true') done", (base.SPAWN,), None, languages=("python",))
        for kind, what in (("tti_snapshot", "create from a snapshot"), ("tti_fork", "fork"))
    ),
    Measure("tti.code_interpreter", "tti_cell", f"create on {CELL_TEMPLATE} -> first cell's result (POST /execute "
            "on port 49999)", (base.SPAWN,), None, "sequential", languages=("python",), pool="warm"),
)  # fmt: skip
BY_ID = {measure.id: measure for measure in MEASURES}


@dataclass(frozen=True)
class BenchOptions:
    endpoint: str = "local"
    runners: tuple[str, ...] = ()
    count: int | None = None
    modes: tuple[str, ...] = MODES
    interval_ms: float = DEFAULT_INTERVAL_MS
    max_seconds: float = DEFAULT_MAX_SECONDS
    results_dir: Path = RESULTS_DIR
    transfer_mib: float = DEFAULT_TRANSFER_MIB
    report: bool = True
    argv: tuple[str, ...] = ()
    gate: bool = False  # a missed target fails its measure (exit 1), for release gating
    pool: int | None = None  # sandboxes the embedded endpoint keeps prepared (None: its default), before the clock

    @property
    def transfer_bytes(self) -> int:
        return int(self.transfer_mib * (1 << 20))


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise BenchError(f"--modes takes a comma-separated list of {', '.join(MODES)}, not {text!r}")
    return modes


def plan(
    options: BenchOptions, runner: Runner, count: int, floor_url: str | None = None, settle_s: float | None = None
) -> list[dict[str, Any]]:
    """The measures of one runner's task, in the order it takes them (the floors only with a floor server). With
    `settle_s` (the embedded endpoint) each first asks the endpoint to settle, within that many seconds: its pool
    as the measure wants it (`Measure.pool`), nothing prepared or torn down."""
    tasks = []
    for measure in MEASURES:
        if runner.language not in measure.languages or (measure.mode and measure.mode not in options.modes):
            continue
        if measure.pool == "default" and settle_s is None:  # another endpoint's burst is tti.burst
            continue
        task: dict[str, Any] = {"id": measure.id, "kind": measure.kind, "count": count}
        if measure.mode:
            task["mode"] = measure.mode
        if measure.mode == "staggered":
            task["interval_ms"] = options.interval_ms
        if measure.kind in TRANSFER_KINDS:
            task.update(count=min(count, TRANSFER_COUNT), bytes=options.transfer_bytes)
        if measure.kind == "tti_cell":
            task.update(count=min(count, CELL_COUNT), template=CELL_TEMPLATE)
        if measure.kind.endswith("_floor"):
            if floor_url is None:
                continue
            task["floor_url"] = floor_url
        elif measure.floor is not None and floor_url is not None:
            task["alternate"] = measure.floor  # sampled in turn with its floor: host noise weighs on both alike
        if settle_s is not None:
            task["settle"] = {"reserve": task["count"] if measure.pool == "burst" else 0, "within_s": settle_s}
            if measure.pool == "warm":
                task["settle"]["warm"] = {CELL_TEMPLATE: task["count"]}
        tasks.append(task)
    return tasks


# --- running -------------------------------------------------------------------------------------


@dataclass
class RunnerOutcome:
    """What one runner reported: samples and measure events by measure id."""

    runner: Runner
    planned: list[dict[str, Any]]
    samples: dict[str, list[Event]] = field(default_factory=dict)
    measures: dict[str, Event] = field(default_factory=dict)
    footer: Event | None = None
    exit_code: int | None = None
    stderr_tail: str = ""
    error: str | None = None
    pins: dict[str, str] = field(default_factory=dict)

    def on_event(self, event: Event) -> None:
        if event["type"] == "sample":
            self.samples.setdefault(str(event.get("measure")), []).append(event)
        elif event["type"] == "measure":
            self.measures[str(event.get("id"))] = event


def select_runners(names: Sequence[str]) -> list[Runner]:
    """The named runners (default: the newest SDK pin of each language that has a benchmark script)."""
    try:
        chosen = selection.select_runners(names)
    except selection.SelectionError as exc:
        raise BenchError(str(exc)) from None
    if not names:
        return [runner for runner in chosen if runner.has_suite(SUITE)]
    missing = [runner.name for runner in chosen if not runner.has_suite(SUITE)]
    if missing:
        raise BenchError(f"runner {missing[0]} has no benchmark entry script (no [{SUITE}.*] table in the manifest)")
    return chosen


def check_count(endpoint: Endpoint, count: int | None) -> int:
    """The count to use: explicit against anything but the embedded endpoint, where sandboxes cost money."""
    if count is None:
        if endpoint.provider.costs_money:
            raise BenchError(
                f"endpoint {endpoint.name!r} ({endpoint.api_url}) is not the embedded one: give the number of "
                "samples per measure with -n N, since every sample creates a sandbox billed to that account"
            )
        return DEFAULT_LOCAL_COUNT
    if count < 1:
        raise BenchError(f"-n must be at least 1, not {count}")
    return count


def run_bench(options: BenchOptions, out: TextIO = sys.stdout, server: LocalServer | None = None) -> int:
    """Run the benchmark as the CLI does; returns the exit code. `server`: an embedded server to measure."""
    try:
        endpoint = resolve(options.endpoint) if server is None else resolve("local")
        count = check_count(endpoint, options.count)
        runners = select_runners(options.runners)
        expectations = Expectations.load(endpoint.expectations)
        if options.max_seconds <= 0 or options.interval_ms < 0 or options.transfer_bytes < 1:
            raise BenchError("--max-seconds and the transfer size must be positive, --interval-ms not negative")
        if options.pool is not None and not endpoint.provider.embedded:
            raise BenchError(f"--pool sizes the embedded endpoint's pool, and {endpoint.name!r} is another endpoint")
    except (BenchError, EndpointError, ExpectationsError) as exc:
        print(f"e2b-bench bench: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    argv = list(options.argv) or sys.argv
    if server is None and options.pool is not None and endpoint.provider.embedded:
        from .localbox.server import LocalServer

        server = LocalServer(pool_size=options.pool)
    with Lifecycle(endpoint, results_dir=options.results_dir, server=server, report=options.report, argv=argv) as life:
        life.serve()
        if not life.preflight():
            print(f"e2b-bench bench: {life.preflight_error}", file=sys.stderr)
            return life.abort(life.preflight_error or "", SUITE)
        return Benchmark(options, life, runners, count, expectations, out).run()


class Benchmark:
    """One benchmark run against a reachable endpoint, inside its lifecycle."""

    def __init__(
        self,
        options: BenchOptions,
        lifecycle: Lifecycle,
        runners: list[Runner],
        count: int,
        expectations: Expectations,
        out: TextIO,
    ) -> None:
        self.options, self.lifecycle, self.runners = options, lifecycle, runners
        self.endpoint, self.key, self.redactor = lifecycle.endpoint, lifecycle.key, lifecycle.redactor
        self.count, self.expectations, self.out = count, expectations, out
        self.stop = threading.Event()
        self.outcomes: list[RunnerOutcome] = []
        self.baselines: dict[str, list[float]] = {}
        self.baselines_after: dict[str, list[float]] = {}
        self.notes: list[str] = []

    def run(self) -> int:
        with floor.started(self.options.transfer_bytes) as floor_server:  # its start overlaps the preparations
            return self._run(floor_server)

    def _run(self, floor_server: floor.FloorProcess) -> int:
        executables = {}
        for runner in self.runners:
            try:
                executables[runner.name] = runner.prepare()
            except RunnerEnvError as exc:
                print(f"e2b-bench bench: runner environment {runner.name} could not be built: {exc}", file=sys.stderr)
                return ExitCode.USAGE
        pins = {r.name: r.resolved_versions(executables[r.name]) for r in self.runners}
        self._build_cell_template()
        header = {}
        if (server := self.lifecycle.server) is not None:
            from .localbox.registry import POOL_MAX

            size = server.registry.config.pool_size
            burst = min(self.count, POOL_MAX - size) if "burst" in self.options.modes else 0
            header["pool"] = {"size": size, "burst": burst}
        run_dir = self.lifecycle.open(SUITE, pins, **header)
        run_id = run_dir.path.name
        status, exit_code = "completed", ExitCode.OK
        # The wall clock covers the SDK measurements; the baselines are bounded by their own count.
        started = deadline = time.monotonic()
        timer = threading.Timer(self.options.max_seconds + STOP_GRACE_S, self.stop.set)
        timer.daemon = True
        try:
            floor_url = floor_server.url  # up before the baselines and the wall clock: its start is timed by neither
            limit = scaled(POOL_READY_S)
            if self.lifecycle.server is not None and not self.lifecycle.server.wait_prepared(limit):
                self.notes.append(f"the embedded endpoint's pool was not full after {limit:.0f}s: measured as it was")
            self.baselines = base.measure_in_subprocess(min(self.count, BASELINE_COUNT), self.options.transfer_bytes)
            started = time.monotonic()
            deadline = started + self.options.max_seconds
            timer.start()
            for index, runner in enumerate(self.runners):
                share = (deadline - time.monotonic()) / (len(self.runners) - index)
                self.outcomes.append(self._run_one(runner, executables[runner.name], run_id, share, floor_url))
            if not self.stop.is_set():  # measured again after: a machine that drifted meanwhile shows
                after = base.measure_in_subprocess(min(self.count, BASELINE_COUNT), self.options.transfer_bytes)
                self.baselines_after = after
        except KeyboardInterrupt:
            self.stop.set()
            status, exit_code = "interrupted", interrupted_code()
        except (base.BaselineError, floor.FloorError) as exc:
            self.notes.append(str(exc))
            status, exit_code = "aborted", ExitCode.NONCONFORMANT
        finally:
            timer.cancel()
        defer_interrupts()  # from here on the results are written; a signal now lets them finish
        elapsed = time.monotonic() - started
        if elapsed > self.options.max_seconds or any(
            e.get("stopped") for o in self.outcomes for e in o.measures.values()
        ):
            self.notes.append(f"stopped at the wall-clock limit of {self.options.max_seconds:g}s")
        records = self._record(run_dir, elapsed)
        if exit_code == ExitCode.OK and not all(record.conformant for record in records):
            exit_code = ExitCode.NONCONFORMANT
        code = self.lifecycle.finish(status, exit_code)  # type: ignore[arg-type]
        print_table(json.loads((run_dir.path / BENCH_JSON).read_text("utf-8")), self.out, gate=self.options.gate)
        print(f"run directory: {run_dir.path}", file=self.out)
        if self.lifecycle.report_paths is not None:
            print(f"report: {self.lifecycle.report_paths.html}", file=self.out)
        return code

    def _build_cell_template(self) -> None:
        """The embedded endpoint's code-interpreter template, built before the clock when tti.code_interpreter is
        planned (minutes when cold, once: it is cached); a build that fails is noted and the measure's creates say
        why."""
        planned = "sequential" in self.options.modes and any(r.language == "python" for r in self.runners)
        if self.lifecycle.server is None or not planned:
            return
        from .localbox.template import TemplateError, ensure_template, template_built

        if template_built(CELL_TEMPLATE):
            return
        print(f"e2b-bench bench: building the embedded endpoint's template {CELL_TEMPLATE}, cached for later runs",
              file=sys.stderr)  # fmt: skip
        try:
            ensure_template(name=CELL_TEMPLATE)
        except TemplateError as exc:
            self.notes.append(f"template {CELL_TEMPLATE} could not be built: {exc}")

    def _run_one(self, runner: Runner, executable: Path, run_id: str, share_s: float, floor_url: str) -> RunnerOutcome:
        settle_s = None
        if self.lifecycle.server is not None:
            from .localbox.registry import SETTLE_MAX_S  # loaded with the embedded endpoint already

            settle_s = min(scaled(POOL_READY_S), SETTLE_MAX_S)  # more is refused (400): a host read as 5x slow asks it
        tasks = plan(self.options, runner, self.count, floor_url, settle_s)
        outcome = RunnerOutcome(runner=runner, planned=tasks)
        if self.stop.is_set():
            outcome.error = "not run: the wall-clock limit was reached"
            return outcome
        task = make_task(
            SUITE,
            runner.name,
            run_id,
            deadline_s=max(share_s, 0.0),
            sandbox_timeout_s=int(self.options.max_seconds + 2 * STOP_GRACE_S + 60),
            measures=tasks,
        )
        env = runner.environment({"E2B_API_KEY": self.key or "", **self.endpoint.sdk_env()})
        result = run_runner(
            runner.for_suite(SUITE),
            executable,
            task,
            step_timeout_s=max(share_s, 0.0) + STOP_GRACE_S + 60,
            env=env,
            on_event=outcome.on_event,
            stop=self.stop,
        )
        if self.lifecycle.server is not None:  # what tti.code_interpreter kept warm competes with no later measure
            self.lifecycle.server.keep_warm({CELL_TEMPLATE: 0})
        outcome.footer, outcome.exit_code, outcome.stderr_tail = result.footer, result.exit_code, result.stderr_tail
        outcome.pins = dict((result.hello or {}).get("pins") or {})
        if result.stopped:
            outcome.error = "stopped: the wall-clock limit was reached while an operation was still going"
        elif result.timed_out:
            outcome.error = "runner went silent for too long and was stopped"
        elif result.footer is None:
            outcome.error = f"runner died: exit code {result.exit_code}; stderr tail: {result.stderr_tail[-500:]}"
        return outcome

    # --- results ---------------------------------------------------------------------------------
    def _document(self, elapsed: float) -> dict[str, Any]:
        """bench.json without its `cleanup` (the leak sweep comes after the measures are recorded)."""
        baseline_docs: dict[str, dict[str, Any]] = {}
        for name, before in self.baselines.items():
            after = self.baselines_after.get(name, [])
            median_before, median_after = summarize(before).median_ms, summarize(after).median_ms
            baseline_docs[name] = {
                "title": base.TITLES[name],
                "samples": [round(v, 4) for v in before + after],
                "stats": summarize(before + after).to_dict(),
                "median_before_ms": median_before,
                "median_after_ms": median_after,
            }
            drift = _drift(baseline_docs[name])
            if drift is not None and abs(drift) >= DRIFT_NOTE:
                self.notes.append(
                    f"the machine drifted during the run: {name} median {ms(median_before)} ms before the runners,"
                    f" {ms(median_after)} ms after; ratios use both"
                )
        runners = {}
        for outcome in self.outcomes:
            measures = {t["id"]: self._measure_doc(outcome, t) for t in outcome.planned}
            for measure_id, doc in measures.items():
                floor_id = BY_ID[measure_id].floor
                if floor_id is not None and floor_id in measures and doc["target"] is not None:
                    doc["target"] = _floor_target(doc, measures[floor_id], floor_id)
            runners[outcome.runner.name] = {
                "language": outcome.runner.language,
                "pins": outcome.pins or dict(outcome.runner.pins),
                "completed": outcome.footer is not None and outcome.error is None,
                "error": outcome.error,
                "exit_code": outcome.exit_code,
                "stderr_tail": outcome.stderr_tail[-2000:] or None,
                "measures": measures,
            }
        assert self.lifecycle.run_dir is not None
        run_json = self.lifecycle.run_dir.path / RunDir.RUN_JSON
        header = json.loads(run_json.read_text("utf-8"))["header"]
        return {
            "schema": BENCH_SCHEMA,
            "header": header,
            "settings": {
                "count": self.count,
                "modes": list(self.options.modes),
                "interval_ms": self.options.interval_ms,
                "max_seconds": self.options.max_seconds,
                "transfer_bytes": self.options.transfer_bytes,
                "trim_fraction": TRIM_FRACTION,
                "stats_method": METHOD,
                "targets": self.endpoint.provider.has_targets,
            },
            "baselines": baseline_docs,
            "runners": runners,
            "elapsed_s": round(elapsed, 3),
            "notes": self.notes,
            "finished_at": utc_now(),
        }

    def _measure_doc(self, outcome: RunnerOutcome, task: Mapping[str, Any]) -> dict[str, Any]:
        measure = BY_ID[task["id"]]
        event = outcome.measures.get(measure.id, {})
        samples = sorted(outcome.samples.get(measure.id, []), key=lambda s: s.get("index", 0))
        kept = [
            {k: sample.get(k) for k in ("index", "ok", "ms", "start_ms", "error", "parts") if k in sample}
            for sample in samples
        ]
        parts: dict[str, list[float]] = {}
        for sample in samples:
            if sample.get("ok"):
                for name, value in (sample.get("parts") or {}).items():
                    if isinstance(value, int | float):
                        parts.setdefault(name, []).append(float(value))
        ok = [float(s["ms"]) for s in samples if s.get("ok") and isinstance(s.get("ms"), int | float)]
        attempted = max(int(event.get("attempted", len(samples))), len(samples))
        stats = summarize(ok, attempted)
        cut = bool(event.get("stopped")) or (
            attempted < int(task["count"]) and (outcome.error or "").startswith(LIMIT_ERRORS)
        )
        doc: dict[str, Any] = {
            "title": measure.title,
            "kind": measure.kind,
            "mode": measure.mode,
            "planned": int(task["count"]),
            "attempted": attempted,
            "client": event.get("client"),
            "warmup": event.get("warmup", 0),
            "alternated_with": event.get("alternated_with"),
            "stopped": event.get("stopped"),
            "error": event.get("error") or (outcome.error if not event else None),
            "bytes": task.get("bytes"),
            "interval_ms": task.get("interval_ms"),
            "samples": kept,
            "stats": stats.to_dict(),
            "wall_ms": event.get("wall_ms"),
            "all_ready_ms": None,
            "rate_mb_s": None,
            "phases": {name: summarize(values).median_ms for name, values in parts.items()},
            "limit_s": self.options.max_seconds if cut else None,
            "settle": event.get("settle"),
            "served": event.get("served"),
        }
        settle = doc["settle"]
        if settle is not None and not settle["settled"]:
            why = settle.get("error") or f"still preparing or tearing down after {settle['waited_ms'] / 1000:.1f}s"
            where = f"{outcome.runner.name} {measure.id}"
            self.notes.append(f"the embedded endpoint was not settled before {where} ({why}): measured as it was")
        if measure.kind in TTI_KINDS and ok:
            doc["all_ready_ms"] = round(max(float(s["start_ms"]) + float(s["ms"]) for s in samples if s.get("ok")), 3)
        if task.get("bytes") and stats.median_ms:
            doc["rate_mb_s"] = round(int(task["bytes"]) / (stats.median_ms / 1000) / 1e6, 1)
        doc.update(self._comparison(measure, stats, doc))
        return doc

    def _comparison(self, measure: Measure, stats: Summary, doc: Mapping[str, Any]) -> dict[str, Any]:
        medians = [
            summarize(self.baselines.get(name, []) + self.baselines_after.get(name, [])).median_ms
            for name in measure.baseline
        ]
        baseline_ms = sum(m for m in medians if m is not None) if None not in medians else None
        ratio = stats.median_ms / baseline_ms if stats.median_ms is not None and baseline_ms else None
        target: dict[str, Any] | None = None
        if self.endpoint.provider.has_targets and measure.max_ratio is not None:
            target = {
                "text": f"median <= {measure.max_ratio:g}x {' + '.join(measure.baseline)}",
                "max_ratio": measure.max_ratio,
                "met": ratio is not None and ratio <= measure.max_ratio,
            }
            count, limit_ms = BURST_TARGET
            if measure.mode == "burst" and doc["planned"] < count:
                target = None  # the target is set for a burst of `count`: a smaller one is reported, not judged
            elif measure.mode == "burst":
                all_ready = doc["all_ready_ms"]
                burst_met = all_ready is not None and all_ready <= limit_ms and stats.ok == doc["planned"]
                # A burst is judged by when all of it is ready: each sample waits for the others by design.
                target = {
                    "text": f"a burst of {count} all ready <= {limit_ms / 1000:g}s",
                    "max_all_ready_ms": limit_ms,
                    "met": bool(burst_met),
                }
            if target is not None and doc["limit_s"] is not None:
                target["met"] = None  # not measured: judging what the limit left would report a miss that is not one
        return {
            "baseline": {"of": list(measure.baseline), "median_ms": baseline_ms},
            "ratio": round(ratio, 3) if ratio is not None else None,
            "target": target,
        }

    def _record(self, run_dir: RunDir, elapsed: float) -> list[CaseRecord]:
        """One case per runner x measure, then the leak sweep; writes bench.json."""
        document = self._document(elapsed)
        records = []
        for runner, entry in document["runners"].items():
            for measure_id, doc in entry["measures"].items():
                outcome, error = _verdict(doc, gate=self.options.gate)
                identifier = case_id(SUITE, runner, measure_id)
                details = {k: doc[k] for k in ("stats", "baseline", "ratio", "target", "stopped", "planned")}
                verdict = judge(outcome, details, error, self.expectations.for_case(identifier))  # type: ignore[arg-type]
                if outcome == "skip":  # cut by the wall-clock limit the user chose: as asked, not a failure
                    verdict = dataclasses.replace(verdict, expected="skip", conformant=True, note="--max-seconds")
                records.append(
                    CaseRecord(
                        id=identifier,
                        suite=SUITE,
                        runner=runner,
                        case=measure_id,
                        outcome=verdict.outcome,
                        expected=verdict.expected,
                        conformant=verdict.conformant,
                        duration_ms=doc["wall_ms"],
                        error=error,
                        details=details,
                        note=verdict.note,
                    )
                )
        for record in records:
            run_dir.record(record)
        leak = self.lifecycle.sweep()
        survivors = list(leak.details["survivors"])
        document["cleanup"] = {"survivors": survivors, "error": None if survivors else leak.error}
        validate("bench", self.redactor.redact_obj(document), where=str(run_dir.path / BENCH_JSON))
        run_dir.write_json(BENCH_JSON, document)
        return [*records, leak]


def _floor_target(doc: Mapping[str, Any], floor_doc: Mapping[str, Any], floor_id: str) -> dict[str, Any]:
    """The target of a transfer, given its floor: the disk target where the SDK can reach it against the
    floor server, else within FLOOR_RATIO x the floor (the client library, not the endpoint, is the limit)."""
    target = dict(doc["target"])
    floor_ms, median_ms = floor_doc["stats"]["median_ms"], doc["stats"]["median_ms"]
    if floor_doc["ratio"] is None or floor_doc["ratio"] <= target["max_ratio"] or not floor_ms:
        return target
    return {
        "text": f"median <= {FLOOR_RATIO:g}x {floor_id} (the SDK's floor misses {target['text']})",
        "max_floor_ratio": FLOOR_RATIO,
        "met": None
        if doc.get("limit_s") is not None
        else median_ms is not None and median_ms <= FLOOR_RATIO * floor_ms,
    }


def _verdict(doc: Mapping[str, Any], gate: bool = False) -> tuple[str, str | None]:
    """A measure as a case: pass when every attempted sample succeeded (and, with `gate`, its target held).
    One the wall-clock limit cut is a skip with the samples it has, and with `gate` (its target not judged) a
    failure for that reason."""
    stats = doc["stats"]
    failed = stats["attempted"] - stats["ok"]
    if doc["limit_s"] is not None and not failed:
        reason = f"{not_measured_text(doc)}: {stats['ok']} of {doc['planned']} samples"
        return ("fail" if gate and doc.get("target") is not None else "skip"), reason
    if doc["attempted"] == 0:
        return "error", doc["error"] or "no sample was reported"
    if failed or doc["error"]:
        errors = sorted({s["error"] for s in doc["samples"] if s.get("error")})
        reason = f"{failed} of {stats['attempted']} samples failed" + (f": {errors[0]}" if errors else "")
        return "fail", doc["error"] or reason
    target = doc.get("target")
    if gate and target is not None and not target["met"]:
        measured = f"median {doc['ratio']}x" if doc.get("ratio") is not None else "not measured"
        return "fail", f"missed its target: {target['text']} ({measured})"
    return "pass", None


# --- printing -------------------------------------------------------------------------------------------


def _drift(baseline: Mapping[str, Any]) -> float | None:
    """How much a baseline's median moved between before and after the runners, as a fraction."""
    before, after = baseline.get("median_before_ms"), baseline.get("median_after_ms")
    return (after - before) / before if before and after is not None else None


def print_table(document: Mapping[str, Any], out: TextIO, gate: bool = False) -> None:
    print(f"e2b-bench bench · endpoint {document['header']['endpoint']['name']} · "
          f"{document['header']['run_id']}", file=out)  # fmt: skip
    print("baselines: " + " · ".join(
        f"{name} p50 {ms(b['stats']['median_ms'])} ms" + (
            f" ({ms(b['median_before_ms'])} before, {ms(b['median_after_ms'])} after)"
            if b.get("median_after_ms") is not None else ""
        ) for name, b in document["baselines"].items()
    ), file=out)  # fmt: skip
    if pool := pool_text(document["header"]):
        print(f"pool: {pool}", file=out)
    columns = f"{'runner':16} {'measure':20} {'ok':>9} {'p50':>8} {'p95':>8} {'p99':>8} {'min':>8} {'max':>8}"
    print(f"{columns}  vs baseline / target (ms)", file=out)
    for runner, entry in document["runners"].items():
        for measure_id, doc in entry["measures"].items():
            s = doc["stats"]
            extra = f" all ready {ms(doc['all_ready_ms'])}" if doc["mode"] == "burst" and doc["all_ready_ms"] else ""
            print(
                f"{runner:16} {measure_id:20} {s['ok']:>4}/{s['attempted']:<4} "
                + " ".join(f"{ms(s[k]):>8}" for k in ("median_ms", "p95_ms", "p99_ms", "min_ms", "max_ms"))
                + f"  {comparison_text(doc)}{extra}  {target_text(doc)}".rstrip(),
                file=out,
            )
            if phases := phases_text(doc):
                print(f"{'':16} {'':20} p50 {phases}", file=out)
        if entry["error"]:
            print(f"{runner:16} {entry['error']}", file=out)
    for note in document["notes"]:
        print(f"note: {note}", file=out)
    missed = [doc for entry in document["runners"].values() for doc in entry["measures"].values()
              if doc["target"] is not None and doc["target"]["met"] is False]  # fmt: skip
    if missed and not gate:
        print(f"targets missed (not gated): {len(missed)}; `bench --gate` fails on a missed target", file=out)
    cleanup = document["cleanup"]
    if cleanup["survivors"] or cleanup["error"]:
        print(f"clean-up: killed {len(cleanup['survivors'])} surviving sandbox(es) {cleanup['error'] or ''}", file=out)
