"""Locust users that act like agents on an E2B-compatible endpoint, through the unmodified Python SDK.

This is the locustfile `e2b-bench load` runs (`bench/load.py` starts Locust in its own processes: Locust
patches the process with gevent, which the harness itself must not be). An `AgentUser` session creates a
sandbox tagged with the run, runs `true`, runs a command whose streamed output must arrive complete and in
order (its last line comes from a child that outlives the command, so output that ends at exit is lost),
writes random bytes to a file and reads them back verified by SHA-256 (through the SDK and through
`sha256sum` in the sandbox), sometimes pauses and connects again (the file must have survived), and kills
the sandbox. Every operation is one Locust request event; a failure's kind is its exception's `kind`
(`output_loss`, `hash_mismatch`, `exit_code`) or the SDK exception's class.

The SDK's HTTP client is native code that gevent cannot make cooperative, so every SDK call runs in the
gevent hub's thread pool: users wait on it as greenlets, the calls themselves run in parallel. Locust runs
this file from `bench/loadmain.py`, which leaves `threading` unpatched, so the locks the SDK shares between
those threads are the kernel's (gevent's lose a waiter's wakeup across threads).

The master (or the single process) ends the test itself after `--e2b-duration`: it stops the users (each
finishes its session within Locust's `--stop-timeout`), waits for every worker's report after that, and
writes what it gathered to `--e2b-out` as JSON for `bench/load.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import resource
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, TypeVar

import gevent  # type: ignore[import-untyped]
import gevent.event  # type: ignore[import-untyped]
from e2b import RateLimitException, Sandbox
from gevent import GreenletExit  # type: ignore[import-untyped]
from locust import User, between, constant, constant_throughput, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from locust.user.task import LOCUST_STATE_STOPPING

from bench.soak.pace import FAILED, MADE, STOPPED, Pacer

RUN_METADATA_KEY = "e2b-bench-run"  # as bench.housekeeping (this file must not import the harness's gevent-free code)
REQUEST_TYPE = "e2b"
STREAM_LINES = 200
LATE_LINE = "late"
# The late line comes from a child still running when the command's own process has exited. It is started
# after the last numbered line: on a loaded host `seq` alone can take longer than the child's sleep.
STREAM_COMMAND = f"seq -f 'line-%g' 1 {STREAM_LINES}; (sleep 0.5; echo {LATE_LINE}) &"
STREAM_EXPECTED = "".join(f"line-{i}\n" for i in range(1, STREAM_LINES + 1)) + f"{LATE_LINE}\n"
SETTLE_TIMEOUT_S = 30.0
STOP_MESSAGE = "e2b_bench_stop"  # master -> workers: stop your users (each finishes its session)
THREADS = 512  # more than any worker's users: each user has at most one SDK call going
# A create refused 429 is sent again, first in line, once the wait the endpoint asks for has passed (for all
# of this process's creates: `bench/soak/pace.py`); past this much waiting it is a failure.
ADMISSION_BUDGET_S = 300.0
DEFAULT_RETRY_AFTER_S = 1.0
RETRY_AFTER = re.compile(r"retry after (\d+(?:\.\d+)?) ?s", re.IGNORECASE)

T = TypeVar("T")


class AgentFailure(Exception):
    """Something an agent relies on did not hold."""

    kind = "agent"


class OutputLoss(AgentFailure):
    """A command's streamed output or its result lacked some of what the command printed, or misordered it."""

    kind = "output_loss"


class HashMismatch(AgentFailure):
    """A file read back is not what was written."""

    kind = "hash_mismatch"


class WrongExit(AgentFailure):
    """A command ended with another exit code than the one it has."""

    kind = "exit_code"


def failure_kind(exception: BaseException) -> str:
    return exception.kind if isinstance(exception, AgentFailure) else f"sdk:{type(exception).__name__}"


def retry_after(refusal: BaseException) -> float:
    """The wait a 429 asks for: the SDK keeps only the answer's message, which says it as the header does."""
    found = RETRY_AFTER.search(str(refusal))
    return float(found.group(1)) if found else DEFAULT_RETRY_AFTER_S


