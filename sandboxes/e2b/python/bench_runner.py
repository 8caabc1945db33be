"""Python benchmark runner: times the unmodified `e2b` SDK against the endpoint it is pointed at.

Runs in a pinned environment holding only `e2b` (and its dependencies). Protocol (JSON lines,
docs/ARCHITECTURE.md): one task on stdin, then on stdout `hello`, one `sample` per timed operation as
it ends, one `measure` when a measure ends, and a `footer` naming what happened to every sandbox.

Task: {"suite": "bench", "run_id", "runner", "env", "deadline_s", "sandbox_timeout_s",
       "measures": [{"id", "kind", "mode", "count", "interval_ms", "bytes"}]}
Kinds: `tti` (create -> first `commands.run("true")` done; mode sequential, staggered or burst),
`run_true` (`commands.run("true")` on a ready sandbox), `upload` / `download` (`bytes` random bytes,
verified by SHA-256). Each has a `<kind>_http` twin doing the same requests with a plain `httpx` client
and no SDK at all (its own sandboxes, created and killed over the REST API): the SDK's row minus its
twin's is what the client library adds; the twins also time the answer's first byte (`first_byte_ms`).
`tti_cell` (Python only): a create of the measure's `template` (the code interpreter's) -> its first cell's
result, the cell sent as the code-interpreter SDK sends it (`POST /execute` on the sandbox's port 49999, read to
`end_of_execution`) with `httpx`, since this environment holds the `e2b` SDK only.
`upload_floor` / `download_floor` make the SDK's own call against the harness's floor server (the
measure's `floor_url`, bench/floor.py: it discards uploads and serves zeros), through the SDK's
`sandbox_url` option on the shared sandbox: what the client library alone takes. A measure whose task names
another in `alternate` (a transfer, its floor) takes its samples in turn with that one's: floor, SDK call, SDK
call, floor, ... so the host's noise weighs on both alike; the other's `measure` event comes in its turn. No new
operation starts after `deadline_s` (counted once the SDK is imported); every sandbox created is killed. A
measure with `settle` (the embedded endpoint) first asks the endpoint's `/e2b-bench/pool` to settle as it
says, untimed, and reports how it was (`settle`) and how its creates were served, taken from the pool or made
on demand (`served`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from driver import Protocol, kill_sandboxes, one_line, plain_kill
from runkit import exit_on_sigterm, read_task

LANGUAGE = "python"
SUITE = "bench"
TRANSFER_PATH = "/tmp/e2b-bench-transfer.bin"
WARMUP = {"run_true": 2, "run_true_http": 2, **{f"{way}{twin}": 1 for way in ("upload", "download")
                                                 for twin in ("", "_http", "_floor")}}  # fmt: skip
CONNECT_END_STREAM = 0x02  # envelope flag of a Connect stream's last message (trailers or an error)
CELL_PORT = 49999  # the code interpreter's server in a sandbox of its template
CELL, CELL_RESULT = "6 * 7", "42"  # the first cell and the text of its main result


def describe(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}")


def ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def ready(started: float, created_ms: float, first: str = "first_run_ms") -> dict[str, Any]:
    """A successful time-to-interactive sample: first command (or cell: `first`) done now, the sandbox created after
    `created_ms`."""
    total = ms_since(started)
    return {"ok": True, "ms": total, "parts": {"create_ms": created_ms, first: round(total - created_ms, 3)}}


class Bench:
    """One task: its deadline, the sandboxes it created, the sandbox shared by the operation measures."""

    def __init__(self, task: dict[str, Any], protocol: Protocol) -> None:
        self.protocol = protocol
        self.run_id = str(task["run_id"])
        self._metadata = dict(task["metadata"])
        self.deadline = time.monotonic() + float(task.get("deadline_s", 60))
        self.sandbox_timeout_s = int(task.get("sandbox_timeout_s", 300))
        self.created: list[str] = []
        self.killed: set[str] = set()
        self.work: Any = None  # the sandbox run_true/upload/download use
        self.floors: dict[str, Any] = {}  # floor URL -> the shared sandbox as the SDK sees it there
        self.http: PlainHttp | None = None  # the client of the plain HTTP measures, made on first use
        self.http_work: HttpSandbox | None = None  # the sandbox run_true_http/upload_http/download_http use
        self.payload: bytes | None = None
        self.digest = ""

    @property
    def metadata(self) -> dict[str, str]:
        """The task's sandbox metadata: every sandbox of the run carries it."""
        return dict(self._metadata)

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def remaining_s(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def sample(self, measure: str, index: int, started_ms: float, outcome: dict[str, Any]) -> None:
        self.protocol.emit({"type": "sample", "measure": measure, "index": index, "start_ms": started_ms, **outcome})

    # --- the endpoint between measures ---------------------------------------------------------
    def settle(self, measure: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int] | None]:
        """Ask the embedded endpoint to settle as `measure["settle"]` says (bounded by the deadline): how it was,
        and the creates it had served so far."""
        asked = measure["settle"]
        within_s = min(float(asked["within_s"]), self.remaining_s())
        started = time.perf_counter()
        try:
            answer = self._plain().pool({**asked, "within_s": within_s})
        except Exception as exc:  # the measure is taken all the same, and says so
            return {"settled": False, "waited_ms": ms_since(started), "error": describe(exc)}, None
        settled = {"settled": bool(answer["settled"]), "waited_ms": ms_since(started), "prepared": answer["prepared"]}
        return settled, answer["served"]

    def served_since(self, before: dict[str, int] | None) -> dict[str, int] | None:
        """The creates the endpoint served since `before`: taken from its pool or made on demand."""
        if before is None:
            return None
        try:
            after = self._plain().pool()["served"]
        except Exception:
            return None
        return {way: int(after[way]) - int(before[way]) for way in ("prepared", "on_demand")}

    # --- time to interactive ------------------------------------------------------------------
    def tti_sequential(self, measure: dict[str, Any]) -> dict[str, Any]:
        from e2b import Sandbox

        def create() -> Any:
            sandbox = Sandbox.create(timeout=self.sandbox_timeout_s, metadata=self.metadata)
            self.created.append(sandbox.sandbox_id)
            return sandbox

        def first_command(sandbox: Any) -> object:
            return sandbox.commands.run("true")

        return self._sequential(measure, create, first_command, self._kill_timed, "Sandbox")

    def _sequential(
        self,
        measure: dict[str, Any],
        create: Callable[[], Any],
        first_command: Callable[[Any], object],
        kill: Callable[[Any], float | None],
        client: str,
        first: str = "first_run_ms",
    ) -> dict[str, Any]:
        """One sandbox at a time: create, first command (timed together), kill (timed apart)."""
        began, attempted = time.perf_counter(), 0
        for index in range(int(measure["count"])):
            if self.expired():
                break
            attempted += 1
            started_ms, started = ms_since(began), time.perf_counter()
            sandbox = None
            try:
                sandbox = create()
                created = ms_since(started)
                first_command(sandbox)
                outcome = ready(started, created, first)
            except Exception as exc:  # a failed sample is a result, not a crash
                outcome = {"ok": False, "ms": None, "error": describe(exc)}
            killed_ms = kill(sandbox) if sandbox is not None else None
            if killed_ms is not None:
                outcome.setdefault("parts", {})["kill_ms"] = killed_ms
            self.sample(measure["id"], index, started_ms, outcome)
        return {"attempted": attempted, "wall_ms": ms_since(began), "client": client}

    def tti_snapshot(self, measure: dict[str, Any]) -> dict[str, Any]:
        """Create from a snapshot of the shared sandbox (taken once, untimed) -> first command."""
        from e2b import Sandbox

        snapshot = self._work_sandbox().create_snapshot()

        def create() -> Any:
            sandbox = Sandbox.create(snapshot.snapshot_id, timeout=self.sandbox_timeout_s, metadata=self.metadata)
            self.created.append(sandbox.sandbox_id)
            return sandbox

        try:
            return self._sequential(measure, create, lambda s: s.commands.run("true"), self._kill_timed, "Sandbox")
        finally:
            Sandbox.delete_snapshot(snapshot.snapshot_id)

    def tti_fork(self, measure: dict[str, Any]) -> dict[str, Any]:
        """Fork the shared sandbox (one fork) -> first command in the fork."""
        source = self._work_sandbox()

        def create() -> Any:
            (fork,) = source.fork(timeout=self.sandbox_timeout_s)
            if isinstance(fork, Exception):
                raise fork
            self.created.append(fork.sandbox_id)
            return fork

        return self._sequential(measure, create, lambda s: s.commands.run("true"), self._kill_timed, "Sandbox")

    def tti_cell(self, measure: dict[str, Any]) -> dict[str, Any]:
        """Create from the code interpreter's template -> the first cell's result."""
        from e2b import Sandbox

        template = str(measure.get("template") or "code-interpreter-v1")

        def create() -> Any:
            sandbox = Sandbox.create(template, timeout=self.sandbox_timeout_s, metadata=self.metadata)
            self.created.append(sandbox.sandbox_id)
            return sandbox

        def first_cell(sandbox: Any) -> None:
            found = run_cell(self._plain().client, sandbox, CELL, self.remaining_s())
            if found != CELL_RESULT:
                raise AssertionError(f"the first cell {CELL!r} answered {found!r}, not {CELL_RESULT!r}")

        return self._sequential(measure, create, first_cell, self._kill_timed, "Sandbox", first="first_cell_ms")

    def _kill_timed(self, sandbox: Any) -> float | None:
        started = time.perf_counter()
        try:
            sandbox.kill()
        except Exception:
            return None  # left to the final clean-up
        self.killed.add(sandbox.sandbox_id)
        return ms_since(started)

    def tti_concurrent(self, measure: dict[str, Any]) -> dict[str, Any]:
        return asyncio.run(self._tti_concurrent(measure))

    async def _tti_concurrent(self, measure: dict[str, Any]) -> dict[str, Any]:
        """Staggered (one launch every `interval_ms`) or burst (all at once); all stay alive until the last is ready."""
        from e2b import AsyncSandbox

        interval_s = float(measure.get("interval_ms", 0)) / 1000 if measure["mode"] == "staggered" else 0.0
        began = time.perf_counter()
        alive: list[Any] = []

        async def one(index: int) -> None:
            started_ms, started = ms_since(began), time.perf_counter()
            try:
                sandbox = await AsyncSandbox.create(timeout=self.sandbox_timeout_s, metadata=self.metadata)
                self.created.append(sandbox.sandbox_id)
                alive.append(sandbox)
                created = ms_since(started)
                await sandbox.commands.run("true")
                outcome = ready(started, created)
            except Exception as exc:
                outcome = {"ok": False, "ms": None, "error": describe(exc)}
            self.sample(measure["id"], index, started_ms, outcome)

        launched = []
        for index in range(int(measure["count"])):
            if self.expired():
                break
            launched.append(asyncio.create_task(one(index)))
            if interval_s:
                await asyncio.sleep(interval_s)
        await asyncio.gather(*launched)
        wall_ms = ms_since(began)
        kills = await asyncio.gather(*(sandbox.kill() for sandbox in alive), return_exceptions=True)
        self.killed.update(s.sandbox_id for s, result in zip(alive, kills, strict=True) if result is True)
        return {"attempted": len(launched), "wall_ms": wall_ms, "client": "AsyncSandbox"}

    def tti_http(self, measure: dict[str, Any]) -> dict[str, Any]:
        """Create + Start as the SDK sends them, over one kept-alive plain `httpx` client."""
        http = self._plain()

        def kill(sandbox: HttpSandbox) -> float | None:
            started = time.perf_counter()
            if http.kill(sandbox.id) != "killed":
                return None  # left to the final clean-up
            self.killed.add(sandbox.id)
            return ms_since(started)

        return self._sequential(measure, self._http_create, lambda sandbox: http.start(sandbox, "true"), kill, "httpx")

    def _plain(self) -> PlainHttp:
        if self.http is None:
            self.http = PlainHttp()
        return self.http

    def _http_create(self) -> HttpSandbox:
        """A sandbox made with a plain POST, in the bookkeeping the clean-up and the footer use."""
        sandbox = self._plain().create(self.sandbox_timeout_s, self.metadata)
        self.created.append(sandbox.id)
        return sandbox

    # --- operations on a ready sandbox ----------------------------------------------------------
    def _work_sandbox(self) -> Any:
        if self.work is None:
            from e2b import Sandbox

            self.work = Sandbox.create(timeout=self.sandbox_timeout_s, metadata=self.metadata)
            self.created.append(self.work.sandbox_id)
        return self.work

    def _http_work_sandbox(self) -> HttpSandbox:
        if self.http_work is None:
            self.http_work = self._http_create()
        return self.http_work

    def _payload(self, size: int) -> bytes:
        if self.payload is None or len(self.payload) != size:
            self.payload = os.urandom(size)
            self.digest = hashlib.sha256(self.payload).hexdigest()
        return self.payload

    def _expect_digest(self, found: str, what: str) -> None:
        if found != self.digest:
            raise AssertionError(f"sha256 of the {what} is {found}, expected {self.digest}")

    def _repeat(
        self,
        measure: dict[str, Any],
        action: Callable[[], object],
        verify: Callable[[], None] = lambda: None,
        client: str = "Sandbox",
    ) -> dict[str, Any]:
        """Time `action` alone, then `verify` what it did (untimed): a failed check fails the sample.

        An action that returns a `Marks` has its moments reported as parts (ms since the action began)."""
        return self.repeat_arm(Arm(measure, action, verify, client))

    def repeat_arm(self, arm: Arm) -> dict[str, Any]:
        return self.alternate([arm])[0]

    def alternate(self, arms: list[Arm]) -> list[dict[str, Any]]:
        """`_repeat` of several measures (arms), their samples taken in turn (each index: every arm once, the first arm
        of the turn alternating), so what the host does meanwhile weighs on each alike: their ratio is what a
        floor's target judges. Each arm's warm-up comes first."""
        for arm in arms:
            for _ in range(WARMUP[arm.measure["kind"]]):
                arm.action()
                arm.verify()
        began = time.perf_counter()
        attempted = [0] * len(arms)
        for index in range(max(int(arm.measure["count"]) for arm in arms)):
            turn = list(enumerate(arms))
            for position, arm in turn if index % 2 == 0 else turn[::-1]:
                if index >= int(arm.measure["count"]) or self.expired():
                    continue
                attempted[position] += 1
                started_ms, started = ms_since(began), time.perf_counter()
                try:
                    marks = arm.action()
                    outcome: dict[str, Any] = {"ok": True, "ms": ms_since(started)}
                    if isinstance(marks, Marks):
                        outcome["parts"] = marks.parts(started)
                    arm.verify()
                except Exception as exc:
                    outcome = {"ok": False, "ms": None, "error": describe(exc)}
                self.sample(arm.measure["id"], index, started_ms, outcome)
        wall_ms = ms_since(began)
        events = []
        for position, arm in enumerate(arms):
            event = {"attempted": attempted[position], "wall_ms": wall_ms, "client": arm.client}
            event["warmup"] = WARMUP[arm.measure["kind"]]
            if len(arms) > 1:
                event["alternated_with"] = [other.measure["id"] for other in arms if other is not arm]
            events.append(event)
        return events

    def run_true(self, measure: dict[str, Any]) -> dict[str, Any]:
        sandbox = self._work_sandbox()
        return self._repeat(measure, lambda: sandbox.commands.run("true"))

    def run_true_http(self, measure: dict[str, Any]) -> dict[str, Any]:
        http, sandbox = self._plain(), self._http_work_sandbox()
        return self._repeat(measure, lambda: http.start(sandbox, "true"), client="httpx")

    def upload(self, measure: dict[str, Any]) -> Arm:
        sandbox, payload = self._work_sandbox(), self._payload(int(measure["bytes"]))

        def send() -> None:
            sandbox.files.write(TRANSFER_PATH, payload, request_timeout=self.remaining_s())

        def verify() -> None:
            self._expect_digest(sandbox.commands.run(f"sha256sum {TRANSFER_PATH}").stdout.split()[0], "uploaded file")

        return Arm(measure, send, verify)

    def upload_http(self, measure: dict[str, Any]) -> dict[str, Any]:
        http, sandbox = self._plain(), self._http_work_sandbox()
        payload = self._payload(int(measure["bytes"]))

        def send() -> Marks:
            return http.write(sandbox, TRANSFER_PATH, payload, self.remaining_s())

        def verify() -> None:
            self._expect_digest(http.start(sandbox, f"sha256sum {TRANSFER_PATH}").split()[0], "uploaded file")

        return self._repeat(measure, send, verify, client="httpx")

    def download(self, measure: dict[str, Any]) -> Arm:
        sandbox, payload = self._work_sandbox(), self._payload(int(measure["bytes"]))
        sandbox.files.write(TRANSFER_PATH, payload, request_timeout=self.remaining_s())
        received: list[bytes] = []

        def fetch() -> None:
            received[:] = [sandbox.files.read(TRANSFER_PATH, format="bytes", request_timeout=self.remaining_s())]

        def verify() -> None:
            self._expect_digest(hashlib.sha256(bytes(received[0])).hexdigest(), "downloaded bytes")

        return Arm(measure, fetch, verify)

    def _floor_sandbox(self, floor_url: str) -> Any:
        """The shared sandbox, connected through the SDK with the floor server as its envd URL."""
        if floor_url not in self.floors:
            from e2b import Sandbox

            self.floors[floor_url] = Sandbox.connect(self._work_sandbox().sandbox_id, sandbox_url=floor_url)
        return self.floors[floor_url]

    def upload_floor(self, measure: dict[str, Any]) -> Arm:
        sandbox, payload = self._floor_sandbox(measure["floor_url"]), self._payload(int(measure["bytes"]))

        def send() -> None:
            sandbox.files.write(TRANSFER_PATH, payload, request_timeout=self.remaining_s())

        def verify() -> None:  # the floor server counts what it discarded: at least the payload, in its multipart
            received = httpx.get(f"{measure['floor_url']}/floor/received", timeout=10).json()["bytes"]
            if received < len(payload):
                raise AssertionError(f"the floor server received {received} bytes, less than the {len(payload)} sent")

        return Arm(measure, send, verify)

    def download_floor(self, measure: dict[str, Any]) -> Arm:
        sandbox, size = self._floor_sandbox(measure["floor_url"]), int(measure["bytes"])
        received: list[bytes] = []

        def fetch() -> None:
            received[:] = [sandbox.files.read(TRANSFER_PATH, format="bytes", request_timeout=self.remaining_s())]

        def verify() -> None:
            if bytes(received[0]) != bytes(size):
                raise AssertionError(f"the floor download is not {size} zero bytes ({len(received[0])} bytes)")

        return Arm(measure, fetch, verify)

    def download_http(self, measure: dict[str, Any]) -> dict[str, Any]:
        http, sandbox = self._plain(), self._http_work_sandbox()
        http.write(sandbox, TRANSFER_PATH, self._payload(int(measure["bytes"])), self.remaining_s())
        chunks: list[bytes] = []

        def fetch() -> Marks:
            marks, chunks[:] = http.read(sandbox, TRANSFER_PATH, self.remaining_s())
            return marks

        def verify() -> None:
            self._expect_digest(hashlib.sha256(b"".join(chunks)).hexdigest(), "downloaded bytes")

        return self._repeat(measure, fetch, verify, client="httpx")

    # --- clean-up --------------------------------------------------------------------------------
    def cleanup(self) -> dict[str, str]:
        """Kill every sandbox this task created and did not see killed; the plain HTTP ones with a plain DELETE."""
        report: dict[str, str] = {}
        if self.http is not None:
            for sandbox_id in self.http.made:
                if sandbox_id not in self.killed:
                    report[sandbox_id] = self.http.kill(sandbox_id)
                    self.killed.add(sandbox_id)
            self.http.close()
        return {**report, **kill_sandboxes(self.created, self.killed)}


