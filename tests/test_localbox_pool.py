"""Sandboxes prepared ahead of demand: they yield the CPU while one waits in the pool, get the usual weight
when a create takes one, and are never handed out again once they ran (#25, #30)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox

from bench.endpoints import resolve
from bench.lifecycle import Lifecycle
from bench.localbox.box import Box, Cgroup
from bench.localbox.registry import SETTLE_MAX_S, SPARE_DISKS
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread
from bench.remote.slowness import scaled
from bench.soak.census import Holdings, count
from bench.soak.census import settled as census_settled

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


BURST = 12  # creates at once against a pool of POOLED: the pool serves the first, the rest are made on demand
POOLED = 4


def in_cgroups(pid: int, cgroup: Cgroup) -> bool:
    """Whether `pid` is in every directory of `cgroup`, read from the process's side (/proc/PID/cgroup)."""
    entries = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    joined = {path for _, _, path in entries if path != "/"}
    return bool(cgroup.paths) and all(any(str(d).endswith(path) for path in joined) for d in cgroup.paths)


def holdings_of(local: LocalServer) -> Callable[[], Holdings]:
    """What `local` holds on the host (its processes, netns, mounts, loop devices, cgroups), counted from the
    kernel's tables: other embedded endpoints of this test process and their fork-servers left out."""
    state_dir = local.registry.config.state_dir
    ours = f"/e2b-bench/{state_dir.name}/"
    zygote = local.registry.zygote.process.pid if local.registry.zygote else None

    def others(pid: int) -> bool:
        with contextlib.suppress(OSError):
            return pid != zygote and ours not in Path(f"/proc/{pid}/cgroup").read_text()  # our uplinks: in ours
        return True

    return lambda: count(os.getpid(), state_dir, prune=others)


def burst_of(local: LocalServer, count: int) -> list[tuple[AsyncSandbox, str]]:
    """`count` sandboxes created at once with the async SDK, each with the hostname its first command saw."""
    ep = local.endpoint
    keys = {"api_key": ep.api_key, "api_url": ep.api_url, "sandbox_url": ep.sandbox_url}

    async def one() -> tuple[AsyncSandbox, str]:
        sandbox = await AsyncSandbox.create(**keys)
        return sandbox, (await sandbox.commands.run("hostname")).stdout

    async def burst() -> list[tuple[AsyncSandbox, str]]:
        return await asyncio.gather(*(one() for _ in range(count)))

    return asyncio.run(burst())


def test_a_burst_past_the_pool_runs_each_sandbox_in_its_own_cgroups_and_leaves_nothing_behind() -> None:
    """Twelve creates at once: the four prepared sandboxes serve the first, the others are made on demand (their
    cgroups made off the event loop); each runs its first command in its own cgroups, and once all are killed and
    the pool is full again the server holds what it held before: processes, netns, mounts, loop devices, cgroups."""
    local = LocalServer(pool_size=POOLED)
    with in_thread(local):
        assert local.wait_prepared(scaled(60))
        assert pool(local, reserve=0)["spare_disks"] == SPARE_DISKS  # and the spare disks ready
        prepared = list(local.registry._pool)
        holdings = holdings_of(local)
        before = holdings()
        assert before.netns == POOLED and before.loop_devices == POOLED + SPARE_DISKS
        created = burst_of(local, BURST)
        boxes = [local.registry.get(sandbox.sandbox_id).box for sandbox, _ in created]  # type: ignore[union-attr]
        assert [hostname for _, hostname in created] == [f"{sandbox.sandbox_id}\n" for sandbox, _ in created]
        assert set(prepared) <= set(boxes)  # every prepared one served the burst
        assert len({box.ids.base for box in boxes if box.ids}) == BURST  # each its own uid range
        for box in boxes:
            pid1 = box._root_pid()
            assert pid1 is not None and in_cgroups(pid1, box.cgroup), box.name
            assert box.uplink is not None and in_cgroups(box.uplink.process.pid, box.uplink.cgroup), box.name

        async def kill_all() -> None:
            await asyncio.gather(*(sandbox.kill() for sandbox, _ in created))

        asyncio.run(kill_all())
        assert pool(local, reserve=0)["grown"] == 0  # grown by the creates made on demand: settled back
        after = census_settled(holdings, lambda: local.registry.idle, before)
        assert after == before
        assert not any(path.exists() for box in boxes for path in box.cgroup.paths)
        assert not any(box.dir.exists() for box in boxes) and not set(boxes) & set(local.registry._pool)


