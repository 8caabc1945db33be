"""Between the steps of a Python SDK runner: a step ends what it started, and a shared sandbox is checked.

Standard library and httpx only (the SDK's own HTTP client): the kit drives envd's process RPCs itself (Connect,
JSON), a second path beside whatever SDK call a step made, so what it sees never depends on the client a step used.

- A shared sandbox (one several steps use) is *watched* (`Hygiene.watch`): its processes are listed when it is
  made (its baseline), before each step and after it. What a step started and left running on it is killed after
  the step (`left_behind` in the step's details, confirmed by listing again). Before each step a watched sandbox
  that holds processes beyond its baseline, whose envd does not answer within a bounded, slowness-scaled wait, or
  that the control plane no longer knows (GET answers 404), is replaced: killed, and dropped from the suite's
  state so the next step that needs it makes a fresh one (`replaced` in the details of the step about to run,
  naming the step that left it so). One whose envd answers the list with an error is kept and its processes go
  unchecked (`unlisted`, said once).
- A command whose handle the context keeps for a later step (`handed`) is that step's to end.
- A sandbox a step made for itself (not watched and not kept in the context for later steps) is killed when the
  step ends (`sandboxes_ended`), not when the runner ends.
- With task option `census: true`, each step's details say how many processes each shared sandbox holds after it
  (`census`): the kit's second path, for the harness's own tests.
- Steps that keep hitting the SDK's request timeout on one sandbox (CRAWL_IN_A_ROW in a row) make it `crawl`:
  named in the details (which sandbox, since which step) and replaced.
Everything observed goes into the step's `details["hygiene"]`; the harness prints a line for each event.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

ENVD_PORT = 49983
CENSUS_WAIT_S = 10.0  # a list of processes answers in milliseconds; this bounds one that does not (quiet host)
GONE_WAIT_S = 5.0  # for a killed process to leave the list (quiet host)
CRAWL_IN_A_ROW = 3  # steps in a row timing out on one sandbox before it is replaced
REQUEST_TIMEOUT_S = 60.0  # the SDKs' default request timeout: a failing step this long hit it
# What a timeout's exception says: its class (TimeoutException, ReadTimeout, TimeoutError) or its message.
TIMEOUT_WORDS = re.compile(r"(?i:timed? out|deadline[ _]exceeded)|\b\w*Timeout(?:Exception|Error)?\b")
LEAVE_RUNNING = "sleep 600"  # what task options `leave_after`/`leave_in: <id>` leave running (the kit's own tests)


def timed_out(outcome: str, error: str | None, details: dict[str, Any], duration_s: float) -> bool:
    """A step that failed on a timeout: the exception's class or message says so, or it lasted the SDK's timeout."""
    if outcome in ("pass", "skip"):
        return False
    raised = details.get("raised") if isinstance(details.get("raised"), dict) else {}
    words = " ".join(str(part) for part in (error, raised.get("exception"), raised.get("message")) if part)
    return bool(TIMEOUT_WORDS.search(words)) or duration_s >= REQUEST_TIMEOUT_S


@dataclass
class Watched:
    """A shared sandbox: `current()` is the SDK object standing for it now (a connect rotates its token), or
    None once the suite dropped it; `replace()` drops it from the suite's state (None: later steps need it)."""

    sandbox_id: str
    current: Callable[[], Any]
    replace: Callable[[], None] | None
    baseline: set[int] = field(default_factory=set)
    before: set[int] | None = None  # its processes when the running step began
    last_step: str | None = None  # the last step that ran while it was watched
    timeouts: int = 0
    since: str | None = None  # the first step of the current run of timeouts
    unlisted: str | None = None  # why its envd gives no process list (its processes then go unchecked)
    unlisted_said: bool = False


