"""`e2b-bench serve --bench`: the embedded endpoint measured against baselines taken in the same run.

Absolute times on a shared machine mean little, so every figure is stated as a ratio to a local
baseline measured seconds apart: a bare `bash -c true` spawn, a loopback HTTP round trip, a disk copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from .server import LocalServer, in_thread

FILE_BYTES = 20 << 20


def _samples(action: Callable[[], object], count: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        action()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _run_true(client: httpx.Client, sandbox_id: str, token: str) -> None:
    """`commands.run("true")` as the SDK sends it, over an already open connection."""
    body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]}, "stdin": False}).encode()
    headers = {
        "E2b-Sandbox-Id": sandbox_id,
        "X-Access-Token": token,
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
    }
    envelope = b"\0" + len(body).to_bytes(4, "big") + body
    answer = client.post("/process.Process/Start", content=envelope, headers=headers).content
    assert b'"end"' in answer, answer[-300:]


def measure(endpoint_env: dict[str, str], count: int = 30) -> dict[str, dict[str, float]]:
    os.environ.update(endpoint_env)
    from e2b import Sandbox

    figures: dict[str, dict[str, float]] = {}

    def stats(name: str, values: list[float]) -> None:
        figures[name] = {"p50_ms": statistics.median(values), "p95_ms": _p(values, 0.95), "n": len(values)}

    stats("bare spawn (bash -c true)", _samples(lambda: subprocess.run(["bash", "-c", "true"], check=True), count))
    sandbox = Sandbox.create(timeout=300)
    try:
        url = endpoint_env["E2B_SANDBOX_URL"]
        with httpx.Client() as client:
            headers = {"E2b-Sandbox-Id": sandbox.sandbox_id}
            stats("loopback HTTP round trip", _samples(lambda: client.get(f"{url}/health", headers=headers), count))
        stats('commands.run("true")', _samples(lambda: sandbox.commands.run("true"), count))

        tti = []
        for _ in range(max(count // 2, 5)):
            time.sleep(0.3)  # lets the server prepare its next sandbox, as between a user's creates
            started = time.perf_counter()
            other = Sandbox.create(timeout=60)
            other.commands.run("true")
            tti.append((time.perf_counter() - started) * 1000)
            other.kill()
        stats("create -> first command", tti)
        tti_raw = []
        key = endpoint_env["E2B_API_KEY"]
        with httpx.Client(base_url=url, headers={"X-API-KEY": key}) as raw:
            for _ in range(max(count // 2, 5)):
                time.sleep(0.3)
                started = time.perf_counter()
                made = raw.post("/v2/sandboxes", json={"templateID": "base", "timeout": 60}).json()
                _run_true(raw, made["sandboxID"], made["envdAccessToken"])
                tti_raw.append((time.perf_counter() - started) * 1000)
                raw.delete(f"/sandboxes/{made['sandboxID']}")
        stats("create -> first command (plain HTTP client)", tti_raw)
        payload = os.urandom(FILE_BYTES)
        digest = hashlib.sha256(payload).hexdigest()
        stats("20 MiB upload", _samples(lambda: sandbox.files.write("/tmp/blob", payload), 5, warmup=1))

        def download() -> None:
            assert hashlib.sha256(sandbox.files.read("/tmp/blob", format="bytes")).hexdigest() == digest

        stats("20 MiB download", _samples(download, 5, warmup=1))
    finally:
        sandbox.kill()
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "source"
        source.write_bytes(payload)
        stats("20 MiB local disk copy", _samples(lambda: shutil.copyfile(source, Path(scratch) / "copy"), 5))
    return figures


def run_selfbench(server: LocalServer) -> int:
    with in_thread(server) as endpoint:
        # The client runs in its own process, as a user's would: no GIL shared with the server.
        done = subprocess.run(
            [sys.executable, "-m", "bench.localbox.selfbench", json.dumps(endpoint.env())],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        print(f"e2b-bench serve --bench: the measuring client failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return 1
    figures = json.loads(done.stdout)
    spawn = figures["bare spawn (bash -c true)"]["p50_ms"]
    rtt = figures["loopback HTTP round trip"]["p50_ms"]
    copy = figures["20 MiB local disk copy"]["p50_ms"]
    print(f"{'measure':40} {'p50 ms':>9} {'p95 ms':>9}  ratio")
    for name, value in figures.items():
        ratio = ""
        if name.startswith("create"):  # both the SDK's and a plain client's
            ratio = f"{value['p50_ms'] / spawn:.1f}x bare spawn (target <= 10x)"
        elif name.startswith("commands.run"):
            ratio = f"{value['p50_ms'] / (spawn + rtt):.1f}x (spawn + round trip) (target <= 3x)"
        elif name.startswith("20 MiB up") or name.startswith("20 MiB down"):
            rate = FILE_BYTES / (value["p50_ms"] / 1000) / 1e6
            ratio = f"{rate:.0f} MB/s = {copy / value['p50_ms'] * 100:.0f}% of the disk copy rate"
        print(f"{name:40} {value['p50_ms']:9.2f} {value['p95_ms']:9.2f}  {ratio}")
    return 0


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