def test_wait_prepared_returns_once_the_pool_is_full_and_a_create_empties_it_until_the_refill() -> None:
    local = LocalServer(pool_size=2)
    with in_thread(local):
        assert local.wait_prepared(scaled(60))
        assert len(local.registry._pool) == 2 and all(box.running for box in local.registry._pool)
        ep = local.endpoint
        sandbox = Sandbox.create(api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url)
        assert local.wait_prepared(scaled(60))  # refilled: two prepared again, besides the one taken
        assert len(local.registry._pool) == 2 and local.registry.get(sandbox.sandbox_id) is not None
        sandbox.kill()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def held_while_preparing(local: LocalServer) -> Box:
    """A sandbox of the pool caught after its start and before it is pooled (its boot id, its warm-up), held
    there: its pid 1, the agent that answers the server, is stopped (SIGSTOP), as on a host too busy to run it."""
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        for box in list(local.registry._preparing):
            root = box._root_pid() if box.running else None
            if root is None:
                continue
            os.kill(root, signal.SIGSTOP)
            if box in local.registry._preparing:
                return box
            os.kill(root, signal.SIGCONT)  # pooled as it was stopped: another one is caught
        time.sleep(0.001)
    raise AssertionError("no sandbox was seen between its start and the pool")


def test_a_server_stopped_while_it_prepares_sandboxes_ends_them_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    """A shutdown cancels the pool's preparations: the sandboxes they booted end with them. Left running, each
    kept its disk busy, and the shutdown waited on the event loop for the disk to be let go (seconds, times the
    host's slowness), past the 30 s its thread is given on a busy host."""
    local = LocalServer(pool_size=4)
    state_dir = local.registry.config.state_dir
    others = set(threading.enumerate())  # other tests' servers may be running
    with in_thread(local):
        held = held_while_preparing(local)
        pids = [held.holder.pid, held._root_pid()]  # type: ignore[union-attr]
    gc.collect()  # a future whose failure nobody heard is reported as it is collected

    assert [t.name for t in threading.enumerate() if t not in others and t.name == "embedded endpoint"] == []
    assert [pid for pid in pids if pid is not None and alive(pid)] == []
    assert str(state_dir) not in Path("/proc/mounts").read_text()
    assert not state_dir.exists()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for m in said if "still holds" in m] == []  # no disk kept busy by a sandbox left running
    assert [m for m in said if "never retrieved" in m] == []  # e.g. the AgentGone of a start given up


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


# --- a benchmark's settle: /e2b-bench/pool ------------------------------------------------------------


def pool(local: LocalServer, **settle: object) -> dict:
    """`GET /e2b-bench/pool`, or with `settle`, its `POST` (bounded by the host's slowness): the answer."""
    ep = local.endpoint
    within_s = min(scaled(120), SETTLE_MAX_S)  # the server refuses (400) a settle asked to wait past its cap
    with httpx.Client(base_url=ep.api_url, headers={"X-API-KEY": ep.api_key}, timeout=within_s + 30) as client:
        if settle:
            answer = client.post("/e2b-bench/pool", json={"within_s": within_s, **settle})
        else:
            answer = client.get("/e2b-bench/pool")
    answer.raise_for_status()
    return dict(answer.json())


RESERVED = 6  # a burst the pool of POOLED_SMALL is settled for
POOLED_SMALL = 2