class Tally:
    """What this process saw: every sample (operation, wall time, ms, ok), failure kinds, sandbox counts."""

    def __init__(self) -> None:
        self.samples: list[list[Any]] = []
        self.kinds: Counter[str] = Counter()
        self.created: list[str] = []  # sandbox ids, as the SDK returned them
        self.killed: list[str] = []
        self.sent = (0, 0, 0, 0)  # samples, created, killed, refused already reported to the master (workers)
        self.users: list[list[float]] = []  # [wall time, users] once a second (master or single process)
        self.workers: dict[str, dict[str, Any]] = {}  # master: each worker's latest cumulative report
        self.stop_requested_at: float | None = None
        self.written = False
        self.in_flight: dict[int, tuple[str, float]] = {}  # SDK calls going: operation, wall time started
        self.refused: list[list[Any]] = []  # per create refused 429: [refusals, seconds waited, how it ended]

    def hung(self) -> list[list[Any]]:
        """The calls still going now: [operation, seconds since they started]."""
        now = time.time()
        return [[name, round(now - started, 3)] for name, started in self.in_flight.values()]


TALLY = Tally()


class Gate:
    """This process's creates, started one at a time in the order asked (a create sent again after a refusal
    first) when its `Pacer` lets them: at the soak's pace and never inside the endpoint's backoff."""

    def __init__(self) -> None:
        self.pacer = Pacer(asked=0.0)
        self._line: deque[gevent.event.Event] = deque()
        self._arrived = gevent.event.Event()
        self._dispatcher: gevent.Greenlet | None = None

    def turn(self, stopping: Callable[[], bool], first: bool = False) -> None:
        """Return when this create may be sent; `GreenletExit` when its user is stopped first (Locust's stop, or
        `stopping()`: a user told to stop while in its task still waits in line): nothing was sent."""
        environment = _environment
        if environment is not None and environment.runner is not None and environment.parsed_options is not None:
            per_user = environment.parsed_options.e2b_rate
            self.pacer.asked = per_user * environment.runner.target_user_count
        mine = gevent.event.Event()
        if first:
            self._line.appendleft(mine)
        else:
            self._line.append(mine)
        if self._dispatcher is None or self._dispatcher.dead:
            self._dispatcher = gevent.spawn(self._dispatch)
        self._arrived.set()
        try:
            while not mine.wait(timeout=1.0):
                if stopping():
                    raise GreenletExit
        finally:
            if not mine.is_set():
                self._line.remove(mine)

    def _dispatch(self) -> None:
        while True:
            if not self._line:
                self._arrived.clear()
                self._arrived.wait()
                continue
            wait = self.pacer.wait_s(time.time())
            if wait > 0:
                gevent.sleep(min(wait, 0.5))  # then again: a refusal may have moved the backoff meanwhile
                continue
            self.pacer.started(time.time())
            self._line.popleft().set()


GATE = Gate()


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--e2b-run-id", default="", help="metadata e2b-bench-run of every sandbox")
    parser.add_argument("--e2b-out", default="", help="where the master writes what it gathered (JSON)")
    parser.add_argument("--e2b-duration", type=float, default=0.0, help="seconds before the users are stopped")
    parser.add_argument("--e2b-rate", type=float, default=0.0, help="sessions per second of each user (0: agent pace)")
    parser.add_argument("--e2b-pause-share", type=float, default=0.2, help="share of sessions that pause and connect")
    parser.add_argument("--e2b-file-kib", type=int, default=64, help="size of the file each session writes")
    parser.add_argument("--e2b-sandbox-timeout", type=int, default=300, help="sandbox timeout in seconds")


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    gevent.get_hub().threadpool.maxsize = THREADS
    if isinstance(environment.runner, MasterRunner):
        environment.events.worker_report.add_listener(_on_worker_report)
    if isinstance(environment.runner, WorkerRunner):
        environment.events.report_to_master.add_listener(_on_report_to_master)
        environment.runner.register_message(
            STOP_MESSAGE, lambda environment, msg, **_: gevent.spawn(_stop, environment)
        )
    else:
        environment.events.test_start.add_listener(_on_test_start)
        environment.events.quitting.add_listener(lambda environment, **_: _write(environment))


