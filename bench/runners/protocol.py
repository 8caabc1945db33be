"""Driving a runner: one JSON task on stdin, JSON-lines events on stdout (docs/ARCHITECTURE.md).

Protocol version 1: the task (`make_task`) and every event are checked against
bench/schemas/task.schema.json and event.schema.json; an event that does not match is a protocol
error, recorded and otherwise ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.housekeeping import run_metadata
from bench.remote.slowness import scaled
from bench.results import Outcome, schema_errors
from bench.runners.envs import REPO_ROOT, RunnerSpec

PROTOCOL = 1
STDERR_TAIL_BYTES = 4096
PIPES_END_S = 2.0  # on a quiet host, for the readers of a killed runner's output to reach its end (the stderr tail)
INTERRUPTED = "not run: the run was interrupted"  # a step the harness stopped its runner before

Event = dict[str, Any]


class ProtocolError(Exception):
    """The harness built a task that does not match task.schema.json (a bug of the harness)."""


def make_task(suite: str, runner: str, run_id: str, **fields: Any) -> dict[str, Any]:
    """A protocol-1 task: `steps` + `depends` (conformance) or `measures` + deadlines (benchmark),
    optional `env` and `options`; the sandbox metadata that tags the run is added here."""
    task = {"protocol": PROTOCOL, "suite": suite, "runner": runner, "run_id": run_id, "metadata": run_metadata(run_id)}
    return {**task, **fields}


def check_task(task: Mapping[str, Any]) -> None:
    errors = schema_errors("task", dict(task))
    if errors:
        raise ProtocolError(f"task does not match task.schema.json: {'; '.join(errors)}")


@dataclass(frozen=True)
class StepResult:
    """The final word on one requested step, reported by the runner or inferred by the harness."""

    id: str
    outcome: Outcome
    duration_ms: float | None
    error: str | None
    details: dict[str, Any]
    reported: bool


def reported_result(event: Event) -> StepResult:
    """The result a runner reported in a `step` event."""
    details = dict(event.get("details") or {})
    if "skip" in event:  # the structured reason, for the judgement (e.g. `sdk_gap`)
        details["skip_reason"] = event["skip"]["reason"]
    return StepResult(
        id=event["id"],
        outcome=event["outcome"],
        duration_ms=event.get("duration_ms"),
        error=event.get("error"),
        details=details,
        reported=True,
    )


@dataclass
class RunnerResult:
    """Everything observed while one runner process ran one task."""

    runner: str
    requested: tuple[str, ...]
    step_timeout_s: float
    hello: Event | None = None
    steps: dict[str, Event] = field(default_factory=dict)
    footer: Event | None = None
    exit_code: int | None = None
    stderr_tail: str = ""
    timed_out: bool = False
    stopped: bool = False  # the harness stopped it (Ctrl-C)
    hung_in: str | None = None
    hung_after_s: float | None = None  # the deadline the hung step (or the silence) ran out of
    in_step: str | None = None  # the step started and not reported yet (where a runner that died died)
    protocol_errors: list[str] = field(default_factory=list)
    duration_ms: float = 0.0
    start_error: str | None = None  # its interpreter could not be executed at all

    @property
    def start_failure(self) -> str | None:
        """Why the runner never started (no `hello`: it exited, or could not be executed, before it spoke to
        anyone), or None. Such a runner failed in the harness's environment, not at the endpoint."""
        if self.hello is not None or self.stopped or self.timed_out:
            return None
        if self.start_error is not None:
            return self.start_error
        return f"exit code {self.exit_code} before it said hello; stderr tail: {self.stderr_tail.strip() or '(empty)'}"

    @property
    def completed(self) -> bool:
        return self.footer is not None and not self.timed_out

    @property
    def died(self) -> bool:
        """It said hello, then ended without its footer while steps were left (a crash, a kill, an exit), not
        stopped by the harness."""
        return (
            self.hello is not None
            and self.footer is None
            and not self.timed_out
            and not self.stopped
            and any(step not in self.steps for step in self.requested)
        )

    @property
    def death(self) -> str:
        """How it died: `exit code N; stderr tail: ...`."""
        return f"exit code {self.exit_code}; stderr tail: {self.stderr_tail}"

    def step_results(self) -> Iterator[StepResult]:
        """One result per requested step, in request order; missing steps become `error`."""
        for step_id in self.requested:
            event = self.steps.get(step_id)
            if event is not None:
                yield reported_result(event)
            else:
                yield StepResult(
                    id=step_id,
                    outcome="error",
                    duration_ms=None,
                    error=self._missing_reason(step_id),
                    details=self._missing_details(),
                    reported=False,
                )

    def _missing_reason(self, step_id: str) -> str:
        if self.stopped:
            return INTERRUPTED
        if self.timed_out:
            if step_id == self.hung_in:
                return f"no answer in {self.hung_after_s or self.step_timeout_s:.0f} s in step {step_id}"
            return f"not run: runner timed out in {self.hung_in}"
        if self.start_failure is not None:
            return f"not run: the runner could not start ({self.start_failure})"
        if self.footer is not None:
            return f"runner finished without reporting this step: exit code {self.exit_code}"
        if step_id == self.in_step:
            return f"runner died in step {step_id}: {self.death}"
        return f"runner died before this step: {self.death}"

    def _missing_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"exit_code": self.exit_code, "stderr_tail": self.stderr_tail}
        if self.protocol_errors:
            details["protocol_errors"] = list(self.protocol_errors)
        return details


