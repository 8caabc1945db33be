"""The Python runner kit: the JSON-lines protocol (version 1) every Python runner speaks.

Standard library only: it runs in the pinned environments of the SDK runners (driver.py, bench_runner.py)
and of the framework runners (frameworks/proof.py). Protocol (docs/ARCHITECTURE.md, schemas in
bench/schemas/task.schema.json and event.schema.json): one task object on stdin; on stdout `hello`,
then the suite's events (`start` before each step runs, `step`, `sample`, `measure`, `transcript`) and
a `footer` last. The task is the single source of what to run: `steps` (prerequisites included, in run
order), `depends`, the sandbox `metadata` that tags the run, `env` and `options`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

PROTOCOL = 1
EXCERPT_CHARS = 2048
SDK_GAP = "sdk_gap"  # skip reason: the pinned SDK has no API for what the step exercises


class Skip(Exception):
    """The step cannot run on this runner; `reason` says why in a word the harness judges (`sdk_gap`)."""

    def __init__(self, message: str, reason: str = SDK_GAP) -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def error(self) -> str:
        return f"not in this SDK: {self}" if self.reason == SDK_GAP else str(self)


def one_line(text: str, limit: int = 500) -> str:
    text = str(text).strip().replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "..."


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"... [{len(value) - limit} more chars]"
    return value


class Protocol:
    """Events on the original stdout; anything else the process prints goes to stderr."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        os.dup2(2, 1)

    def emit(self, event: Mapping[str, Any]) -> None:
        self._out.write(json.dumps(event, default=str, ensure_ascii=False) + "\n")
        self._out.flush()

    def hello(self, runner: str, pins: Mapping[str, str], language: str = "python", **extra: str) -> None:
        self.emit({"type": "hello", "protocol": PROTOCOL, "runner": runner, "pins": dict(pins), "language": language,
                   **extra})  # fmt: skip

    def step(
        self, step_id: str, outcome: str, duration_ms: float, error: str | None, details: Mapping[str, Any],
        skip: Skip | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        event: dict[str, Any] = {"type": "step", "id": step_id, "outcome": outcome, "duration_ms": duration_ms,
                                 "error": error, "details": dict(details)}  # fmt: skip
        if skip is not None:
            event.update(outcome="skip", error=skip.error, skip={"reason": skip.reason, "message": str(skip)})
        self.emit(event)
        return event

    def footer(self, completed: bool = True, **extra: Any) -> None:
        late = STRAYS.take_late()
        self.emit({"type": "footer", "completed": completed, **extra, **({"late_errors": late} if late else {})})


def read_task(protocol: Protocol | None = None) -> dict[str, Any]:
    """The task from stdin, with its `env` applied to this process (the SDK then configures itself)."""
    task = json.loads(sys.stdin.read())
    if not isinstance(task, dict) or task.get("protocol") != PROTOCOL:
        print(f"runner: task is not protocol {PROTOCOL}: {str(task)[:200]}", file=sys.stderr)
        if protocol is not None:
            protocol.footer(False, reason=f"task is not protocol {PROTOCOL}")
        raise SystemExit(2)
    os.environ.update({str(k): str(v) for k, v in (task.get("env") or {}).items()})
    return task


def exit_on_sigterm() -> None:
    """A harness that gives up sends SIGTERM first: unwind (finally blocks kill the sandboxes)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


class Strays:
    """Errors no step handled: an exception that ended a thread (`threading.excepthook`) or that an asyncio loop
    reports (an async task nobody awaited). They never end the runner: each belongs to the step running when it
    arrives (else the last one started); one that arrives while its step runs fails it (when it would have
    passed, with the error), one whose step has already been reported is listed (`late_errors`) on the next
    step's event, or on the footer when no step follows."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: str | None = None
        self.last: str | None = None
        self.during: list[dict[str, str]] = []  # those of the step running
        self.late: list[dict[str, str]] = []
        self.loop_patched = False

    def install(self) -> None:
        threading.excepthook = self._thread_hook
        self.watch_loops()

    def watch_loops(self) -> None:
        """Every asyncio loop without a handler of its own reports here too (once asyncio is imported)."""
        asyncio = sys.modules.get("asyncio")
        if self.loop_patched or asyncio is None:
            return
        self.loop_patched = True
        default = asyncio.BaseEventLoop.default_exception_handler

        def handler(loop: Any, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if isinstance(exc, BaseException):
                self.arrived("asyncio", exc)
            default(loop, context)

        asyncio.BaseEventLoop.default_exception_handler = handler  # type: ignore[method-assign]

    def _thread_hook(self, args: Any) -> None:
        if args.exc_type is SystemExit:
            return
        self.arrived("thread", args.exc_value if args.exc_value is not None else args.exc_type())
        traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=sys.stderr)

    def arrived(self, kind: str, exc: BaseException) -> None:
        with self.lock:
            entry = {"step": str(self.running or self.last), "kind": kind, "error": one_line(raised_text(exc))}
            (self.during if self.running is not None else self.late).append(entry)
        print(f"runner: {kind} error in step {entry['step']}: {entry['error']}", file=sys.stderr)

    def started(self, step_id: str) -> None:
        self.watch_loops()
        with self.lock:
            self.running = self.last = step_id
            self.during = []

    def ended(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """The errors of the step that ends, and the late ones not said yet."""
        with self.lock:
            during, late = self.during, self.late
            self.running, self.during, self.late = None, [], []
            return during, late

    def take_late(self) -> list[dict[str, str]]:
        with self.lock:
            late, self.late = self.late, []
            return late


STRAYS = Strays()


def raised_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def blocker(step_id: str, depends: Mapping[str, list[str]], outcomes: Mapping[str, str]) -> str | None:
    """The first prerequisite of `step_id` that did not pass, if any."""
    return next((dep for dep in depends.get(step_id, ()) if outcomes.get(dep) != "pass"), None)


class StepPlan:
    """The task's steps in run order. Iterating yields each step to run; a step whose prerequisite did
    not pass is reported `error` (`depends on <id>`) instead. `report` sends a step's event, timed from
    when it was yielded."""

    def __init__(self, protocol: Protocol, task: Mapping[str, Any]) -> None:
        self.protocol = protocol
        self.steps = list(task.get("steps") or ())
        self.depends = dict(task.get("depends") or {})
        self.outcomes: dict[str, str] = {}
        self._started = time.perf_counter()
        STRAYS.install()

    def __iter__(self) -> Iterator[str]:
        for step_id in self.steps:
            blocked = blocker(step_id, self.depends, self.outcomes)
            if blocked is not None:
                self._send(step_id, "error", 0.0, f"depends on {blocked}", {}, None)
                continue
            # the harness times the step's deadline from here; `at` places its exchanges on the wire log's clock
            self._started = time.perf_counter()
            self.protocol.emit({"type": "start", "id": step_id, "at": time.time()})
            STRAYS.started(step_id)
            yield step_id

    def report(
        self, step_id: str, outcome: str, error: str | None, details: Mapping[str, Any], skip: Skip | None = None
    ) -> None:
        during, late = STRAYS.ended()
        if during:  # its own errors nobody handled: the first fails a step that would have passed
            details = {**details, "unawaited": during}
            if outcome == "pass":
                outcome, error = "fail", during[0]["error"]
        self._send(step_id, outcome, round((time.perf_counter() - self._started) * 1000, 3), error, details, skip,
                   late)  # fmt: skip

    def _send(self, step_id: str, outcome: str, duration_ms: float, error: str | None, details: Mapping[str, Any],
              skip: Skip | None, late: list[dict[str, str]] | None = None) -> None:  # fmt: skip
        late = (late or []) + STRAYS.take_late()
        if late:
            details = {**details, "late_errors": late}
        self.outcomes[step_id] = self.protocol.step(step_id, outcome, duration_ms, error, details, skip)["outcome"]


def run_steps(
    protocol: Protocol, task: Mapping[str, Any], run: Callable[[str], tuple[str, str | None, dict[str, Any]]]
) -> dict[str, str]:
    """Run the task's steps with `run(step_id) -> (outcome, error, details)`; `Skip` makes a step `skip`, any
    other exception `run` lets through fails its step (never the runner). Returns the outcome of each step."""
    plan = StepPlan(protocol, task)
    for step_id in plan:
        try:
            plan.report(step_id, *run(step_id))
        except Skip as exc:
            plan.report(step_id, "skip", None, {}, exc)
        except (SystemExit, KeyboardInterrupt):
            raise  # SIGTERM: the runner unwinds
        except BaseException as exc:  # a cancelled task's error, any other: the step's, not the runner's
            details = {"raised": {"exception": type(exc).__name__, "message": excerpt(str(exc))},
                       "traceback": excerpt("".join(traceback.format_exception(exc)[-3:]))}  # fmt: skip
            plan.report(step_id, "fail", one_line(raised_text(exc)), details)
    return plan.outcomes