@dataclass(frozen=True)
class Arm:
    """One measure's timed action, the check of what it did, and the client named in its measure event."""

    measure: dict[str, Any]
    action: Callable[[], object]
    verify: Callable[[], None]
    client: str = "Sandbox"


@dataclass(frozen=True)
class Marks:
    """Moments inside a timed action (perf_counter): when the answer's first byte arrived."""

    first_byte: float

    def parts(self, started: float) -> dict[str, float]:
        return {"first_byte_ms": round((self.first_byte - started) * 1000, 3)}


@dataclass(frozen=True)
class HttpSandbox:
    """A sandbox as the plain HTTP measures address it: what the SDK keeps from the create answer."""

    id: str
    envd_url: str
    token: str | None

    @property
    def headers(self) -> dict[str, str]:
        return {"E2b-Sandbox-Id": self.id, **({"X-Access-Token": self.token} if self.token else {})}


class PlainHttp:
    """The REST API and envd through one kept-alive `httpx` client and no SDK: the reference measures.

    Each call sends what the SDK sends for the same operation, so the difference in time is the SDK's own.
    """

    def __init__(self) -> None:
        self.api_url = os.environ.get("E2B_API_URL") or f"https://api.{os.environ.get('E2B_DOMAIN', 'e2b.app')}"
        self.api_headers = {"X-API-KEY": os.environ.get("E2B_API_KEY", "")}
        self.client = httpx.Client(timeout=60)
        self.made: list[str] = []  # sandboxes created, for the clean-up to kill the same way

    def close(self) -> None:
        self.client.close()

    def create(self, timeout_s: int, metadata: dict[str, str]) -> HttpSandbox:
        body = {"templateID": "base", "timeout": timeout_s, "metadata": metadata}
        made = self.client.post(f"{self.api_url}/v2/sandboxes", json=body, headers=self.api_headers)
        made.raise_for_status()
        answer = made.json()
        self.made.append(str(answer["sandboxID"]))
        return HttpSandbox(str(answer["sandboxID"]), _envd_url(answer), answer.get("envdAccessToken"))

    def pool(self, settle: dict[str, Any] | None = None) -> dict[str, Any]:
        """The embedded endpoint's pool (`/e2b-bench/pool`, not an E2B route); with `settle`, once it settled so."""
        url = f"{self.api_url}/e2b-bench/pool"
        if settle is None:
            answer = self.client.get(url, headers=self.api_headers)
        else:
            answer = self.client.post(url, json=settle, headers=self.api_headers, timeout=settle["within_s"] + 30)
        if not answer.is_success:  # what the endpoint said, not only the status
            raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:300]}")
        return dict(answer.json())

    def kill(self, sandbox_id: str) -> str:
        """What happened, in the footer's words: `killed`, `already gone` or the error."""
        return plain_kill(self.client, f"{self.api_url}/sandboxes/{sandbox_id}", self.api_headers)

    def start(self, sandbox: HttpSandbox, command: str) -> str:
        """`commands.run(command)` as the SDK sends it: a Connect server stream, read to its end; its stdout."""
        body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}, "stdin": False}).encode()
        headers = {**sandbox.headers, "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        answer = self.client.post(f"{sandbox.envd_url}/process.Process/Start", headers=headers,
                                  content=b"\0" + len(body).to_bytes(4, "big") + body)  # fmt: skip
        answer.raise_for_status()
        return _process_stdout(answer.content)

    def write(self, sandbox: HttpSandbox, path: str, data: bytes, timeout_s: float) -> Marks:
        """`files.write` as the SDK sends it by default (and any envd takes it): one multipart `file` part."""
        with self.client.stream("POST", f"{sandbox.envd_url}/files", params={"path": path, "username": "user"},
                                files={"file": (path, data, "application/octet-stream")}, headers=sandbox.headers,
                                timeout=timeout_s) as answer:  # fmt: skip
            marks = Marks(time.perf_counter())
            answer.read()
            answer.raise_for_status()
        return marks

    def read(self, sandbox: HttpSandbox, path: str, timeout_s: float) -> tuple[Marks, list[bytes]]:
        """`files.read`, the body read as a stream: the chunks as they arrived."""
        with self.client.stream("GET", f"{sandbox.envd_url}/files", params={"path": path, "username": "user"},
                                headers=sandbox.headers, timeout=timeout_s) as answer:  # fmt: skip
            answer.raise_for_status()
            chunks = answer.iter_bytes()
            first = next(chunks, b"")
            marks = Marks(time.perf_counter())
            return marks, [first, *chunks]