def run_runner(
    spec: RunnerSpec,
    python: Path | str,
    task: Mapping[str, Any],
    *,
    step_timeout_s: float,
    deadlines: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
    on_event: Callable[[Event], None] | None = None,
    kill_grace_s: float = 5.0,
    stop: threading.Event | None = None,
    on_timeout: Callable[[], None] | None = None,
) -> RunnerResult:
    """Run `spec.entry` with `python`, feed it `task`, collect its events.

    `on_event` sees every parsed event (hello, start, step, footer and any other type) as it arrives.
    A step has from its `start` event until its `step` event: `deadlines[id]` seconds, else
    `step_timeout_s`; outside a step the runner may stay silent `step_timeout_s` (restarted by every
    line). A runner that outlives a deadline gets SIGTERM (time to kill its sandboxes) and,
    `kill_grace_s` later, SIGKILL for its whole process group; `on_timeout` runs just before the SIGTERM
    (to see what the runner was waiting for).
    """
    check_task(task)
    requested = tuple(task.get("steps") or ())
    result = RunnerResult(runner=spec.name, requested=requested, step_timeout_s=step_timeout_s)
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            [str(python), str(spec.entry_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    except OSError as exc:  # the interpreter vanished, or cannot be executed here
        result.start_error = f"{python} cannot be executed: {exc.strerror or exc}"
        return result
    assert process.stdin and process.stdout and process.stderr
    stderr = _StderrTail(process.stderr)
    lines: queue.Queue[bytes | None] = queue.Queue()
    threads = [
        threading.Thread(target=_feed, args=(process.stdin, task), daemon=True),
        threading.Thread(target=_pump_lines, args=(process.stdout, lines), daemon=True),
        threading.Thread(target=stderr.pump, daemon=True),
    ]
    for thread in threads:
        thread.start()
    interrupted = False
    try:
        try:
            _read_events(lines, result, _Clock(step_timeout_s, dict(deadlines or {})), on_event, stop)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM in this thread: stop the runner as gracefully as `stop`
            interrupted = result.stopped = True
        if not result.timed_out and not result.stopped and not _exited_within(process, step_timeout_s):
            result.timed_out = True
            result.hung_in = _first_missing(result)
            result.hung_after_s = round(step_timeout_s, 1)
        if result.timed_out and on_timeout is not None:
            on_timeout()
        if result.timed_out or result.stopped:
            _signal_group(process, signal.SIGTERM)
            _exited_within(process, kill_grace_s)
    finally:
        _signal_group(process, signal.SIGKILL)
        result.exit_code = process.wait()
        for thread in threads:  # the group is killed: its pipes end, unless a process outside it holds one
            thread.join(timeout=scaled(PIPES_END_S))
        result.stderr_tail = stderr.text()
        result.duration_ms = round((time.monotonic() - started) * 1000, 1)
    if interrupted:
        raise KeyboardInterrupt
    return result


class _Clock:
    """When the runner must next say something: the deadline of the step in progress (from its `start`
    event) or, outside a step, the silence deadline restarted by every line."""

    def __init__(self, silence_s: float, deadlines: dict[str, float]) -> None:
        self.silence_s = silence_s
        self.deadlines = deadlines
        self.step: str | None = None
        self.allowed_s = silence_s
        self.due = time.monotonic() + silence_s

    def heard(self, event: Event | None) -> None:
        kind = event.get("type") if event is not None else None
        if kind == "start":
            self.step = str(event["id"])  # type: ignore[index]
            self.allowed_s = self.deadlines.get(self.step, self.silence_s)
        elif kind == "step" or self.step is None:
            self.step, self.allowed_s = None, self.silence_s
        else:
            return  # other events inside a step (transcripts) do not extend its deadline
        self.due = time.monotonic() + self.allowed_s


def _read_events(
    lines: queue.Queue[bytes | None],
    result: RunnerResult,
    clock: _Clock,
    on_event: Callable[[Event], None] | None,
    stop: threading.Event | None = None,
) -> None:
    number = 0
    while True:
        raw: bytes | None = b""
        while raw == b"":
            if stop is not None and stop.is_set():
                result.stopped = True
                return
            remaining = clock.due - time.monotonic()
            if remaining <= 0:
                result.timed_out = True
                result.hung_in = clock.step or _first_missing(result)
                result.hung_after_s = round(clock.allowed_s, 1)
                return
            try:
                raw = lines.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                raw = b""
        if raw is None:
            return
        number += 1
        event = _parse(raw, number, result)
        clock.heard(event)
        if event is None:
            continue
        _record(event, number, result)
        if on_event is not None:
            on_event(event)


def _parse(raw: bytes, number: int, result: RunnerResult) -> Event | None:
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        event = json.loads(text)
    except ValueError:
        result.protocol_errors.append(f"stdout line {number} is not JSON: {text[:200]!r}")
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        result.protocol_errors.append(f"stdout line {number} is not an event object: {text[:200]!r}")
        return None
    errors = schema_errors("event", event)
    if errors:
        what = f"{event['type']} event" + (f" {event['id']}" if isinstance(event.get("id"), str) else "")
        problems = "; ".join(errors)
        result.protocol_errors.append(f"stdout line {number}: {what} does not match event.schema.json: {problems}")
        return None
    return event


def _record(event: Event, number: int, result: RunnerResult) -> None:
    kind = event["type"]
    if kind == "hello":
        result.hello = event
    elif kind == "footer":
        result.footer = event
    elif kind == "start":
        result.in_step = event["id"]
    elif kind == "step":
        if result.in_step == event["id"]:
            result.in_step = None
        if event["id"] in result.steps:
            result.protocol_errors.append(f"stdout line {number}: step {event['id']} reported twice")
        else:
            result.steps[event["id"]] = event


def _first_missing(result: RunnerResult) -> str | None:
    return next((step for step in result.requested if step not in result.steps), None)


def _feed(pipe: Any, task: Mapping[str, Any]) -> None:
    try:
        with pipe:
            pipe.write(json.dumps(task).encode() + b"\n")
    except (BrokenPipeError, OSError):
        pass  # The runner died before reading its task; its exit code tells the story.


def _pump_lines(pipe: Any, lines: queue.Queue[bytes | None]) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            lines.put(raw)
    lines.put(None)


class _StderrTail:
    """Drains a pipe so it never fills, keeping only its last bytes."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe
        self._tail = b""
        self._lock = threading.Lock()

    def pump(self) -> None:
        with self._pipe:
            for chunk in iter(lambda: self._pipe.read1(65536), b""):
                with self._lock:
                    self._tail = (self._tail + chunk)[-STDERR_TAIL_BYTES:]

    def text(self) -> str:
        with self._lock:
            return self._tail.decode("utf-8", errors="replace").strip()


def _exited_within(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait for exit without reaping, so the process group id cannot be reused before it is killed."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if state is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _signal_group(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
