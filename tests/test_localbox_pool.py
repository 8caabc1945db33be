"""Sandboxes prepared ahead of demand: they yield the CPU while one waits in the pool, get the usual weight
when a create takes one, and are never handed out again once they ran (#25, #30)."""

from __future__ import annotations

import time
from pathlib import Path

from e2b import Sandbox

from bench.endpoints import resolve
from bench.lifecycle import Lifecycle
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


def settled(local: LocalServer, pooled: int) -> list[Box]:
    """The pool once it holds `pooled` sandboxes and nothing is prepared or torn down any more."""
    deadline = time.monotonic() + scaled(60)
    while not (len(local.registry._pool) == pooled and local.registry.idle) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(local.registry._pool) == pooled and local.registry.idle
    return list(local.registry._pool)


def test_a_sandbox_prepared_while_another_waits_yields_the_cpu_one_prepared_for_an_empty_pool_does_not() -> None:
    """Prepared while the pool is empty, a sandbox is what the next create waits for: the usual weight (at
    the lowest, creates faster than idle CPU prepares would each make their own). Prepared while another
    waits in the pool, it yields. Taken, it has the usual weight."""
    local = LocalServer(pool_size=2)
    with in_thread(local):
        first = settled(local, 2)  # both prepared while the pool was empty
        assert all(value == USUAL[name] for name, value in map(cpu_weight, first))

        ep = local.endpoint
        sandbox = Sandbox.create(api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url)
        record = local.registry.get(sandbox.sandbox_id)
        assert record is not None and record.box is first[0]  # taken from the pool
        name, value = cpu_weight(record.box)
        assert value == USUAL[name]

        refilled = [box for box in settled(local, 2) if box not in first]
        assert len(refilled) == 1  # prepared while first[1] waited in the pool
        name, value = cpu_weight(refilled[0])
        assert value == BACKGROUND[name]
        name, value = cpu_weight(first[1])
        assert value == USUAL[name]
        assert sandbox.commands.run("echo served").stdout == "served\n"
        sandbox.kill()


def test_a_pooled_sandbox_is_never_handed_out_again_once_it_ran() -> None:
    local = LocalServer(pool_size=2)
    with in_thread(local):
        ep = local.endpoint
        keys = {"api_key": ep.api_key, "api_url": ep.api_url, "sandbox_url": ep.sandbox_url}
        settled(local, 2)
        used = Sandbox.create(**keys)
        box = local.registry.get(used.sandbox_id).box  # type: ignore[union-attr]
        used.commands.run("echo ran > /tmp/mark")
        used.kill()
        settled(local, 2)
        assert box not in local.registry._pool and not box.dir.exists()
        later = [Sandbox.create(**keys) for _ in range(3)]  # the whole pool, then one made on demand
        for sandbox in later:
            found = sandbox.commands.run("hostname; test -e /tmp/mark && echo marked || echo clean").stdout
            assert found == f"{sandbox.sandbox_id}\nclean\n"
            assert sandbox.sandbox_id != used.sandbox_id
            sandbox.kill()


def test_a_run_expecting_one_sandbox_has_one_prepared_and_makes_any_further_on_demand(tmp_path: Path) -> None:
    """A run of one case used to boot a pool of four and refill it after each create: five sandboxes set up
    and torn down for the one it took (#30)."""
    with Lifecycle(resolve("local"), results_dir=tmp_path) as life:
        life.serve(sandboxes=1)
        local = life.server
        assert local is not None
        (prepared,) = settled(local, 1)
        ep = local.endpoint
        keys = {"api_key": ep.api_key, "api_url": ep.api_url, "sandbox_url": ep.sandbox_url}

        taken, extra = Sandbox.create(**keys), Sandbox.create(**keys)

        assert settled(local, 0) == []  # nothing prepared after the one expected
        boxes = [local.registry.get(sandbox.sandbox_id).box for sandbox in (taken, extra)]  # type: ignore[union-attr]
        assert [box is prepared for box in boxes] == [True, False]
        for sandbox in (taken, extra):
            assert sandbox.commands.run("hostname").stdout == f"{sandbox.sandbox_id}\n"
            sandbox.kill()
        settled(local, 0)
        assert list(local.registry.boxes_dir.iterdir()) == []  # and none set up that nobody took
