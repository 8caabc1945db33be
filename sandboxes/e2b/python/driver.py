"""What every Python runner shares: the JSON-lines protocol, step registry, dependency plan, clean-up.

Runs in a pinned environment holding only `e2b` and the standard library. Protocol (JSON lines,
docs/ARCHITECTURE.md): one task object on stdin; `hello`, one `step` per step, `footer` on stdout.
Endpoint settings come from the task's `env` (E2B_API_KEY, E2B_API_URL, ...), applied to the
process environment, so the SDK configures itself exactly as it would for a user.

A step function records what it observed in `obs` and ends in one of four ways: it returns (`pass`),
raises `Fail` (an assertion about E2B's documented behaviour did not hold: `fail`), raises `Deviation`
(a probe observed behaviour that differs from E2B's: `deviation`), or raises `Refused` (the endpoint
refused the call; status, code and message are recorded for the declarations to match: `refused`).
Any other exception is an observed SDK failure (`fail`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import sys
import time
import tomllib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = Path(__file__).resolve().parents[1] / "manifest.toml"
LANGUAGE = "python"
EXCERPT_CHARS = 2048
RUN_TAG = "e2b-bench-run"


class Fail(Exception):
    """An assertion about the endpoint's observable behaviour did not hold."""


class Deviation(Exception):
    """A probe observed behaviour that differs from E2B's."""


class Refused(Exception):
    """The endpoint refused the call; `details` carries status_code, error_code and message."""

    def __init__(self, summary: str, **details: Any) -> None:
        super().__init__(summary)
        self.details = {key: value for key, value in details.items() if value is not None}


class Context:
    """State shared by the steps of one run."""

    def __init__(self, run_id: str, options: dict[str, Any]) -> None:
        self.run_id = run_id
        self.options = options
        self.template: str | None = options.get("template")
        self.sandbox_timeout_s = int(options.get("sandbox_timeout_s", 120))
        self.sandbox: Any = None
        self.sandbox_id: str | None = None
        self.created: list[str] = []
        self.killed: set[str] = set()
        self.state: dict[str, Any] = {}

    @property
    def metadata(self) -> dict[str, str]:
        return {RUN_TAG: self.run_id}

    def new_sandbox(self, **options: Any) -> Any:
        """A sandbox tagged with the run (always killed at the end)."""
        from e2b import Sandbox

        sandbox = Sandbox.create(
            template=self.template, timeout=self.sandbox_timeout_s, metadata=self.metadata, **options
        )
        self.created.append(sandbox.sandbox_id)
        return sandbox


Observed = dict[str, Any]
StepFunction = Callable[[Context, Observed], None]
STEPS: dict[str, StepFunction] = {}


def step(step_id: str) -> Callable[[StepFunction], StepFunction]:
    def register(function: StepFunction) -> StepFunction:
        STEPS[step_id] = function
        return function

    return register


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Fail(message)


def excerpt(value: Any) -> Any:
    if isinstance(value, str) and len(value) > EXCERPT_CHARS:
        return value[:EXCERPT_CHARS] + f"... [{len(value) - EXCERPT_CHARS} more chars]"
    return value


def one_line(text: str) -> str:
    text = text.strip().replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= 500 else text[:500] + "..."


def exception_details(exc: BaseException) -> dict[str, Any]:
    details: dict[str, Any] = {"exception": type(exc).__name__, "message": excerpt(str(exc))}
    status = getattr(exc, "status_code", None)
    if status is not None:
        details["status_code"] = status
    for attribute in ("exit_code", "error", "stdout", "stderr"):
        if hasattr(exc, attribute):
            details[attribute] = excerpt(getattr(exc, attribute))
    return details


class Protocol:
    """JSON-lines events on the original stdout; anything else printed goes to stderr."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        os.dup2(2, 1)

    def emit(self, event: dict[str, Any]) -> None:
        self._out.write(json.dumps(event, default=str, ensure_ascii=False) + "\n")
        self._out.flush()


def load_manifest(suite: str) -> list[dict[str, Any]]:
    with MANIFEST.open("rb") as handle:
        return list(tomllib.load(handle)[suite][LANGUAGE]["steps"])


def plan(manifest: list[dict[str, Any]], requested: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Requested steps plus their prerequisites in manifest order, and unknown requested ids."""
    by_id = {entry["id"]: entry for entry in manifest}
    needed: set[str] = set()
    pending = [step_id for step_id in requested if step_id in by_id]
    while pending:
        step_id = pending.pop()
        if step_id not in needed:
            needed.add(step_id)
            pending.extend(by_id[step_id].get("depends", []))
    return [entry for entry in manifest if entry["id"] in needed], [s for s in requested if s not in by_id]