def run_cell(client: httpx.Client, sandbox: Any, code: str, timeout_s: float) -> str | None:
    """Run `code` as the code-interpreter SDK does (`POST /execute` to the sandbox's port 49999, JSON lines read to
    `end_of_execution`): the main result's text; a cell's error is raised."""
    configured = os.environ.get("E2B_SANDBOX_URL")
    if configured:
        url = configured.rstrip("/")
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(CELL_PORT)}
    else:
        url, headers = f"https://{sandbox.get_host(CELL_PORT)}", {}
    token = getattr(sandbox, "_envd_access_token", None)
    if token:
        headers["X-Access-Token"] = token
    traffic = getattr(sandbox, "traffic_access_token", None)
    if traffic:
        headers["E2B-Traffic-Access-Token"] = traffic
    main, ended = None, False
    with client.stream("POST", f"{url}/execute", json={"code": code}, headers=headers, timeout=timeout_s) as answer:
        if not answer.is_success:
            raise RuntimeError(f"POST /execute: HTTP {answer.status_code}: {answer.read()[:300]!r}")
        for line in answer.iter_lines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "error":
                raise AssertionError(f"the cell failed: {event.get('name')}: {event.get('value')}")
            if event.get("type") == "result" and event.get("is_main_result"):
                main = event.get("text")
            ended = ended or event.get("type") == "end_of_execution"
    if not ended:
        raise AssertionError("the cell's answer ended without end_of_execution")
    return main


