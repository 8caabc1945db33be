"""Sandboxes prepared ahead of demand yield the CPU to those serving requests until a create takes one (#30)."""

from __future__ import annotations

import time
from pathlib import Path

from e2b import Sandbox

from bench.localbox.box import Box
from bench.localbox.server import LocalServer, in_thread
from bench.remote.slowness import scaled

BACKGROUND, USUAL = {"cpu.shares": 2, "cpu.weight": 1}, {"cpu.shares": 1024, "cpu.weight": 100}


def cpu_weight(box: Box) -> tuple[str, int]:
    """(file, value) of the CPU weight of the cgroup the box's pid 1 is in, found from pid 1's side."""
    pid1 = box._root_pid()
    assert pid1 is not None
    entries = [line.split(":", 2) for line in Path(f"/proc/{pid1}/cgroup").read_text().splitlines()]
    v1 = [(controllers, path) for _, controllers, path in entries if "cpu" in controllers.split(",")]
    if v1:  # one hierarchy per controller set, mounted under its name
        directory, name = Path("/sys/fs/cgroup") / v1[0][0] / v1[0][1].lstrip("/"), "cpu.shares"
    else:
        unified = next(path for _, controllers, path in entries if controllers == "")
        directory, name = Path("/sys/fs/cgroup") / unified.lstrip("/"), "cpu.weight"
    return name, int((directory / name).read_text())


def test_a_prepared_sandbox_yields_the_cpu_until_a_create_takes_it() -> None:
    local = LocalServer(pool_size=2)
    with in_thread(local):
        deadline = time.monotonic() + scaled(60)
        while len(local.registry._pool) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        prepared = list(local.registry._pool)
        assert len(prepared) == 2
        assert all(value == BACKGROUND[name] for name, value in map(cpu_weight, prepared))

        ep = local.endpoint
        sandbox = Sandbox.create(api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url)
        record = local.registry.get(sandbox.sandbox_id)
        assert record is not None and record.box is prepared[0]  # taken from the pool
        name, value = cpu_weight(record.box)
        assert value == USUAL[name]
        assert sandbox.commands.run("echo served").stdout == "served\n"
        sandbox.kill()
