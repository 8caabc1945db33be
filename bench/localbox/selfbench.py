"""`e2b-bench serve --bench`: the embedded endpoint measured against baselines taken in the same run.

Absolute times on a shared machine mean little, so every figure is stated as a ratio to a local
baseline measured seconds apart: a bare `bash -c true` spawn, a loopback HTTP round trip, a disk copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
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

        def create_and_run() -> None:
            other = Sandbox.create(timeout=60)
            other.commands.run("true")
            other.kill()

        stats("create -> first command (incl. kill)", _samples(create_and_run, max(count // 2, 5), warmup=1))
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
        figures = measure(endpoint.env())
    spawn = figures["bare spawn (bash -c true)"]["p50_ms"]
    rtt = figures["loopback HTTP round trip"]["p50_ms"]
    copy = figures["20 MiB local disk copy"]["p50_ms"]
    print(f"{'measure':40} {'p50 ms':>9} {'p95 ms':>9}  ratio")
    for name, value in figures.items():
        ratio = ""
        if name.startswith("create"):
            ratio = f"{value['p50_ms'] / spawn:.1f}x bare spawn (target <= 10x)"
        elif name.startswith("commands.run"):
            ratio = f"{value['p50_ms'] / (spawn + rtt):.1f}x (spawn + round trip) (target <= 3x)"
        elif name.startswith("20 MiB up") or name.startswith("20 MiB down"):
            rate = FILE_BYTES / (value["p50_ms"] / 1000) / 1e6
            ratio = f"{rate:.0f} MB/s = {copy / value['p50_ms'] * 100:.0f}% of the disk copy rate"
        print(f"{name:40} {value['p50_ms']:9.2f} {value['p95_ms']:9.2f}  {ratio}")
    return 0
