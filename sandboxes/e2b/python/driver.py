"""What every Python SDK runner shares: the step registry, the sandbox context and clean-up.

Runs in a pinned environment holding only `e2b` and the standard library. The protocol (version 1:
task on stdin, `hello`, one `step` per step, `footer`) is the runner kit's, runkit.py; the task names
the steps in run order, their `depends`, the sandbox `metadata` and the `env` applied before the SDK
loads, so the SDK configures itself exactly as it would for a user.

A step function records what it observed in `obs` and ends in one of four ways: it returns (`pass`),
raises `Fail` (an assertion about E2B's documented behaviour did not hold: `fail`), raises `Deviation`
(a probe observed behaviour that differs from E2B's: `deviation`), raises `Refused` (the endpoint
refused the call; status, code and message are recorded for the declarations to match: `refused`),
or raises `Skip` (the pinned SDK lacks the API: `skip`, reason `sdk_gap`). Any other exception is an
observed SDK failure (`fail`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from hygiene import Hygiene, handed_pids, reachable
from runkit import EXCERPT_CHARS, Protocol, Skip, excerpt, exit_on_sigterm, one_line, read_task, run_steps

__all__ = [
    "EXCERPT_CHARS",
    "RUN_TAG",
    "Context",
    "Deviation",
    "Fail",
    "Observed",
    "Protocol",
    "Refused",
    "Skip",
    "exception_details",
    "excerpt",
    "expect",
    "kill_sandboxes",
    "kill_twice",
    "main",
    "one_line",
    "step",
]  # fmt: skip

LANGUAGE = "python"
RUN_TAG = "e2b-bench-run"  # the key of the task's `metadata` (kept for steps that check the tag)


class Fail(Exception):
    """An assertion about the endpoint's observable behaviour did not hold."""


class Deviation(Exception):
    """A probe observed behaviour that differs from E2B's."""


class Refused(Exception):
    """The endpoint refused the call; `details` carries status_code, error_code and message."""

    def __init__(self, summary: str, **details: Any) -> None:
        super().__init__(summary)
        self.details = {key: value for key, value in details.items() if value is not None}


# A sandbox several steps share outlives the run however slow the endpoint (a case's own timeout never cuts
# it short): it lives at least twice the task's lifetime, and before a step it is given that lifetime again once
# a third of it has passed or less than the task's lifetime is left (which outlasts any step's deadline: the
# harness chose it so, bench/remote/lifetimes.py).
SHARED_LIFETIME_S = 900