@events.request.add_listener
def _on_request(name: str, response_time: float, exception: BaseException | None, **_: Any) -> None:
    TALLY.samples.append([name, time.time(), response_time, exception is None])
    if exception is not None:
        TALLY.kinds[failure_kind(exception)] += 1


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stop(environment: Environment) -> None:
    if environment.runner is not None:
        environment.runner.stop()


def _on_report_to_master(client_id: str, data: dict[str, Any]) -> None:
    runner = _environment.runner if _environment else None
    users = runner.user_count if runner else 0  # before the samples: a user ends after its last sample
    data["e2b_bench"] = {
        "users": users,
        "samples": TALLY.samples[TALLY.sent[0] :],
        "kinds": dict(TALLY.kinds),
        "created": TALLY.created[TALLY.sent[1] :],
        "killed": TALLY.killed[TALLY.sent[2] :],
        "refused": TALLY.refused[TALLY.sent[3] :],
        "cpu_s": _cpu_seconds(),
        "hung": TALLY.hung(),
        "pace": GATE.pacer.summary(),
        "at": time.time(),
    }
    TALLY.sent = (len(TALLY.samples), len(TALLY.created), len(TALLY.killed), len(TALLY.refused))


def _on_worker_report(client_id: str, data: dict[str, Any]) -> None:
    report = data.get("e2b_bench")
    if not report:
        return
    for key in ("samples", "created", "killed", "refused"):
        getattr(TALLY, key).extend(report.get(key, []))
    TALLY.workers[client_id] = {k: v for k, v in report.items() if k not in ("samples", "created", "killed", "refused")}


_environment: Environment | None = None


@events.init.add_listener
def _keep(environment: Environment, **_: Any) -> None:
    global _environment
    _environment = environment


