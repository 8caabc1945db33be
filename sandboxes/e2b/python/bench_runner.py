"""Python benchmark runner: times the unmodified `e2b` SDK against the endpoint it is pointed at.

Runs in a pinned environment holding only `e2b` (and its dependencies). Protocol (JSON lines,
docs/ARCHITECTURE.md): one task on stdin, then on stdout `hello`, one `sample` per timed operation as
it ends, one `measure` when a measure ends, and a `footer` naming what happened to every sandbox.

Task: {"suite": "bench", "run_id", "runner", "env", "deadline_s", "sandbox_timeout_s",
       "measures": [{"id", "kind", "mode", "count", "interval_ms", "bytes"}]}
Kinds: `tti` (create -> first `commands.run("true")` done; mode sequential, staggered or burst),
`tti_http` (the same create + Start with a plain HTTP client: what the SDK adds is the difference),
`run_true` (`commands.run("true")` on a ready sandbox), `upload` / `download` (`bytes` random bytes,
verified by SHA-256). No new operation starts after `deadline_s`; every sandbox created is killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from driver import RUN_TAG, Protocol, kill_sandboxes, one_line

LANGUAGE = "python"
SUITE = "bench"
TRANSFER_PATH = "/tmp/e2b-bench-transfer.bin"
WARMUP = {"run_true": 2, "upload": 1, "download": 1}


def describe(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}")


def ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def ready(started: float, created_ms: float) -> dict[str, Any]:
    """A successful time-to-interactive sample: first command done now, the sandbox created after `created_ms`."""
    total = ms_since(started)
    return {"ok": True, "ms": total, "parts": {"create_ms": created_ms, "first_run_ms": round(total - created_ms, 3)}}


class Bench:
    """One task: its deadline, the sandboxes it created, the sandbox shared by the operation measures."""

    def __init__(self, task: dict[str, Any], protocol: Protocol) -> None:
        self.protocol = protocol
        self.run_id = str(task.get("run_id") or "unset")
        self.deadline = time.monotonic() + float(task.get("deadline_s", 60))
        self.sandbox_timeout_s = int(task.get("sandbox_timeout_s", 300))
        self.created: list[str] = []
        self.killed: set[str] = set()
        self.work: Any = None  # the sandbox run_true/upload/download use
        self.payload: bytes | None = None
        self.digest = ""

    @property
    def metadata(self) -> dict[str, str]:
        return {RUN_TAG: self.run_id}

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def remaining_s(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def sample(self, measure: str, index: int, started_ms: float, outcome: dict[str, Any]) -> None:
        self.protocol.emit({"type": "sample", "measure": measure, "index": index, "start_ms": started_ms, **outcome})

    # --- time to interactive ------------------------------------------------------------------
    def tti_sequential(self, measure: dict[str, Any]) -> dict[str, Any]:
        from e2b import Sandbox

        began, attempted = time.perf_counter(), 0
        for index in range(int(measure["count"])):
            if self.expired():
                break
            attempted += 1
            started_ms, started = ms_since(began), time.perf_counter()
            sandbox = None
            try:
                sandbox = Sandbox.create(timeout=self.sandbox_timeout_s, metadata=self.metadata)
                self.created.append(sandbox.sandbox_id)
                created = ms_since(started)
                sandbox.commands.run("true")
                outcome = ready(started, created)
            except Exception as exc:  # a failed sample is a result, not a crash
                outcome = {"ok": False, "ms": None, "error": describe(exc)}
            if sandbox is not None:
                outcome.setdefault("parts", {})["kill_ms"] = self._kill_timed(sandbox)
            self.sample(measure["id"], index, started_ms, outcome)
        return {"attempted": attempted, "wall_ms": ms_since(began), "client": "Sandbox"}

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
        import httpx

        api_url = os.environ.get("E2B_API_URL") or f"https://api.{os.environ.get('E2B_DOMAIN', 'e2b.app')}"
        headers = {"X-API-KEY": os.environ.get("E2B_API_KEY", "")}
        body = {"templateID": "base", "timeout": self.sandbox_timeout_s, "metadata": self.metadata}
        began, attempted = time.perf_counter(), 0
        with httpx.Client(timeout=60) as client:
            for index in range(int(measure["count"])):
                if self.expired():
                    break
                attempted += 1
                started_ms, started = ms_since(began), time.perf_counter()
                sandbox_id = None
                try:
                    made = client.post(f"{api_url}/v2/sandboxes", json=body, headers=headers)
                    made.raise_for_status()
                    answer = made.json()
                    sandbox_id = str(answer["sandboxID"])
                    self.created.append(sandbox_id)
                    created = ms_since(started)
                    _start_true(client, _envd_url(answer), sandbox_id, answer.get("envdAccessToken"))
                    outcome = ready(started, created)
                except Exception as exc:
                    outcome = {"ok": False, "ms": None, "error": describe(exc)}
                if sandbox_id is not None:
                    kill_started = time.perf_counter()
                    if client.delete(f"{api_url}/sandboxes/{sandbox_id}", headers=headers).status_code < 300:
                        self.killed.add(sandbox_id)
                        outcome.setdefault("parts", {})["kill_ms"] = ms_since(kill_started)
                self.sample(measure["id"], index, started_ms, outcome)
        return {"attempted": attempted, "wall_ms": ms_since(began), "client": "httpx"}

    # --- operations on a ready sandbox ----------------------------------------------------------
    def _work_sandbox(self) -> Any:
        if self.work is None:
            from e2b import Sandbox

            self.work = Sandbox.create(timeout=self.sandbox_timeout_s, metadata=self.metadata)
            self.created.append(self.work.sandbox_id)
        return self.work

    def _payload(self, size: int) -> bytes:
        if self.payload is None or len(self.payload) != size:
            self.payload = os.urandom(size)
            self.digest = hashlib.sha256(self.payload).hexdigest()
        return self.payload

    def _repeat(
        self,
        measure: dict[str, Any],
        action: Callable[[], None],
        warmup: int,
        verify: Callable[[], None] = lambda: None,
    ) -> dict[str, Any]:
        """Time `action` alone, then `verify` what it did (untimed): a failed check fails the sample."""
        for _ in range(warmup):
            action()
            verify()
        began, attempted = time.perf_counter(), 0
        for index in range(int(measure["count"])):
            if self.expired():
                break
            attempted += 1
            started_ms, started = ms_since(began), time.perf_counter()
            try:
                action()
                outcome: dict[str, Any] = {"ok": True, "ms": ms_since(started)}
                verify()
            except Exception as exc:
                outcome = {"ok": False, "ms": None, "error": describe(exc)}
            self.sample(measure["id"], index, started_ms, outcome)
        return {"attempted": attempted, "wall_ms": ms_since(began), "client": "Sandbox", "warmup": warmup}

    def run_true(self, measure: dict[str, Any]) -> dict[str, Any]:
        sandbox = self._work_sandbox()
        return self._repeat(measure, lambda: sandbox.commands.run("true"), WARMUP["run_true"])

    def upload(self, measure: dict[str, Any]) -> dict[str, Any]:
        sandbox, payload = self._work_sandbox(), self._payload(int(measure["bytes"]))

        def send() -> None:
            sandbox.files.write(TRANSFER_PATH, payload, request_timeout=self.remaining_s())

        def verify() -> None:
            found = sandbox.commands.run(f"sha256sum {TRANSFER_PATH}").stdout.split()[0]
            if found != self.digest:
                raise AssertionError(f"sha256 of the uploaded file is {found}, expected {self.digest}")

        return self._repeat(measure, send, WARMUP["upload"], verify)

    def download(self, measure: dict[str, Any]) -> dict[str, Any]:
        sandbox, payload = self._work_sandbox(), self._payload(int(measure["bytes"]))
        sandbox.files.write(TRANSFER_PATH, payload, request_timeout=self.remaining_s())
        received: list[bytes] = []

        def fetch() -> None:
            received[:] = [sandbox.files.read(TRANSFER_PATH, format="bytes", request_timeout=self.remaining_s())]

        def verify() -> None:
            found = hashlib.sha256(bytes(received[0])).hexdigest()
            if found != self.digest:
                raise AssertionError(f"sha256 of the downloaded bytes is {found}, expected {self.digest}")

        return self._repeat(measure, fetch, WARMUP["download"], verify)

    # --- clean-up --------------------------------------------------------------------------------
    def cleanup(self) -> dict[str, str]:
        """Kill every sandbox this task created and did not see killed."""
        return kill_sandboxes(self.created, self.killed)


def _envd_url(created: dict[str, Any]) -> str:
    configured = os.environ.get("E2B_SANDBOX_URL")
    if configured:
        return configured.rstrip("/")
    domain = created.get("domain") or os.environ.get("E2B_DOMAIN") or "e2b.app"
    return f"https://49983-{created['sandboxID']}.{domain}"


def _start_true(client: Any, envd_url: str, sandbox_id: str, token: str | None) -> None:
    """`commands.run("true")` as the SDK sends it: a Connect server stream, read to its end event."""
    body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]}, "stdin": False}).encode()
    headers = {
        "E2b-Sandbox-Id": sandbox_id,
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        **({"X-Access-Token": token} if token else {}),
    }
    answer = client.post(f"{envd_url}/process.Process/Start", content=b"\0" + len(body).to_bytes(4, "big") + body,
                         headers=headers)  # fmt: skip
    answer.raise_for_status()
    if b'"end"' not in answer.content:
        raise AssertionError(f"Start stream has no end event: {answer.content[-300:]!r}")


def main() -> int:
    # A harness that stops the run sends SIGTERM first: unwind so cleanup() runs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    protocol = Protocol()
    task = json.loads(sys.stdin.read())
    os.environ.update({str(k): str(v) for k, v in (task.get("env") or {}).items()})
    version = importlib.metadata.version("e2b")
    runner = task.get("runner") or f"py-e2b-{version}"
    protocol.emit({"type": "hello", "runner": runner, "pins": {"e2b": version}, "language": LANGUAGE})
    if task.get("suite", SUITE) != SUITE:
        protocol.emit({"type": "footer", "completed": False, "reason": f"unknown suite {task.get('suite')}"})
        return 2
    bench = Bench(task, protocol)
    kinds: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "tti": lambda m: bench.tti_sequential(m) if m.get("mode") == "sequential" else bench.tti_concurrent(m),
        "tti_http": bench.tti_http,
        "run_true": bench.run_true,
        "upload": bench.upload,
        "download": bench.download,
    }
    cleaned: dict[str, str] = {}
    try:
        for measure in task.get("measures") or []:
            event: dict[str, Any] = {"type": "measure", "id": measure["id"], "planned": int(measure["count"])}
            if measure["kind"] not in kinds:
                event.update(attempted=0, error=f"this runner has no measure of kind {measure['kind']}")
            elif bench.expired():
                event.update(attempted=0, stopped="deadline")
            else:
                try:
                    event.update(kinds[measure["kind"]](measure))
                except Exception as exc:  # e.g. the shared sandbox could not be created
                    event.update(attempted=event.get("attempted", 0), error=describe(exc))
                if bench.expired() and event.get("attempted", 0) < event["planned"]:
                    event["stopped"] = "deadline"
            protocol.emit(event)
    finally:
        cleaned = bench.cleanup()
    protocol.emit({"type": "footer", "completed": True, "cleanup": cleaned})
    return 0


if __name__ == "__main__":
    sys.exit(main())