class Context:
    """State shared by the steps of one run."""

    def __init__(self, run_id: str, options: dict[str, Any], metadata: Mapping[str, str] | None = None) -> None:
        self.run_id = run_id
        self.options = options
        self._metadata = dict(metadata) if metadata else {RUN_TAG: run_id}
        self.template: str | None = options.get("template")
        self.sandbox_timeout_s = int(options.get("sandbox_timeout_s", 120))
        self.shared_timeout_s = max(2 * self.sandbox_timeout_s, SHARED_LIFETIME_S)
        self.shared_refresh_s = min(self.shared_timeout_s / 3, self.shared_timeout_s - self.sandbox_timeout_s)
        self._slowness = float(options.get("slowness") or max(1.0, self.sandbox_timeout_s / 120))
        self.refreshed: dict[str, float] = {}  # shared sandbox id -> when its lifetime was last given again
        self.sandbox: Any = None
        self.sandbox_id: str | None = None
        self.created: list[str] = []
        self.killed: set[str] = set()
        self.state: dict[str, Any] = {}
        self.hygiene = Hygiene(self.slowness, self.killed, kill_one, census=bool(options.get("census")))

    @property
    def metadata(self) -> dict[str, str]:
        """The task's sandbox metadata: every sandbox of the run carries it."""
        return dict(self._metadata)

    @property
    def slowness(self) -> float:
        """How much slower than a quiet host this run is, as the harness measured it for the task."""
        return max(1.0, self._slowness)

    def new_sandbox(self, **options: Any) -> Any:
        """A sandbox tagged with the run (killed when the step ends, unless the context keeps it for later steps)."""
        from e2b import Sandbox

        options.setdefault("timeout", self.sandbox_timeout_s)
        sandbox = Sandbox.create(template=self.template, metadata=self.metadata, **options)
        self.created.append(sandbox.sandbox_id)
        return sandbox

    def shared_created(self, sandbox_id: str) -> None:
        """`sandbox_id` (created with `shared_timeout_s`) is shared by later steps: keep it alive for them."""
        self.refreshed[sandbox_id] = time.monotonic()

    def watch(self, sandbox_id: str, current: Callable[[], Any], replace: Callable[[], None] | None = None) -> None:
        """`sandbox_id` is shared by later steps: each step's leftovers on it are ended, and it is checked before
        each step (hygiene.py). `current()` is the SDK object standing for it now (None once dropped); `replace()`
        drops it so the next step that needs it makes a fresh one (None: later steps need this one's state)."""
        self.hygiene.watch(sandbox_id, current, replace)

    def uses(self, sandbox_id: str) -> None:
        """The running step uses this watched sandbox (so its timeouts are counted against that sandbox)."""
        self.hygiene.used(sandbox_id)

    def kept(self) -> set[str]:
        """The sandboxes the context keeps for later steps: a step's other sandboxes are killed when it ends."""
        return reachable(self.sandbox) | reachable(self.state) | ({self.sandbox_id} if self.sandbox_id else set())

    def handed(self) -> frozenset[int]:
        """Pids of the command handles the context keeps for a later step (that step ends them)."""
        return handed_pids(self.state)

    def lifetime_changed(self, sandbox_id: str) -> None:
        """A step gave a shared sandbox another lifetime (a resume's default): give it back before the next."""
        self.refreshed[sandbox_id] = float("-inf")

    def keep_alive(self) -> None:
        """Give each shared sandbox its whole lifetime again once a third of it has passed or less than a step's
        worth is left, through the REST API (not an SDK call a case would be credited with); one that is gone is
        the next step's to see."""
        import httpx

        due = [sid for sid, last in self.refreshed.items() if time.monotonic() - last >= self.shared_refresh_s]
        for sandbox_id in due:
            if sandbox_id not in self.killed:
                with rest() as client, contextlib.suppress(httpx.HTTPError):
                    client.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": self.shared_timeout_s})
            self.refreshed[sandbox_id] = time.monotonic()


Observed = dict[str, Any]
StepFunction = Callable[[Context, Observed], None]
STEPS: dict[str, StepFunction] = {}


def rest() -> Any:
    """An httpx client of the endpoint's REST API with the run's key: the second path many steps check by."""
    import httpx  # every SDK runner has it (the SDK's own HTTP client)

    return httpx.Client(
        base_url=os.environ["E2B_API_URL"], headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=30
    )


def step(step_id: str) -> Callable[[StepFunction], StepFunction]:
    def register(function: StepFunction) -> StepFunction:
        STEPS[step_id] = function
        return function

    return register


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Fail(message)


NOT_RECEIVED = "not received by the client within"
RECEIPT_WAIT_S = 5  # at most (on a quiet host) for a client to receive a line and answer it with a command
# However slow the host, within this: a command waits for two receipts at most, and both must end within the
# SDKs' default command timeout (60 s), or a held-back line would end the call by the client's deadline instead of
# being named by the command.
RECEIPT_WAIT_MAX_S = 25


def wait_until_seen(ctx: Context, gate: str, what: str) -> str:
    """Shell that waits (at most RECEIPT_WAIT_S, scaled) for the file `gate`, made by the client once it has
    received `what`, and says on stderr when it did not come: so output that must be sent as it comes is
    written in lockstep with its receipt, and a host's load never merges it, while an endpoint that holds
    output back is named."""
    wait_s = min(math.ceil(RECEIPT_WAIT_S * ctx.slowness), RECEIPT_WAIT_MAX_S)
    return (
        f"{{ timeout {wait_s} sh -c 'until [ -e \"$0\" ]; do sleep 0.02; done' {gate} "
        f'|| echo "{what} {NOT_RECEIVED} {wait_s} s" >&2; }}'
    )