def _envd_url(created: dict[str, Any]) -> str:
    configured = os.environ.get("E2B_SANDBOX_URL")
    if configured:
        return configured.rstrip("/")
    domain = created.get("domain") or os.environ.get("E2B_DOMAIN") or "e2b.app"
    return f"https://49983-{created['sandboxID']}.{domain}"


def _connect_messages(stream: bytes) -> Iterator[dict[str, Any]]:
    """The JSON messages of a Connect stream body: each behind a flag byte and a big-endian uint32 length.

    The end-of-stream message carries the RPC's error, if any: raised here, as the SDK does.
    """
    offset = 0
    while offset < len(stream):
        if offset + 5 > len(stream):
            raise AssertionError(f"Connect stream cut inside an envelope header: {stream[offset:]!r}")
        flags, size = stream[offset], int.from_bytes(stream[offset + 1 : offset + 5], "big")
        message = json.loads(stream[offset + 5 : offset + 5 + size] or b"{}")
        offset += 5 + size
        if flags & CONNECT_END_STREAM:
            if message.get("error"):
                raise AssertionError(f"Start stream ended with an error: {message['error']}")
            return
        yield message


def _process_stdout(stream: bytes) -> str:
    """The stdout of a Start stream (data events carry it base64-encoded); it must reach its end event."""
    stdout: list[bytes] = []
    end: dict[str, Any] | None = None
    for message in _connect_messages(stream):
        event = message.get("event") or {}
        if "data" in event:
            stdout.append(base64.b64decode(event["data"].get("stdout", "")))
        end = event.get("end", end)
    if end is None:
        raise AssertionError(f"Start stream has no end event: {stream[-300:]!r}")
    if end.get("exitCode", 0):  # proto3 JSON leaves a zero exit code out
        raise AssertionError(f"the command exited with {end['exitCode']}: {end}")
    return b"".join(stdout).decode()