def _on_test_start(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is not None and options.e2b_duration > 0:
        gevent.spawn(_finish_after, environment, float(options.e2b_duration))
    gevent.spawn(_count_users, environment)


def _count_users(environment: Environment) -> None:
    while environment.runner is not None and TALLY.stop_requested_at is None:
        TALLY.users.append([time.time(), environment.runner.user_count])
        gevent.sleep(1.0)


def _finish_after(environment: Environment, seconds: float) -> None:
    """Stop the users after `seconds`, wait for every worker's last samples, write the result, quit."""
    gevent.sleep(seconds)
    runner = environment.runner
    assert runner is not None
    TALLY.stop_requested_at = time.time()
    TALLY.users.append([TALLY.stop_requested_at, runner.user_count])
    if isinstance(runner, MasterRunner):
        # Not Locust's own stop: a worker told to stop sleeps out the stop timeout before it heeds `quit`.
        stopped = time.time()
        runner.send_message(STOP_MESSAGE)
        deadline = time.monotonic() + (environment.stop_timeout or 0) + SETTLE_TIMEOUT_S
        # Settled once each worker reported after the stop with no user left: its samples are all here.
        while time.monotonic() < deadline and not all(
            report["at"] > stopped and report["users"] == 0 for report in TALLY.workers.values()
        ):
            gevent.sleep(0.2)
    else:
        # Users finish their session (within --stop-timeout); an SDK call that never returns must not hold the
        # result back: it is reported as in flight.
        gevent.spawn(runner.stop).join(timeout=(environment.stop_timeout or 0) + SETTLE_TIMEOUT_S)
    _write(environment)
    runner.quit()


def _write(environment: Environment) -> None:
    options = environment.parsed_options
    if TALLY.written or options is None or not options.e2b_out:
        return
    TALLY.written = True
    stats = environment.stats
    workers = TALLY.workers.values()
    document = {
        "samples": TALLY.samples,
        "kinds": dict(sum((Counter(w["kinds"]) for w in workers), TALLY.kinds)),
        "created": TALLY.created,
        "killed": TALLY.killed,
        "refused": TALLY.refused,
        "cpu_s": [_cpu_seconds(), *(w["cpu_s"] for w in workers)],
        "workers": len(TALLY.workers),
        "hung": TALLY.hung() + [call for w in workers for call in w.get("hung", [])],
        "users": TALLY.users,
        "pace": [w["pace"] for w in workers] if TALLY.workers else [GATE.pacer.summary()],
        "stop_requested_at": TALLY.stop_requested_at,
        "locust": {
            entry.name: {"requests": entry.num_requests, "failures": entry.num_failures}
            for entry in stats.entries.values()
        },
        "errors": [
            {"name": error.name, "error": str(error.error), "occurrences": error.occurrences}
            for error in stats.errors.values()
        ],
    }
    path = options.e2b_out
    with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    os.replace(f"{path}.tmp", path)


# --- the simulated agent -------------------------------------------------------------------------


class SandboxUser(User):
    """A user that holds at most one sandbox and reports every SDK call as a Locust request."""

    abstract = True
    sandbox: Sandbox | None = None

    def call(self, name: str, action: Callable[[], T], admitted: bool = False) -> T | None:
        """Run `action` (SDK calls) in the thread pool as operation `name`; None when it raised. `admitted`:
        a create, started at its turn (`GATE`) and sent again while the endpoint refuses it 429, once the
        backoff it asks for has passed; the operation's time is then the agent's: the backoffs and every try,
        not the wait for its first turn (the pace)."""
        stopping = lambda: self._state == LOCUST_STATE_STOPPING  # noqa: E731
        if admitted:
            GATE.turn(stopping)
        started = time.perf_counter()
        deadline = time.monotonic() + ADMISSION_BUDGET_S
        refusals, waited = 0, 0.0
        while True:
            sent = time.time()
            result, error, stopped = self._in_pool(name, action)
            refused_now = isinstance(error, RateLimitException)
            if not (admitted and error is not None and refused_now) or stopped or time.monotonic() > deadline:
                break
            refused_at = time.time()
            refusals += 1
            GATE.pacer.refused(refused_at, retry_after(error), sent)
            try:
                GATE.turn(stopping, first=True)
            except GreenletExit:
                waited += time.time() - refused_at
                TALLY.refused.append([refusals, waited, STOPPED])  # stopped while refused: nothing was made
                raise
            waited += time.time() - refused_at
        if admitted:
            if error is None:
                GATE.pacer.made(time.time(), refusals)
            if refusals:
                ended = MADE if error is None else STOPPED if stopped is not None and refused_now else FAILED
                TALLY.refused.append([refusals, waited, ended])
        if stopped is not None and isinstance(error, RateLimitException):
            raise stopped  # stopped while its create was being refused: nothing was made, nothing failed
        self.environment.events.request.fire(
            request_type=REQUEST_TYPE,
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=0,
            exception=error,
            context={},
        )
        if stopped is not None:
            if isinstance(result, Sandbox):
                self.sandbox = result
            raise stopped
        return result

    @staticmethod
    def _in_pool(name: str, action: Callable[[], T]) -> tuple[T | None, BaseException | None, GreenletExit | None]:
        """(result, the exception it raised, a stop that landed while it ran) of `action` in the thread pool."""
        result: T | None = None
        error: BaseException | None = None
        stopped: GreenletExit | None = None
        pending = gevent.get_hub().threadpool.spawn(action)
        TALLY.in_flight[id(pending)] = (name, time.time())
        while True:
            try:
                result = pending.get()
                break
            except GreenletExit as exit_:
                # Locust's stop of a waiting user can land just after it woke into its next session: let the
                # call finish (it runs on anyway), so that on_stop can undo it (kill the sandbox it made).
                stopped = exit_
            except Exception as exc:
                error = exc
                break
        del TALLY.in_flight[id(pending)]
        return result, error, stopped

    def create(self) -> Sandbox | None:
        options = self.environment.parsed_options
        metadata = {RUN_METADATA_KEY: options.e2b_run_id}

        def create() -> Sandbox:
            created = Sandbox.create(timeout=options.e2b_sandbox_timeout, metadata=metadata)
            TALLY.created.append(created.sandbox_id)
            return created

        sandbox = self.call("create", create, admitted=True)
        if sandbox is not None:
            self.sandbox = sandbox
        return sandbox

    def kill(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is None:
            return

        def kill() -> bool:
            # Counted where it happens: a user stopped while its kill runs does not come back to count it.
            killed = sandbox.kill()  # False: the endpoint did not know it
            if killed:
                TALLY.killed.append(sandbox.sandbox_id)
            return killed

        self.call("kill", kill)

    def on_stop(self) -> None:
        self.kill()


def run_true(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("true")
    if result.exit_code != 0:
        raise WrongExit(f"`true` ended with exit code {result.exit_code}")


def stream(sandbox: Sandbox) -> None:
    chunks: list[str] = []
    result = sandbox.commands.run(STREAM_COMMAND, on_stdout=chunks.append)
    streamed = "".join(chunks)
    for what, text in (("streamed output", streamed), ("result stdout", result.stdout)):
        if text != STREAM_EXPECTED:
            raise OutputLoss(f"{what}: {stream_difference(text)}")
    if result.exit_code != 0:
        raise WrongExit(f"the streaming command ended with exit code {result.exit_code}")


def stream_difference(text: str) -> str:
    """How `text` differs from the streaming command's output: lines missing, or where the order breaks."""
    lines, expected = text.splitlines(), STREAM_EXPECTED.splitlines()
    said = f"{len(lines)} of {len(expected)} lines"
    if LATE_LINE not in lines:
        return f"{said}, without the line {LATE_LINE!r} printed after the command exited"
    at = next((i for i, (got, want) in enumerate(zip(lines, expected, strict=False)) if got != want), len(lines))
    shown = repr(lines[at]) if at < len(lines) else "the end"
    return f"{said}, line {at + 1} is {shown} where {expected[at]!r} belongs" if at < len(expected) else said


def write_file(sandbox: Sandbox, path: str, data: bytes) -> None:
    sandbox.files.write(path, data)


def check_file(sandbox: Sandbox, path: str, digest: str) -> None:
    """The file's bytes through the SDK and its hash through `sha256sum` in the sandbox are `digest`."""
    read = hashlib.sha256(bytes(sandbox.files.read(path, format="bytes"))).hexdigest()
    if read != digest:
        raise HashMismatch(f"{path}: read back sha256 {read[:16]}…, written {digest[:16]}…")
    shown = sandbox.commands.run(f"sha256sum {path}").stdout.split()[:1]
    if shown != [digest]:
        raise HashMismatch(f"{path}: sha256sum in the sandbox shows {shown}, written {digest[:16]}…")


def pause_and_connect(sandbox: Sandbox) -> Sandbox:
    sandbox.pause()
    return Sandbox.connect(sandbox.sandbox_id)


class AgentUser(SandboxUser):
    """One session per task: create, commands, streamed output, a verified file, sometimes pause, kill."""

    def wait_time(self) -> float:
        rate = self.environment.parsed_options.e2b_rate
        return constant_throughput(rate)(self) if rate > 0 else between(0.2, 1.0)(self)

    @task
    def session(self) -> None:
        options = self.environment.parsed_options
        sandbox = self.create()
        if sandbox is None:
            return
        try:
            self.call("run_true", lambda: run_true(sandbox))
            self.call("stream", lambda: stream(sandbox))
            data = os.urandom(options.e2b_file_kib * 1024)
            digest = hashlib.sha256(data).hexdigest()
            path = f"/home/user/load-{digest[:12]}.bin"
            self.call("write", lambda: write_file(sandbox, path, data))
            self.call("read", lambda: check_file(sandbox, path, digest))
            if random.random() < options.e2b_pause_share:
                connected = self.call("pause_connect", lambda: pause_and_connect(sandbox))
                if connected is not None:
                    self.sandbox = connected
                    self.call("read_after_connect", lambda: check_file(connected, path, digest))
        finally:
            self.kill()


class ProbeUser(SandboxUser):
    """`commands.run("true")` back to back on one sandbox: the idle figure next to the load."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.create()

    @task
    def probe(self) -> None:
        sandbox = self.sandbox
        if sandbox is None:
            self.create()
            return
        self.call("run_true", lambda: run_true(sandbox))