def test_a_burst_the_pool_was_settled_for_is_served_prepared_each_sandbox_isolated_and_nothing_is_left() -> None:
    """Settled with a reserve, the endpoint holds that many prepared beyond its pool (each with its own network
    namespace and disk, counted on the host); a burst of as many is served from them, each in its own cgroups and
    uid range; the reserve used, the pool keeps its own size; all killed, the server holds what it held before."""
    local = LocalServer(pool_size=POOLED_SMALL)
    with in_thread(local):
        holdings = holdings_of(local)
        assert pool(local, reserve=0)["settled"]
        before = holdings()
        assert (before.netns, before.loop_devices) == (POOLED_SMALL, POOLED_SMALL + SPARE_DISKS)

        answer = pool(local, reserve=RESERVED)

        assert {k: answer[k] for k in ("settled", "idle", "size", "reserved", "prepared")} == {
            "settled": True, "idle": True, "size": POOLED_SMALL, "reserved": RESERVED,
            "prepared": POOLED_SMALL + RESERVED,
        }  # fmt: skip
        held = holdings()
        assert (held.netns, held.loop_devices) == (POOLED_SMALL + RESERVED, POOLED_SMALL + RESERVED + SPARE_DISKS)
        prepared = set(local.registry._pool)
        created = burst_of(local, RESERVED)
        after = pool(local)
        assert (after["reserved"], after["served"]) == (0, {
            "prepared": answer["served"]["prepared"] + RESERVED, "on_demand": answer["served"]["on_demand"],
        })  # fmt: skip
        boxes = [local.registry.get(sandbox.sandbox_id).box for sandbox, _ in created]  # type: ignore[union-attr]
        assert set(boxes) <= prepared
        assert [hostname for _, hostname in created] == [f"{sandbox.sandbox_id}\n" for sandbox, _ in created]
        assert len({box.ids.base for box in boxes if box.ids}) == RESERVED  # each its own uid range
        for box in boxes:
            pid1 = box._root_pid()
            assert pid1 is not None and in_cgroups(pid1, box.cgroup), box.name
        assert pool(local, reserve=0)["prepared"] == POOLED_SMALL  # nothing prepared for the reserve again

        async def kill_all() -> None:
            await asyncio.gather(*(sandbox.kill() for sandbox, _ in created))

        asyncio.run(kill_all())
        assert pool(local, reserve=0)["settled"]
        assert census_settled(holdings, lambda: local.registry.idle, before) == before
        assert not any(path.exists() for box in boxes for path in box.cgroup.paths)
        assert not any(box.dir.exists() for box in boxes)


def test_a_pool_settled_to_none_makes_every_create_on_demand_until_a_settle_restores_it() -> None:
    local = LocalServer(pool_size=POOLED_SMALL)
    with in_thread(local):
        holdings = holdings_of(local)
        assert pool(local, reserve=0)["prepared"] == POOLED_SMALL
        pooled = list(local.registry._pool)

        emptied = pool(local, reserve=0, size=0)

        assert (emptied["settled"], emptied["size"], emptied["prepared"], emptied["spare_disks"]) == (True, 0, 0, 0)
        assert not any(box.dir.exists() for box in pooled)  # the prepared ones were ended, not kept aside
        assert (holdings().netns, holdings().loop_devices) == (0, 0)
        ep = local.endpoint
        made = [Sandbox.create(api_key=ep.api_key, api_url=ep.api_url, sandbox_url=ep.sandbox_url) for _ in range(2)]
        assert pool(local, reserve=0, size=0)["prepared"] == 0  # none prepared after them either
        assert pool(local)["served"] == {
            "prepared": emptied["served"]["prepared"], "on_demand": emptied["served"]["on_demand"] + 2,
        }  # fmt: skip
        boxes = [local.registry.get(sandbox.sandbox_id).box for sandbox in made]  # type: ignore[union-attr]
        for sandbox in made:
            assert sandbox.commands.run("hostname").stdout == f"{sandbox.sandbox_id}\n"
            sandbox.kill()  # answered before its files, disk and cgroups are gone: those go in the background

        restored = pool(local, reserve=0)

        assert (restored["settled"], restored["size"], restored["prepared"], restored["spare_disks"]) == (
            True, POOLED_SMALL, POOLED_SMALL, SPARE_DISKS,
        )  # fmt: skip
        assert not any(box.dir.exists() or any(path.exists() for path in box.cgroup.paths) for box in boxes)
        assert (holdings().netns, holdings().loop_devices) == (POOLED_SMALL, POOLED_SMALL + SPARE_DISKS)


GROWTH_MAX = 2  # the cap of the pool's growth in the test of it