def exception_details(exc: BaseException) -> dict[str, Any]:
    details: dict[str, Any] = {"exception": type(exc).__name__, "message": excerpt(str(exc))}
    status = getattr(exc, "status_code", None)
    if status is not None:
        details["status_code"] = status
    for attribute in ("exit_code", "error", "stdout", "stderr"):
        if hasattr(exc, attribute):
            details[attribute] = excerpt(getattr(exc, attribute))
    return details


UNEXPECTED_KEYWORD = re.compile(r"^(\w+)\.(\w+)\(\) got an unexpected keyword argument '(\w+)'")


def sdk_gap(exc: BaseException) -> str | None:
    """What the pinned SDK lacks, when `exc` says a step used an API this release does not have: a public
    attribute of an SDK object, a name `e2b` does not export, or a keyword an SDK method does not take. An SDK
    never loaded (a step of plain HTTP calls) raised none of them: it is not loaded to find that out."""
    e2b = sys.modules.get("e2b")
    if isinstance(exc, AttributeError) and exc.name and not exc.name.startswith("_"):
        owner = exc.obj if isinstance(exc.obj, type) else type(exc.obj)
        if getattr(exc.obj, "__name__", "") == "e2b":
            return f"e2b.{exc.name}"
        # Only what the SDK's class itself lacks: a value missing from an object it built is the endpoint's doing.
        if owner.__module__.split(".")[0] == "e2b" and not hasattr(owner, exc.name):
            return f"{owner.__name__}.{exc.name}"
    if isinstance(exc, ImportError) and exc.name and exc.name.split(".")[0] == "e2b":
        return str(exc.msg)
    found = UNEXPECTED_KEYWORD.match(str(exc)) if isinstance(exc, TypeError) and e2b is not None else None
    if found and hasattr(e2b, found[1]):
        return f"{found[1]}.{found[2]}({found[3]}=...)"
    return None


def run_step(ctx: Context, step_id: str) -> tuple[str, str | None, Observed]:
    """Run one registered step: its outcome, error line and observations (`Skip` propagates)."""
    function = STEPS.get(step_id)
    if function is None:
        return "error", f"runner has no implementation of step {step_id}", {}
    observed: Observed = {}
    ctx.keep_alive()
    hygiene = guarded(lambda: ctx.hygiene.before(step_id, len(ctx.created), ctx.handed()))
    started = time.perf_counter()
    try:
        outcome, error, details = judged(ctx, function, observed)
    except Skip as exc:
        outcome, error, details, skip = "skip", None, observed, exc
    else:
        skip = None
    duration_s = time.perf_counter() - started
    if step_id == ctx.options.get("leave_in"):  # fault injection for the kit's own tests: the step leaves a command
        ctx.hygiene.leave_running()
    kept, handed = ctx.kept(), ctx.handed()
    after = guarded(lambda: ctx.hygiene.after(step_id, outcome, error, details, duration_s, ctx.created, kept, handed))
    for key, value in after.items():
        hygiene[key] = hygiene.get(key, []) + value if isinstance(value, list) else value
    if skip is not None:
        raise skip
    return outcome, error, {**details, "hygiene": hygiene} if hygiene else details