def run_step(ctx: Context, entry: dict[str, Any], outcomes: dict[str, str]) -> dict[str, Any]:
    step_id = entry["id"]
    event: dict[str, Any] = {"type": "step", "id": step_id, "title": entry.get("title")}
    blocker = next((dep for dep in entry.get("depends", []) if outcomes.get(dep) != "pass"), None)
    function = STEPS.get(step_id)
    if blocker is not None:
        return {**event, "outcome": "error", "duration_ms": 0.0, "error": f"depends on {blocker}", "details": {}}
    if function is None:
        missing = f"runner has no implementation of step {step_id}"
        return {**event, "outcome": "error", "duration_ms": 0.0, "error": missing, "details": {}}
    observed: Observed = {}
    error: str | None
    started = time.perf_counter()
    try:
        function(ctx, observed)
        outcome, error = "pass", None
    except Fail as exc:
        outcome, error = "fail", one_line(str(exc))
    except Deviation as exc:
        outcome, error = "deviation", one_line(str(exc))
    except Refused as exc:
        outcome, error = "refused", one_line(str(exc))
        observed.update(exc.details)
    except Exception as exc:  # any SDK exception is an observed behaviour
        outcome, error = "fail", one_line(f"{type(exc).__name__}: {exc}")
        observed["raised"] = exception_details(exc)
        observed["traceback"] = excerpt("".join(traceback.format_exception(exc)[-3:]))
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    return {**event, "outcome": outcome, "duration_ms": duration_ms, "error": error, "details": observed}


def kill_sandboxes(created: list[str], killed: set[str]) -> dict[str, str]:
    """Kill every sandbox created and not seen killed; what happened to each goes in the footer."""
    from e2b import Sandbox

    report: dict[str, str] = {}
    for sandbox_id in created:
        if sandbox_id in killed:
            continue
        try:
            report[sandbox_id] = "killed" if Sandbox.kill(sandbox_id) else "already gone"
        except Exception as exc:  # reported in the footer, never fatal
            report[sandbox_id] = one_line(f"{type(exc).__name__}: {exc}")
        killed.add(sandbox_id)
    return report


def cleanup(ctx: Context) -> dict[str, str]:
    """Kill every sandbox this run created and did not see killed."""
    return kill_sandboxes(ctx.created, ctx.killed)


def main(suites: set[str]) -> int:
    """Run the task's suite (one of `suites`) with the steps registered by the calling script."""
    # A harness that gives up on a hung step sends SIGTERM first: unwind so cleanup() runs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    protocol = Protocol()
    task = json.loads(sys.stdin.read())
    os.environ.update({str(k): str(v) for k, v in (task.get("env") or {}).items()})
    version = importlib.metadata.version("e2b")
    protocol.emit(
        {
            "type": "hello",
            "runner": task.get("runner") or f"py-e2b-{version}",
            "pins": {"e2b": version},
            "language": LANGUAGE,
        }
    )
    suite = task.get("suite") or sorted(suites)[0]
    if suite not in suites:
        print(f"runner: unknown suite {suite!r}, this runner runs {sorted(suites)}", file=sys.stderr)
        protocol.emit({"type": "footer", "completed": False, "reason": f"unknown suite {suite}"})
        return 2
    ctx = Context(run_id=str(task.get("run_id") or "unset"), options=dict(task.get("options") or {}))
    manifest = load_manifest(suite)
    requested = list(task.get("steps") or [entry["id"] for entry in manifest])
    steps, unknown = plan(manifest, requested)
    started = time.perf_counter()
    outcomes: dict[str, str] = {}
    cleaned: dict[str, str] = {}
    try:
        for step_id in unknown:
            error = f"unknown step {step_id}"
            protocol.emit(
                {"type": "step", "id": step_id, "outcome": "error", "duration_ms": 0.0, "error": error, "details": {}}
            )
        for entry in steps:
            event = run_step(ctx, entry, outcomes)
            outcomes[entry["id"]] = event["outcome"]
            protocol.emit(event)
    finally:
        cleaned = cleanup(ctx)
    protocol.emit(
        {
            "type": "footer",
            "completed": True,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "cleanup": cleaned,
        }
    )
    return 0