def main() -> int:
    exit_on_sigterm()  # a harness that stops the run sends SIGTERM first: unwind so cleanup() runs
    protocol = Protocol()
    task = read_task(protocol)
    version = importlib.metadata.version("e2b")
    protocol.hello(task.get("runner") or f"py-e2b-{version}", {"e2b": version}, LANGUAGE)
    if task.get("suite") != SUITE:
        protocol.footer(False, reason=f"unknown suite {task.get('suite')}")
        return 2
    with contextlib.suppress(ImportError):  # missing, each measure says so
        importlib.import_module("e2b")  # before the clock: the wall-clock limit bounds the measures, not the import
    bench = Bench(task, protocol)
    arms: dict[str, Callable[[dict[str, Any]], Arm]] = {
        "upload": bench.upload,
        "download": bench.download,
        "upload_floor": bench.upload_floor,
        "download_floor": bench.download_floor,
    }
    measures = task.get("measures") or []
    by_id = {measure["id"]: measure for measure in measures}
    alternated: dict[str, dict[str, Any]] = {}  # a measure taken in turn with an earlier one: its event, kept

    def taken(measure: dict[str, Any]) -> dict[str, Any]:
        """A measure's event: taken in turn with the measure it names in `alternate`, if planned (whose event is
        kept until its turn in the plan), else alone."""
        partner = by_id.get(measure.get("alternate", ""))
        if partner is None or partner["kind"] not in arms:
            return bench.repeat_arm(arms[measure["kind"]](measure))
        own, other = bench.alternate([arms[partner["kind"]](partner), arms[measure["kind"]](measure)])[::-1]
        alternated[partner["id"]] = other
        return own

    kinds: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "tti": lambda m: bench.tti_sequential(m) if m.get("mode") == "sequential" else bench.tti_concurrent(m),
        "tti_http": bench.tti_http,
        "run_true": bench.run_true,
        "run_true_http": bench.run_true_http,
        **{kind: taken for kind in arms},
        "upload_http": bench.upload_http,
        "download_http": bench.download_http,
        "tti_snapshot": bench.tti_snapshot,
        "tti_fork": bench.tti_fork,
        "tti_cell": bench.tti_cell,
    }
    cleaned: dict[str, str] = {}
    try:
        for measure in measures:
            event: dict[str, Any] = {"type": "measure", "id": measure["id"], "planned": int(measure["count"])}
            if measure["id"] in alternated:  # taken already, in turn with the measure that named it
                protocol.emit({**event, **alternated.pop(measure["id"])})
                continue
            if measure["kind"] not in kinds:
                event.update(attempted=0, error=f"this runner has no measure of kind {measure['kind']}")
            elif bench.expired():
                event.update(attempted=0, stopped="deadline")
            else:
                served = None
                if "settle" in measure:
                    event["settle"], served = bench.settle(measure)
                try:
                    event.update(kinds[measure["kind"]](measure))
                except Exception as exc:  # e.g. the shared sandbox could not be created
                    event.update(attempted=event.get("attempted", 0), error=describe(exc))
                if "settle" in measure:
                    event["served"] = bench.served_since(served)
                if bench.expired() and event.get("attempted", 0) < event["planned"]:
                    event["stopped"] = "deadline"
                for other in event.get("alternated_with", []):  # its partner's event: the same settle, served, end
                    partner_event = alternated[other]
                    partner_event.update({key: event[key] for key in ("settle", "served") if key in event})
                    if bench.expired() and partner_event.get("attempted", 0) < int(by_id[other]["count"]):
                        partner_event["stopped"] = "deadline"
            protocol.emit(event)
    finally:
        cleaned = bench.cleanup()
    protocol.footer(True, cleanup=cleaned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