def guarded(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What a check between steps found; a fault of the check itself is noted, never the step's outcome."""
    try:
        return check()
    except Exception as exc:
        return {"fault": one_line(f"{type(exc).__name__}: {exc}")}


def judged(ctx: Context, function: StepFunction, observed: Observed) -> tuple[str, str | None, Observed]:
    """Run a step body: its outcome, error line and observations (`Skip` propagates)."""
    try:
        function(ctx, observed)
        return "pass", None, observed
    except Fail as exc:
        return "fail", one_line(str(exc)), observed
    except Deviation as exc:
        return "deviation", one_line(str(exc)), observed
    except Refused as exc:
        return "refused", one_line(str(exc)), {**observed, **exc.details}
    except Skip:
        raise
    except Exception as exc:  # any SDK exception is an observed behaviour
        if gap := sdk_gap(exc):
            raise Skip(gap) from exc
        observed["raised"] = exception_details(exc)
        observed["traceback"] = excerpt("".join(traceback.format_exception(exc)[-3:]))
        return "fail", one_line(f"{type(exc).__name__}: {exc}"), observed


def kill_twice(ctx: Context, obs: Observed) -> None:
    """A step body: `ctx.sandbox.kill()` returns True, then `Sandbox.kill(its id)` returns False."""
    from e2b import Sandbox

    first = ctx.sandbox.kill()
    obs["kill"] = first
    if first is True:
        ctx.killed.add(ctx.sandbox_id)
    expect(first is True, f"kill() returned {first!r}, expected True")
    second = Sandbox.kill(ctx.sandbox_id)
    obs["kill_again"] = second
    expect(second is False, f"Sandbox.kill(killed id) returned {second!r}, expected False")


def plain_kill(client: Any, url: str, headers: Mapping[str, str] | None = None) -> str:
    """`DELETE url` (a sandbox's, the request the SDK's kill sends) with an httpx client; what happened, in the
    footer's words: `killed`, `already gone` or the error."""
    import httpx

    try:
        answer = client.delete(url, headers=headers)
    except httpx.HTTPError as exc:
        return one_line(f"{type(exc).__name__}: {exc}")
    if answer.status_code == 404:
        return "already gone"
    return "killed" if answer.is_success else one_line(f"HTTP {answer.status_code}: {answer.text}")


def kill_sandboxes(created: list[str], killed: set[str]) -> dict[str, str]:
    """Kill every sandbox created and not seen killed; what happened to each goes in the footer. With the SDK
    when a step loaded it; when none did, every sandbox was made over plain HTTP and is killed the same way
    (loading the SDK would be most of such a runner's CPU)."""
    report: dict[str, str] = {}
    left = [sandbox_id for sandbox_id in dict.fromkeys(created) if sandbox_id not in killed]
    if not left:
        return report
    if "e2b" not in sys.modules:
        with rest() as client:
            for sandbox_id in left:
                report[sandbox_id] = plain_kill(client, f"/sandboxes/{sandbox_id}")
                killed.add(sandbox_id)
        return report
    from e2b import Sandbox

    for sandbox_id in left:
        try:
            report[sandbox_id] = "killed" if Sandbox.kill(sandbox_id) else "already gone"
        except Exception as exc:  # reported in the footer, never fatal
            report[sandbox_id] = one_line(f"{type(exc).__name__}: {exc}")
        killed.add(sandbox_id)
    return report


def kill_one(sandbox_id: str) -> str:
    """Kill one sandbox now (what happened, in the footer's words)."""
    return kill_sandboxes([sandbox_id], set())[sandbox_id]


def cleanup(ctx: Context) -> dict[str, str]:
    """Kill every sandbox this run created and did not see killed."""
    return kill_sandboxes(ctx.created, ctx.killed)


def main(suites: set[str], packages: tuple[str, ...] = ("e2b",)) -> int:
    """Run the task's suite (one of `suites`) with the steps registered by the calling script; the hello
    event names the installed version of each of `packages` (the SDKs the script drives)."""
    exit_on_sigterm()
    protocol = Protocol()
    task = read_task(protocol)
    pins = {package: importlib.metadata.version(package) for package in packages}
    protocol.hello(task.get("runner") or f"py-{packages[0]}-{pins[packages[0]]}", pins, LANGUAGE)
    suite = task.get("suite")
    if suite not in suites:
        print(f"runner: unknown suite {suite!r}, this runner runs {sorted(suites)}", file=sys.stderr)
        protocol.footer(False, reason=f"unknown suite {suite}")
        return 2
    options = dict(task.get("options") or {})
    ctx = Context(run_id=str(task["run_id"]), options=options, metadata=task.get("metadata"))
    started = time.perf_counter()
    leave_after = options.get("leave_after")

    def run(step_id: str) -> tuple[str, str | None, Observed]:
        result = run_step(ctx, step_id)
        if step_id == leave_after:  # fault injection for the kit's own tests: a step that leaves a command running
            ctx.hygiene.leave_running()
        return result

    try:
        run_steps(protocol, task, run)
    finally:
        cleaned = cleanup(ctx)
    protocol.footer(True, duration_ms=round((time.perf_counter() - started) * 1000, 3), cleanup=cleaned)
    return 0
