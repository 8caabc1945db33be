"""`e2b-bench load`: simulated agents on Locust against an endpoint; `load.json`, cases and a report.

The harness never imports Locust (it patches its process with gevent): Locust runs `bench/loadusers.py`
in processes of its own, a single one or a master with workers (`--master`, `--worker`,
`--expect-workers`, passed through; `--local-workers N` starts N workers on loopback). Against the
embedded endpoint this process serves it. The run has two phases: an idle one (one user running
`commands.run("true")` back to back) and the load. Then the run's tagged sandboxes still alive are the
leaks (killed), and in soak mode the endpoint's sandbox count must be back where it started.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .endpoints import Endpoint, EndpointError, PreflightError, preflight, resolve
from .exits import ExitCode, defer_interrupts, interrupted_code
from .housekeeping import RUN_METADATA_KEY, Sweep, leak_record, sweep
from .junit import write_junit
from .loadcli import LOCAL_DURATION_S, LOCAL_USERS, SOAK_DURATION_S, SOAK_RATE, SOAK_USERS
from .loadview import LOAD_JSON
from .redaction import Redactor
from .results import CaseRecord, RunDir, case_id, make_header, utc_now, validate
from .soak.census import Holdings, settled, started_from
from .soak.census import count as count_holdings
from .soak.memory import MIN_JUDGED_S, MemorySampler, in_cgroup_under, sample_interval
from .soak.memory import judge as judge_memory
from .soak.memory import timeline as memory_timeline
from .soak.pace import pace_figures, pace_line, retries_line, retry_figures
from .stats import summarize

REPO_ROOT = Path(__file__).resolve().parents[1]
USERS_FILE = Path(__file__).resolve().parent / "loadusers.py"
LOCUST_MAIN = "bench.loadmain"  # Locust with its own patching, except threads (see there)
LOAD_PINS = ("locust", "gevent")  # the load engine, recorded in the header
SCHEMA = "e2b-bench/load/1"
TIMELINE_POINTS = 60  # at most this many buckets in the timeline
LOG_TAIL = 2000
EXIT_GRACE_S = 30.0  # Locust sometimes lingers after quitting (seen with 40+ users): its results are final by then
RUN_TRUE = "run_true"


class LoadError(Exception):
    """Options that cannot make a load run."""


@dataclass(frozen=True)
class LoadOptions:
    endpoint: str = "local"
    users: int | None = None
    spawn_rate: float | None = None
    duration_s: float | None = None
    soak: bool = False
    rate: float | None = None  # soak: sessions per second of all users together
    idle_s: float = 5.0
    pause_share: float = 0.2
    file_kib: int = 64
    stop_timeout_s: float = 60.0
    master: bool = False
    worker: bool = False
    expect_workers: int = 0
    local_workers: int = 0
    master_host: str = "127.0.0.1"
    master_port: int = 5557
    master_bind_host: str = "127.0.0.1"
    master_bind_port: int = 0  # 0: a free port
    profile: str = "e2b"
    quirks: tuple[str, ...] = ()
    results_dir: Path = REPO_ROOT / "results"
    report: bool = True
    argv: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        return "soak" if self.soak else "load"

    @property
    def workers(self) -> int:
        return self.local_workers or self.expect_workers


def cmd_load(args: argparse.Namespace, extra: list[str]) -> int:
    options = LoadOptions(
        endpoint=args.endpoint,
        users=args.users,
        spawn_rate=args.spawn_rate,
        duration_s=args.duration,
        soak=args.soak,
        rate=args.rate,
        idle_s=args.idle_seconds,
        pause_share=args.pause_share,
        file_kib=args.file_kib,
        stop_timeout_s=args.stop_timeout,
        master=args.master or args.local_workers > 0,
        worker=args.worker,
        expect_workers=args.expect_workers,
        local_workers=args.local_workers,
        master_host=args.master_host,
        master_port=args.master_port,
        master_bind_host=args.master_bind_host,
        master_bind_port=args.master_bind_port,
        profile=args.profile,
        quirks=tuple(args.quirk),
        results_dir=args.results_dir,
        report=not args.no_report,
        argv=tuple(sys.argv),
    )
    return run_load(options)


def check_options(options: LoadOptions, endpoint: Endpoint) -> LoadOptions:
    """The options with their local defaults; `LoadError` for what cannot run."""
    if options.worker:
        if options.master:
            raise LoadError("--worker and --master exclude each other")
        return options
    provider = endpoint.provider
    if provider.costs_money and (options.users is None or options.duration_s is None):
        raise LoadError(
            f"endpoint {endpoint.name!r} ({endpoint.api_url}) is not the embedded one: give --users and --duration, "
            "since every session creates a sandbox billed to that account"
        )
    if not provider.quirks and (options.profile != "e2b" or options.quirks):
        raise LoadError(
            "--profile and --quirk switch the embedded endpoint's behaviour: use them with --endpoint local"
        )
    users = options.users if options.users is not None else SOAK_USERS if options.soak else LOCAL_USERS
    duration = options.duration_s
    if duration is None:
        duration = SOAK_DURATION_S if options.soak else LOCAL_DURATION_S
    if users < 1 or duration <= 0 or options.idle_s < 0 or options.stop_timeout_s < 0:
        raise LoadError("--users and --duration must be positive, --idle-seconds and --stop-timeout not negative")
    rate = options.rate if options.rate is not None else SOAK_RATE if options.soak else None
    if options.soak and not (rate and rate > 0):
        raise LoadError("--rate is agent sessions per second, for all users together: more than 0")
    if options.master and options.workers < 1:
        raise LoadError("--master needs --expect-workers N (workers started elsewhere) or --local-workers N")
    if not 0 <= options.pause_share <= 1 or options.file_kib < 1:
        raise LoadError("--pause-share is between 0 and 1, --file-kib at least 1")
    from dataclasses import replace

    # A soak's users start at its session rate: their sessions are then spread evenly, not in waves.
    spawn_rate = options.spawn_rate if options.spawn_rate is not None else rate if options.soak else float(users)
    return replace(options, users=users, duration_s=duration, spawn_rate=spawn_rate, rate=rate)


# --- Locust processes ----------------------------------------------------------------------------


@dataclass
class Phase:
    """One Locust run: what the master (or single process) gathered, and how the processes ended."""

    name: str
    raw: dict[str, Any] | None
    exit_code: int | None
    log_tail: str
    started: float
    wall_s: float


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _locust(*args: str) -> list[str]:
    return [sys.executable, "-m", LOCUST_MAIN, "-f", str(USERS_FILE), "--headless", "--loglevel", "WARNING", *args]


def _agent_args(options: LoadOptions, run_id: str) -> list[str]:
    per_user = (options.rate or 0) / (options.users or 1) if options.soak else 0
    return [
        *("--e2b-run-id", run_id),
        *("--e2b-rate", f"{per_user:g}"),
        *("--e2b-pause-share", f"{options.pause_share:g}"),
        *("--e2b-file-kib", str(options.file_kib)),
        *("--e2b-sandbox-timeout", str(int((options.duration_s or 0) + options.stop_timeout_s + 120))),
    ]


def run_phase(
    name: str, user_class: str, users: int, duration_s: float, options: LoadOptions, env: Mapping[str, str], run_id: str
) -> Phase:
    """Run Locust (a master and its local workers when asked) for `duration_s` and read what it gathered."""
    scratch = Path(tempfile.mkdtemp(prefix="e2b-bench-load-"))
    out = scratch / "gathered.json"
    distributed = name == "load" and options.master
    common = ["--stop-timeout", f"{options.stop_timeout_s:g}", *_agent_args(options, run_id)]
    spawn_rate = options.spawn_rate if name == "load" else float(users)
    argv = _locust(
        *("-u", str(users), "-r", f"{spawn_rate:g}", "--only-summary"),
        *("--e2b-out", str(out), "--e2b-duration", f"{duration_s:g}"),
        *common,
    )
    port = options.master_bind_port or _free_port()
    if distributed:
        argv += ["--master", "--expect-workers", str(options.workers), "--master-bind-host", options.master_bind_host]
        argv += ["--master-bind-port", str(port), "--expect-workers-max-wait", "60"]
    argv.append(user_class)
    logs = [scratch / "master.log", *(scratch / f"worker-{i}.log" for i in range(options.local_workers))]
    processes: list[subprocess.Popen[bytes]] = []
    started = time.time()
    clock = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(path.open("wb")) for path in logs]
            processes.append(_spawn(argv, env, handles[0]))
            if distributed:
                worker = _locust("--worker", "--master-host", "127.0.0.1", "--master-port", str(port), user_class)
                processes += [_spawn(worker, env, handle) for handle in handles[1:]]
            codes = [_wait(process, duration_s + options.stop_timeout_s + 120, out) for process in processes]
        raw = json.loads(out.read_text("utf-8")) if out.exists() else None
        tail = "\n".join(path.read_text("utf-8", errors="replace")[-LOG_TAIL:] for path in logs).strip()
        return Phase(name, raw, codes[0], tail[-LOG_TAIL * 2 :], started, time.monotonic() - clock)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def _spawn(argv: list[str], env: Mapping[str, str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def _wait(process: subprocess.Popen[bytes], timeout_s: float, gathered: Path) -> int | None:
    """The exit code, or None when it had to be stopped: past `timeout_s`, or `EXIT_GRACE_S` after the master
    wrote what it gathered (every user had stopped by then). SIGTERM first: Locust's users kill their sandboxes."""
    deadline = time.monotonic() + timeout_s
    written_at: float | None = None
    while True:
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if written_at is None and gathered.exists():
                written_at = now
            if now > deadline or (written_at is not None and now - written_at > EXIT_GRACE_S):
                break
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return None