class Census(Exception):
    """A watched sandbox's envd did not give its processes: `answered` with an error (it does not list them: its
    processes go unchecked, the sandbox is kept), or not at all (no answer in time: the sandbox is replaced)."""

    def __init__(self, message: str, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


class Hygiene:
    def __init__(self, slowness: float, killed: set[str], kill: Callable[[str], str], census: bool = False) -> None:
        self.slowness = slowness
        self.record_census = census  # every step's details say how many processes each shared sandbox has after it
        self.killed = killed  # the context's: sandboxes known killed
        self.kill = kill  # kills one sandbox, says what happened
        self.watched: dict[str, Watched] = {}
        self.touched: set[str] = set()
        self.created_before = 0

    # --- what the suites tell ---------------------------------------------------------------------
    def watch(self, sandbox_id: str, current: Callable[[], Any], replace: Callable[[], None] | None) -> None:
        entry = Watched(sandbox_id, current, replace)
        self.watched[sandbox_id] = entry
        try:
            entry.baseline = {pid for pid, _ in self.census(entry)}
        except Census as exc:
            entry.unlisted = str(exc)[:300] if exc.answered else None
        entry.before = set(entry.baseline)
        self.touched.add(sandbox_id)

    def used(self, sandbox_id: str) -> None:
        """The running step uses this watched sandbox (its timeouts are that sandbox's)."""
        self.touched.add(sandbox_id)

    # --- envd's process RPCs ----------------------------------------------------------------------
    def _envd(self, entry: Watched) -> tuple[str, dict[str, str]]:
        sandbox = entry.current()
        url = getattr(sandbox, "envd_api_url", None)
        if not url:
            configured = os.environ.get("E2B_SANDBOX_URL")
            domain = os.environ.get("E2B_DOMAIN", "e2b.app")
            url = configured or f"https://{ENVD_PORT}-{entry.sandbox_id}.{domain}"
        headers = {"E2b-Sandbox-Id": entry.sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT),
                   "Connect-Protocol-Version": "1"}  # fmt: skip
        token = getattr(sandbox, "_envd_access_token", None)
        if token:
            headers["X-Access-Token"] = token
        return str(url).rstrip("/"), headers

    def _call(self, entry: Watched, rpc: str, body: dict[str, Any]) -> dict[str, Any]:
        url, headers = self._envd(entry)
        try:
            answer = httpx.post(f"{url}/process.Process/{rpc}", json=body, headers=headers,
                                timeout=CENSUS_WAIT_S * self.slowness)  # fmt: skip
        except httpx.HTTPError as exc:
            raise Census(f"{rpc}: {type(exc).__name__}: {exc}" if str(exc) else f"{rpc}: {type(exc).__name__}") from exc
        if answer.status_code != 200:
            raise Census(f"{rpc}: HTTP {answer.status_code}: {answer.text[:200]}", answered=True)
        try:
            return dict(answer.json())
        except (ValueError, TypeError) as exc:
            raise Census(f"{rpc}: not JSON: {answer.text[:200]}", answered=True) from exc

    def gone(self, entry: Watched) -> bool:
        """Whether the control plane says the sandbox no longer exists (404 to its GET)."""
        try:
            answer = httpx.get(f"{os.environ['E2B_API_URL'].rstrip('/')}/sandboxes/{entry.sandbox_id}",
                               headers={"X-API-KEY": os.environ.get("E2B_API_KEY", "")},
                               timeout=CENSUS_WAIT_S * self.slowness)  # fmt: skip
        except (httpx.HTTPError, KeyError):
            return False
        return answer.status_code == 404

    def census(self, entry: Watched) -> list[tuple[int, str]]:
        """(pid, command line) of each process envd lists on the sandbox."""
        listed = self._call(entry, "List", {}).get("processes") or []
        found = []
        for process in listed:
            config = process.get("config") or {}
            command = " ".join([str(config.get("cmd", "")), *map(str, config.get("args") or [])]).strip()
            with contextlib.suppress(TypeError, ValueError):
                found.append((int(process.get("pid")), command))
        return found

    def end_processes(self, entry: Watched, pids: set[int]) -> bool:
        """SIGKILL each pid, then wait until none is listed; whether they are gone."""
        for pid in pids:
            with contextlib.suppress(Census):
                self._call(entry, "SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
        deadline = time.monotonic() + GONE_WAIT_S * self.slowness
        while True:
            try:
                left = {pid for pid, _ in self.census(entry)} & pids
            except Census:
                return False
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.05)

    def leave_running(self) -> None:
        """Start LEAVE_RUNNING on every watched sandbox and leave it: a case that leaves a command behind, for the
        kit's own tests (task option `leave_after`)."""
        frame = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", LEAVE_RUNNING]}}).encode()
        for entry in self._live():
            url, headers = self._envd(entry)
            headers.update({"Content-Type": "application/connect+json",
                            "Authorization": "Basic " + base64.b64encode(b"user:").decode()})  # fmt: skip
            with contextlib.suppress(httpx.HTTPError), httpx.stream(
                "POST", f"{url}/process.Process/Start", content=b"\0" + len(frame).to_bytes(4, "big") + frame,
                headers=headers, timeout=CENSUS_WAIT_S * self.slowness,
            ) as answer:  # fmt: skip
                next(answer.iter_raw(), None)  # its start event: it runs; the stream is dropped, the process kept

    # --- around each step -------------------------------------------------------------------------
    def _live(self) -> list[Watched]:
        for sandbox_id in [sid for sid in self.watched if sid in self.killed]:
            del self.watched[sandbox_id]
        return [entry for entry in self.watched.values() if entry.current() is not None]

    def _drop(self, entry: Watched) -> str:
        """Kill a watched sandbox and let the suite make a fresh one; what the kill did."""
        self.watched.pop(entry.sandbox_id, None)
        assert entry.replace is not None
        entry.replace()
        what = self.kill(entry.sandbox_id)
        self.killed.add(entry.sandbox_id)
        return what

    def before(self, step_id: str, created: int, handed: frozenset[int] = frozenset()) -> dict[str, Any]:
        """Check each watched sandbox; one holding leftovers or not answering is replaced. Details for the step."""
        self.touched = set()
        self.created_before = created
        report: dict[str, Any] = {}
        for entry in self._live():
            problem = None
            if self._unlisted(entry, report):
                continue
            try:
                listed = self.census(entry)
            except Census as exc:
                if exc.answered and self.gone(entry):
                    problem = f"gone: {exc}"
                elif self._unlisted(entry, report, exc):
                    continue
                else:
                    problem = f"no answer: {exc}"
            else:
                extra = [(pid, command) for pid, command in listed if pid not in entry.baseline | handed]
                entry.before = {pid for pid, _ in listed}
                if extra:
                    problem = "left running: " + "; ".join(f"{command} (pid {pid})" for pid, command in extra)
            if problem is None:
                continue
            found = {"sandbox": entry.sandbox_id, "reason": problem[:300], "left_by": entry.last_step}
            if entry.replace is not None:
                found["killed"] = self._drop(entry)
                report.setdefault("replaced", []).append(found)
                continue
            # Later steps need its state: what was left is ended instead; one that does not answer is left alone.
            if problem.startswith("left running"):
                extra_pids = set(entry.before or ()) - entry.baseline - handed
                found["ended"] = self.end_processes(entry, extra_pids)
                entry.before = entry.before - extra_pids if found["ended"] and entry.before is not None else None
            else:
                self.watched.pop(entry.sandbox_id, None)
            report.setdefault("kept", []).append(found)
        return report

    def after(self, step_id: str, outcome: str, error: str | None, details: dict[str, Any], duration_s: float,
              created: list[str], keep: set[str], handed: frozenset[int] = frozenset()) -> dict[str, Any]:  # fmt: skip
        """End what the step left running on the watched sandboxes and the sandboxes it made for itself; count
        timeouts. Details for the step."""
        report: dict[str, Any] = {}
        slow = timed_out(outcome, error, details, duration_s)
        census: dict[str, int | str] = {}
        for entry in self._live():
            entry.last_step = step_id
            used = not self.touched or entry.sandbox_id in self.touched
            if self._unlisted(entry, report):
                if used:
                    self._count(entry, step_id, slow, report)
                continue
            try:
                listed = self.census(entry)
            except Census as exc:
                census[entry.sandbox_id] = str(exc)[:200]
                if not self._unlisted(entry, report, exc):
                    self._count(entry, step_id, True, report)
                continue
            known = (entry.before or entry.baseline) | handed
            new = [(pid, command) for pid, command in listed if pid not in known]
            if new:
                ended = self.end_processes(entry, {pid for pid, _ in new})
                report.setdefault("left_behind", []).extend(
                    {"sandbox": entry.sandbox_id, "pid": pid, "command": command[:200], "ended": ended}
                    for pid, command in new
                )
            with contextlib.suppress(Census):
                census[entry.sandbox_id] = len(self.census(entry)) if new else len(listed)
            if used:
                self._count(entry, step_id, slow, report)
        if census and self.record_census:
            report["census"] = census
        mine = [sid for sid in dict.fromkeys(created[self.created_before :])
                if sid not in self.killed and sid not in keep and sid not in self.watched]  # fmt: skip
        if mine:
            report["sandboxes_ended"] = {}
            for sandbox_id in mine:
                report["sandboxes_ended"][sandbox_id] = self.kill(sandbox_id)
                self.killed.add(sandbox_id)
        return report

    def _unlisted(self, entry: Watched, report: dict[str, Any], exc: Census | None = None) -> bool:
        """Whether the sandbox's envd gives no process list (said once in the details)."""
        if exc is not None and exc.answered:
            entry.unlisted = str(exc)[:300]
        if entry.unlisted and not entry.unlisted_said:
            entry.unlisted_said = True
            report.setdefault("unlisted", []).append({"sandbox": entry.sandbox_id, "reason": entry.unlisted})
        return entry.unlisted is not None

    def _count(self, entry: Watched, step_id: str, slow: bool, report: dict[str, Any]) -> None:
        if not slow:
            entry.timeouts, entry.since = 0, None
            return
        entry.timeouts += 1
        entry.since = entry.since or step_id
        if entry.timeouts < CRAWL_IN_A_ROW:
            return
        crawl: dict[str, Any] = {"sandbox": entry.sandbox_id, "since": entry.since, "in_a_row": entry.timeouts}
        if entry.replace is not None and entry.sandbox_id in self.watched:
            crawl["replaced"] = True
            crawl["killed"] = self._drop(entry)
        else:
            crawl["replaced"] = False
            entry.timeouts, entry.since = 0, None
        report.setdefault("crawl", []).append(crawl)


def handed_pids(value: Any, depth: int = 2) -> frozenset[int]:
    """Pids of the command handles a value holds (an object with an integer `pid`, inside containers)."""
    pid = getattr(value, "pid", None)
    if isinstance(pid, int) and not isinstance(pid, bool):
        return frozenset({pid})
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    return frozenset().union(*(handed_pids(item, depth - 1) for item in items)) if depth > 0 else frozenset()


def reachable(value: Any, depth: int = 3) -> set[str]:
    """Sandbox ids a value holds (an SDK object's `sandbox_id`, ids as strings, inside containers): what a step
    kept in the context for later steps."""
    found: set[str] = set()
    sandbox_id = getattr(value, "sandbox_id", None)
    if isinstance(sandbox_id, str):
        found.add(sandbox_id)
    elif isinstance(value, str):
        found.add(value)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            found |= reachable(item, depth - 1)
    elif depth > 0 and isinstance(value, list | tuple | set | frozenset):
        for item in value:
            found |= reachable(item, depth - 1)
    return found