def state_once(local: LocalServer, done: Callable[[dict], bool]) -> dict:
    """The pool's state (`GET /e2b-bench/pool`) once `done` holds of it (bounded by the host's slowness)."""
    deadline = time.monotonic() + scaled(60)
    while not done(state := pool(local)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return state


def test_creates_that_find_the_pool_empty_grow_it_up_to_its_cap_and_once_they_stop_it_shrinks_back() -> None:
    """Each create that finds the pool (of one) empty makes room for the next ones: the pool keeps one more
    prepared, never more than its cap beyond its size, however many more find it empty; held grown, it prepares
    them and then nothing more. Once no create has found it empty for the shrink time it keeps its size again:
    what it prepared beyond it is ended, and the server holds what it held before."""
    local = LocalServer(pool_size=1, pool_growth_max=GROWTH_MAX)
    local.registry.shrink_after_s = SETTLE_MAX_S  # held grown while it is looked at
    with in_thread(local):
        holdings = holdings_of(local)
        before = pool(local, reserve=0)
        assert (before["size"], before["grown"], before["prepared"], before["settled"]) == (1, 0, 1, True)
        held = holdings()
        created: list[tuple[AsyncSandbox, str]] = []
        on_demand = 0
        for _ in range(3):  # bursts of six until more creates than the cap found the pool empty (the first does)
            created += burst_of(local, 6)
            state = pool(local)
            on_demand = state["served"]["on_demand"] - before["served"]["on_demand"]
            assert state["grown"] == min(on_demand, GROWTH_MAX)  # one per create that found it empty
            if on_demand > GROWTH_MAX:
                break
        assert on_demand > GROWTH_MAX
        assert all(hostname == f"{sandbox.sandbox_id}\n" for sandbox, hostname in created)

        grown = state_once(local, lambda s: s["idle"])
        assert (grown["size"], grown["grown"], grown["prepared"]) == (1, GROWTH_MAX, 1 + GROWTH_MAX)
        pooled = list(local.registry._pool)

        async def kill_all() -> None:
            await asyncio.gather(*(sandbox.kill() for sandbox, _ in created))

        asyncio.run(kill_all())
        assert pool(local)["prepared"] == 1 + GROWTH_MAX  # kills do not shrink it: only the time without demand

        local.registry.shrink_after_s = 0.0
        shrunk = state_once(local, lambda s: s["grown"] == 0 and s["idle"])
        assert (shrunk["size"], shrunk["grown"], shrunk["prepared"]) == (1, 0, 1)
        ended = [box for box in pooled if box not in local.registry._pool]
        assert len(ended) == GROWTH_MAX and not any(box.dir.exists() for box in ended)
        assert census_settled(holdings, lambda: local.registry.idle, held) == held


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"reserve": -1}, "reserve must be a whole number of sandboxes from 0 to 1024, not -1"),
        ({"reserve": 2.5}, "reserve must be a whole number of sandboxes from 0 to 1024, not 2.5"),
        ({"size": 5000}, "size must be a whole number of sandboxes from 0 to 1024, not 5000"),
        ({"reserve": True}, "reserve must be a whole number of sandboxes from 0 to 1024, not True"),
        ({"within_s": 1e9}, "within_s must be a number of seconds from 0 to 600, not 1000000000.0"),
        ({"within_s": "soon"}, "within_s must be a number of seconds from 0 to 600, not 'soon'"),
        ({"reserved": 3}, "the pool takes reserve, size, within_s and warm, not 'reserved'"),
        ({"warm": {"base": 1}}, "warm maps a template with a start command (code-interpreter-v1) to a count"),
        (
            {"warm": ["code-interpreter-v1"]},
            "warm maps a template with a start command (code-interpreter-v1) to a count",
        ),
        ({"warm": {"code-interpreter-v1": 17}}, "warm code-interpreter-v1 must be a whole number from 0 to 16, not 17"),
    ],
)
def test_a_settle_the_pool_cannot_do_is_refused_in_one_sentence_and_changes_nothing(
    endpoint: LocalEndpoint, body: dict, error: str
) -> None:
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
        before = client.get("/e2b-bench/pool").json()
        refused = client.post("/e2b-bench/pool", json=body)
        after = client.get("/e2b-bench/pool").json()
    assert (refused.status_code, refused.json()) == (400, {"code": 400, "message": error})
    assert (after["size"], after["reserved"]) == (before["size"], before["reserved"])


def test_the_pool_route_answers_only_with_the_api_key(endpoint: LocalEndpoint) -> None:
    for headers in ({}, {"X-API-KEY": "e2b_" + "0" * 40}):
        refused = httpx.post(f"{endpoint.api_url}/e2b-bench/pool", json={"reserve": 50}, headers=headers)
        assert refused.status_code == 401


def test_sandboxes_a_settle_waits_for_are_prepared_at_the_usual_weight_though_one_waits_in_the_pool() -> None:
    """At the lowest weight a settle's preparations would starve behind anything else the host runs, while the
    client asking waits for them and nothing of the server needs the CPU more."""
    local = LocalServer(pool_size=1)
    with in_thread(local):
        assert pool(local, reserve=0)["prepared"] == 1
        answers: list[dict] = []
        settling = threading.Thread(target=lambda: answers.append(pool(local, reserve=3)))
        settling.start()
        held = held_while_preparing(local)
        try:
            (name, value), pooled = cpu_weight(held), len(local.registry._pool)
        finally:
            os.kill(held._root_pid(), signal.SIGCONT)  # type: ignore[arg-type]
        settling.join()

        assert (value, pooled) == (USUAL[name], 1)  # though one prepared waited in the pool
        assert [(answer["settled"], answer["prepared"]) for answer in answers] == [(True, 4)]