# --- figures -------------------------------------------------------------------------------------


def operation_figures(samples: Sequence[Sequence[Any]], wall_s: float) -> dict[str, dict[str, Any]]:
    """Per operation: requests, failures, rate, and latency statistics of its successful samples."""
    by_name: dict[str, list[Sequence[Any]]] = defaultdict(list)
    for sample in samples:
        by_name[str(sample[0])].append(sample)
    figures = {}
    for name, rows in sorted(by_name.items()):
        ok = [float(row[2]) for row in rows if row[3]]
        stats = summarize(ok, attempted=len(rows))
        figures[name] = {
            "requests": len(rows),
            "failures": len(rows) - len(ok),
            "rps": round(len(rows) / wall_s, 3) if wall_s > 0 else None,
            "p50_ms": stats.median_ms,
            "p95_ms": stats.p95_ms,
            "p99_ms": stats.p99_ms,
            "max_ms": stats.max_ms,
        }
    return figures


def timeline(samples: Sequence[Sequence[Any]], users: Sequence[Sequence[float]], start: float, end: float) -> dict:
    """RPS, failures, users and per-operation p95 in equal time buckets from `start` to `end`."""
    span = max(end - start, 1e-3)
    width = max(1.0, round(span / TIMELINE_POINTS))
    count = max(1, int(span // width) + (span % width > 1e-9))
    buckets: list[dict[str, Any]] = [
        {"t": round(i * width, 3), "requests": 0, "failures": 0, "users": 0, "latencies": defaultdict(list)}
        for i in range(count)
    ]
    for name, at, ms, ok in samples:
        bucket = buckets[min(max(int((float(at) - start) // width), 0), count - 1)]
        bucket["requests"] += 1
        if ok:
            bucket["latencies"][str(name)].append(float(ms))
        else:
            bucket["failures"] += 1
    for at, count_users in users:
        index = int((float(at) - start) // width)
        if 0 <= index < count:
            buckets[index]["users"] = max(buckets[index]["users"], int(count_users))
    points = []
    for bucket in buckets:
        latencies = bucket.pop("latencies")
        bucket["rps"] = round(bucket["requests"] / width, 3)
        bucket["p95_ms"] = {name: summarize(values).p95_ms for name, values in sorted(latencies.items())}
        points.append(bucket)
    return {"bucket_s": width, "points": points}


def count_sandboxes(endpoint: Endpoint, key: str | None) -> int:
    """Every sandbox of the endpoint (running and paused), through the SDK's own paginated list."""
    from e2b import Sandbox

    options: dict[str, Any] = {"api_key": key, "api_url": endpoint.api_url}
    if endpoint.domain:
        options["domain"] = endpoint.domain
    paginator = Sandbox.list(**options)
    total = 0
    while paginator.has_next:
        total += len(paginator.next_items())
    return total


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """The embedded endpoint as this process serves it: where its holdings on the host are found."""

    state_dir: Path
    idle: Callable[[], bool]  # nothing made or released in the background


@contextlib.contextmanager
def _bound(endpoint: Endpoint, options: LoadOptions) -> Iterator[tuple[Endpoint, str | None, Served | None]]:
    """The endpoint with its URLs and key; the embedded one is served (with its quirks) for the duration,
    in this process."""
    if not endpoint.provider.embedded:
        yield endpoint, endpoint.api_key(), None
        return
    from .localbox.quirks import build
    from .localbox.server import LocalServer, in_thread

    server = LocalServer(quirks=build(options.profile, list(options.quirks)))
    registry = server.registry
    with in_thread(server) as local:
        yield endpoint.bound(local.api_url), local.api_key, Served(registry.config.state_dir, lambda: registry.idle)


def _endpoint_name(endpoint: Endpoint, options: LoadOptions) -> str:
    if not endpoint.provider.quirks or (options.profile == "e2b" and not options.quirks):
        return endpoint.name
    return f"local-{options.profile}" + ("+quirks" if options.quirks else "")


def run_load(options: LoadOptions) -> int:
    """`e2b-bench load`: returns the exit code (0 no failure and no leak, 1 otherwise, 2 unusable)."""
    try:
        endpoint = resolve(options.endpoint)
        options = check_options(options, endpoint)
        if options.local_workers and options.master_bind_host != "127.0.0.1":
            raise LoadError("--local-workers runs workers on loopback: keep --master-bind-host 127.0.0.1")
    except (LoadError, EndpointError) as exc:
        print(f"e2b-bench load: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if options.worker:
        return _run_worker(options, endpoint)
    try:
        with _bound(endpoint, options) as (bound, key, served):
            preflight(bound, key)
            return LoadRun(options, bound, key, _endpoint_name(endpoint, options), served).run()
    except (PreflightError, ValueError) as exc:
        print(f"e2b-bench load: {exc}", file=sys.stderr)
        return ExitCode.USAGE


def _sdk_env(endpoint: Endpoint, key: str | None) -> dict[str, str]:
    return {"E2B_API_KEY": key or "", **endpoint.sdk_env()}


def _run_worker(options: LoadOptions, endpoint: Endpoint) -> int:
    """A worker of a master elsewhere: its users run against this endpoint (from the environment)."""
    if endpoint.provider.embedded:
        print("e2b-bench load: a --worker needs a reachable endpoint (--endpoint env or a name)", file=sys.stderr)
        return ExitCode.USAGE
    argv = _locust("--worker", "--master-host", options.master_host, "--master-port", str(options.master_port))
    return subprocess.call([*argv, "AgentUser"], env={**os.environ, **_sdk_env(endpoint, endpoint.api_key())})


@dataclass
class LoadRun:
    options: LoadOptions
    endpoint: Endpoint
    key: str | None
    name: str
    served: Served | None = None  # the embedded endpoint, served by this process: its holdings are counted
    redactor: Redactor = field(init=False)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.redactor = Redactor([self.key])

    def run(self) -> int:
        from .lifecycle import harness_pins

        info = {k: getattr(self.endpoint, k) for k in ("api_url", "sandbox_url", "kind", "key_env")}
        pins = {"harness": harness_pins(), "locust": {name: importlib.metadata.version(name) for name in LOAD_PINS}}
        header = make_header({**info, "name": self.name}, pins, list(self.options.argv) or sys.argv)
        run_dir = RunDir.create(self.options.results_dir, self.options.mode, self.name, header, self.redactor)
        run_id = run_dir.path.name
        env = _sdk_env(self.endpoint, self.key)
        status, interrupted = "completed", False
        count_start = count_sandboxes(self.endpoint, self.key)
        before = self._holdings()
        idle: Phase | None = None
        load: Phase | None = None
        cpu_before = _own_cpu()
        users, duration = self.options.users or 1, self.options.duration_s or 0
        sandboxed = in_cgroup_under(self.served.state_dir.name) if self.served else (lambda pid: False)
        sampler = MemorySampler(os.getpid(), started_from(LOCUST_MAIN), sandboxed, sample_interval(duration))
        try:
            if self.options.idle_s > 0:
                idle = run_phase("idle", "ProbeUser", 1, self.options.idle_s, self.options, env, run_id)
            cpu_before = _own_cpu()
            with sampler if self.served else contextlib.nullcontext(sampler):
                load = run_phase("load", "AgentUser", users, duration, self.options, env, run_id)
        except KeyboardInterrupt:
            status, interrupted = "interrupted", True
        defer_interrupts()  # the sweep, load.json, footer and report are written whole
        endpoint_cpu = _own_cpu() - cpu_before if self.endpoint.provider.embedded and load else None
        count_end = count_sandboxes(self.endpoint, self.key)
        found, sweep_error = self._sweep(run_id)
        survivors = found.survivors
        after = self._holdings(before)
        document = self.document(run_id, idle, load, survivors, (count_start, count_end), endpoint_cpu)
        if before is not None and after is not None:
            document["host"] = host_figures(before, after)
            start, end = _load_span(load, duration)
            document["memory"] = {
                **judge_memory(sampler.samples, start, end),
                "timeline": memory_timeline(sampler.samples, start),
            }
            validate("load", document, where=LOAD_JSON)
        run_dir.write_json(LOAD_JSON, document)
        records = self.records(document, load, found, sweep_error)
        for record in records:
            run_dir.record(record)
        exit_code = (
            interrupted_code()
            if interrupted
            else ExitCode.OK
            if all(r.conformant for r in records)
            else ExitCode.NONCONFORMANT
        )
        run_dir.write_text("junit.xml", write_junit(run_dir.path))
        run_dir.finish(status, int(exit_code))  # type: ignore[arg-type]
        print_summary(document, sys.stdout)
        print(f"run directory: {run_dir.path}")
        if self.options.report:
            from .report import render

            with contextlib.suppress(Exception):
                print(f"report: {render([run_dir.path], run_dir.path, self.redactor).html}")
        return exit_code

    def _holdings(self, target: Holdings | None = None) -> Holdings | None:
        """What the embedded endpoint holds on the host once its background teardown is done (None off it)."""
        if self.served is None:
            return None
        state_dir = self.served.state_dir
        take = lambda: count_holdings(os.getpid(), state_dir, started_from(LOCUST_MAIN))  # noqa: E731
        return settled(take, self.served.idle, target)

    def _sweep(self, run_id: str) -> tuple[Sweep, str | None]:
        try:
            return sweep(self.endpoint.api_url, self.key, run_id), None
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            return Sweep(), f"could not list the run's sandboxes: {exc}"

    def document(
        self,
        run_id: str,
        idle: Phase | None,
        load: Phase | None,
        leaked: list[str],
        counts: tuple[int, int],
        endpoint_cpu: float | None,
    ) -> dict[str, Any]:
        raw = (load.raw if load else None) or {}
        if load is not None and load.exit_code is None:
            self.notes.append(f"Locust did not exit by itself after the load phase: stopped at {load.wall_s:.0f} s")
        wall = load.wall_s if load else 0.0
        start = load.started if load else time.time()
        end = float(raw.get("stop_requested_at") or start + wall)
        operations = operation_figures(raw.get("samples", []), max(end - start, 1e-3))
        idle_ops = operation_figures((idle.raw or {}).get("samples", []), idle.wall_s) if idle and idle.raw else {}
        loaded_p95 = operations.get(RUN_TRUE, {}).get("p95_ms")
        idle_p95 = idle_ops.get(RUN_TRUE, {}).get("p95_ms")
        cpu = [float(v) for v in raw.get("cpu_s", [])]
        phases = [(phase.raw or {}) for phase in (idle, load) if phase is not None]
        created = [i for gathered in phases for i in gathered.get("created", [])]
        killed = [i for gathered in phases for i in gathered.get("killed", [])]
        refused = [create for gathered in phases for create in gathered.get("refused", [])]
        options = self.options
        failures = dict(sorted(raw.get("kinds", {}).items()))
        hung = [{"operation": str(name), "age_s": float(age)} for name, age in raw.get("hung", [])]
        for call in hung:
            failures[f"hung:{call['operation']}"] = failures.get(f"hung:{call['operation']}", 0) + 1
        if leaked:
            failures["leak"] = len(leaked)
        document: dict[str, Any] = {
            "schema": SCHEMA,
            "run_id": run_id,
            "mode": options.mode,
            "generated_at": utc_now(),
            "settings": {
                "users": options.users,
                "spawn_rate": options.spawn_rate,
                "duration_s": options.duration_s,
                "rate": options.rate if options.soak else None,
                "idle_s": options.idle_s,
                "pause_share": options.pause_share,
                "file_kib": options.file_kib,
                "stop_timeout_s": options.stop_timeout_s,
                "workers": options.workers if options.master else 0,
                "metadata": {RUN_METADATA_KEY: run_id},
            },
            "wall_s": round(wall, 3),
            "operations": operations,
            "idle": idle_ops,
            "run_true_p95": {
                "idle_ms": idle_p95,
                "load_ms": loaded_p95,
                "ratio": round(loaded_p95 / idle_p95, 3) if loaded_p95 and idle_p95 else None,
            },
            "failures": failures,
            "refused": retry_figures(refused),
            "pace": self._pace(load) if options.soak else None,
            "hung": hung,
            "sandboxes": {
                "created": len(created),
                "killed": len(killed),
                "leaked": leaked,
                "leaked_unknown_to_users": sorted(set(leaked) - set(created)),
                "created_not_killed": sorted(set(created) - set(killed)),
                "count_start": counts[0],
                "count_end": counts[1],
            },
            "client_cpu": {
                "seconds": round(sum(cpu), 3),
                "processes": len(cpu),
                "share_of_one_core": round(sum(cpu) / wall, 3) if wall > 0 else None,
            },
            "endpoint_cpu_s": round(endpoint_cpu, 3) if endpoint_cpu is not None else None,
            "timeline": timeline(raw.get("samples", []), raw.get("users", []), start, end),
            "locust": {
                "version": importlib.metadata.version("locust"),
                "exit_code": load.exit_code if load else None,
                "workers_reporting": int(raw.get("workers", 0)),
                "counts": raw.get("locust", {}),
                "errors": raw.get("errors", []),
                "log_tail": self.redactor.redact_text(load.log_tail if load else ""),
            },
            "notes": self.notes,
        }
        validate("load", document, where=LOAD_JSON)
        return document

    def _pace(self, load: Phase | None) -> dict[str, Any]:
        """The soak's pace: asked, as cut by the endpoint's refusals, and made per second of the users' span."""
        raw = (load.raw if load else None) or {}
        start, end = _load_span(load, self.options.duration_s or 0)
        return pace_figures(raw.get("pace", []), len(raw.get("created", [])), end - start)

    def records(
        self, document: Mapping[str, Any], load: Phase | None, leaked: Sweep, sweep_error: str | None
    ) -> list[CaseRecord]:
        """One case per operation (no failure), the leak check, in soak mode the sandbox count, Locust itself."""
        suite = self.options.mode
        records = []
        kinds = {k: v for k, v in document["failures"].items() if k != "leak"}
        for name, figures in document["operations"].items():
            failed, hung = figures["failures"], kinds.get(f"hung:{name}", 0)
            error = None
            if failed or hung:
                error = f"{failed} of {figures['requests']} failed, {hung} never returned; failures by kind: {kinds}"
            records.append(_case(suite, name, error, figures))
        problem = None
        if load is None or load.raw is None:
            tail = load.log_tail[-600:] if load else ""
            problem = f"Locust gathered nothing (exit code {load.exit_code if load else None}): {tail}"
        elif load.raw.get("workers", 0) < (self.options.workers if self.options.master else 0):
            problem = f"{load.raw.get('workers', 0)} of {self.options.workers} workers reported"
        elif not document["operations"]:
            problem = "no operation ran"
        records.append(_case(suite, "locust", problem, {"exit_code": load.exit_code if load else None}))
        records.append(leak_record(leaked, sweep_error))
        if "host" in document:
            host = document["host"]
            left = ", ".join(f"{n} {kind}" for kind, n in host["leaked"].items())
            error = f"the endpoint holds more on the host than before the run: {left}" if left else None
            records.append(_case(suite, "host_leaks", error, host))
        if "memory" in document:
            memory = {k: v for k, v in document["memory"].items() if k != "timeline"}
            error = None if memory["flat"] or memory["load_s"] < MIN_JUDGED_S else memory["why"]
            records.append(_case(suite, "memory_flat", error, memory))
        if self.options.soak:
            sandboxes = document["sandboxes"]
            start, end = sandboxes["count_start"], sandboxes["count_end"]
            error = None if start == end else f"the endpoint had {start} sandbox(es) at the start and {end} at the end"
            records.append(_case(suite, "sandbox_count", error, {"start": start, "end": end}))
        return records


def _load_span(load: Phase | None, duration_s: float) -> tuple[float, float]:
    """When the users started (Locust's first count of them) and when they were told to stop (wall clock)."""
    raw = (load.raw if load else None) or {}
    users = raw.get("users") or []
    start = float(users[0][0]) if users else load.started if load else time.time()
    return start, float(raw.get("stop_requested_at") or start + duration_s)


def host_figures(before: Holdings, after: Holdings) -> dict[str, Any]:
    """The endpoint's holdings on the host before and after the run, and what it holds more of."""
    return {"before": before.to_dict(), "after": after.to_dict(), "leaked": after.more_than(before)}


def _case(suite: str, name: str, error: str | None, details: Mapping[str, Any]) -> CaseRecord:
    return CaseRecord(
        id=case_id(suite, "agents", name),
        suite=suite,
        runner="agents",
        case=name,
        outcome="error" if error else "pass",
        expected="pass",
        conformant=error is None,
        error=error,
        details=dict(details),
    )


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def print_summary(document: Mapping[str, Any], out: Any) -> None:
    print(
        f"{'operation':20} {'requests':>9} {'failures':>9} {'rps':>8} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9}",
        file=out,
    )
    for name, f in document["operations"].items():
        cells = [f"{f[k]:9.2f}" if f[k] is not None else f"{'—':>9}" for k in ("p50_ms", "p95_ms", "p99_ms")]
        print(f"{name:20} {f['requests']:9d} {f['failures']:9d} {f['rps'] or 0:9.2f} {' '.join(cells)}", file=out)
    p95 = document["run_true_p95"]
    if p95["ratio"] is not None:
        print(
            f"run_true p95: {p95['load_ms']:.2f} ms under load, {p95['idle_ms']:.2f} ms idle ({p95['ratio']:.2f}x)",
            file=out,
        )
    sandboxes = document["sandboxes"]
    print(
        f"sandboxes: {sandboxes['created']} created, {sandboxes['killed']} killed, {len(sandboxes['leaked'])} leaked; "
        f"failures: {document['failures'] or 'none'}",
        file=out,
    )
    print(retries_line(document["refused"]), file=out)
    if document["pace"] is not None:
        print(pace_line(document["pace"]), file=out)
    if "host" in document:
        host = document["host"]
        counts = ", ".join(f"{kind} {host['before'][kind]} -> {host['after'][kind]}" for kind in host["before"])
        print(f"endpoint on the host (before -> after): {counts}; leaked: {host['leaked'] or 'nothing'}", file=out)
    if "memory" in document:
        memory = document["memory"]
        growth = f"{memory['growth']:+.1%}" if memory["growth"] is not None else "not judged"
        verdict = {True: "flat", False: "GROWING", None: "not judged"}[memory["flat"]]
        print(
            f"endpoint memory (its own processes, MiB): start {memory['start_mib']}, after {memory['warm_up_s']:g} s "
            f"{memory['after_warm_up_mib']}, end {memory['end_mib']}, max {memory['max_mib']}; growth {growth} "
            f"(at most {memory['max_growth']:.0%}): {verdict}; with its sandboxes at most {memory['tree_max_mib']} MiB",
            file=out,
        )
