"""A benchmark against the embedded endpoint leaves nothing of its sandboxes on the host: loop devices, mounts,
network namespaces, cgroups and processes are all gone when `e2b-bench bench` has ended (#30)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from run_cli import REPO

from bench.localbox.box import cgroup_roots, default_state_root
from bench.localbox.disk import loop_backings
from bench.localbox.registry import remove_orphan_cgroups
from bench.remote.slowness import scaled

KINDS = ("loop devices", "mounts", "cgroups", "processes", "network namespaces")


def traces(server: str) -> dict[str, int]:
    """What of the embedded servers named `server-<pid>-*` (state directory and cgroups) is on this host now."""
    state = f"{default_state_root()}/{server}-"
    loops = sum(backing.startswith(state) for backing in loop_backings().values())
    mounts = sum(line.split()[4].startswith(state) for line in Path("/proc/self/mountinfo").read_text().splitlines())
    cgroups = sum(cgroups_of(root, server) for root in cgroup_roots())
    processes, namespaces = 0, set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"/e2b-bench/{server}-" in (entry / "cgroup").read_text():
                processes += 1
                namespaces.add(os.readlink(entry / "ns" / "net"))
        except OSError:
            continue  # gone meanwhile
    return dict(zip(KINDS, (loops, mounts, cgroups, processes, len(namespaces)), strict=True))


def cgroups_of(root: Path, server: str) -> int:
    """The cgroup directories of the servers `server-*` under `root`, walked with errors ignored: they go meanwhile."""
    found = 0
    for top, directories, _ in os.walk(root):
        if top == str(root):
            directories[:] = [name for name in directories if name.startswith(f"{server}-")]
        found += len(directories)
    return found


def test_a_bench_leaves_no_loop_device_mount_netns_cgroup_or_process(tmp_path: Path) -> None:
    small = ["-n", "3", "--modes", "sequential,burst", "--transfer-mib", "1", "--runner", "py-e2b-2.63.0"]
    command = [sys.executable, "-m", "bench.cli", "bench", *small, "--no-report", "--results-dir", str(tmp_path)]
    bench = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = f"server-{bench.pid}"  # the embedded endpoint runs in the bench's own process
    before = traces(server)
    seen = dict.fromkeys(KINDS, 0)
    deadline = time.monotonic() + scaled(300)
    while bench.poll() is None and time.monotonic() < deadline:
        seen = {kind: max(seen[kind], count) for kind, count in traces(server).items()}
        time.sleep(0.05)
    output, _ = bench.communicate(timeout=max(deadline - time.monotonic(), 1))
    assert bench.returncode == 0, output
    assert all(seen.values()), f"the count missed what sandboxes hold while they run: {seen}"
    assert traces(server) == before == dict.fromkeys(KINDS, 0)


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_gone_servers_empty_cgroups_are_removed_and_nothing_else() -> None:
    dead, alive = f"server-{dead_pid()}-1", f"server-{os.getpid()}-99"
    made = [root / server / name for root in cgroup_roots() for server in (dead, alive) for name in ("a", "a.uplink")]
    for group in made:
        group.mkdir(parents=True)
    servers = [root / server for root in cgroup_roots() for server in (dead, alive)]
    busy = subprocess.Popen(["sleep", "60"])
    try:
        occupied = cgroup_roots()[0] / dead / "a"
        (occupied / "cgroup.procs").write_text(str(busy.pid))
        young = remove_orphan_cgroups()  # made just now: kept (another pid namespace's server may be making it)
        removed = remove_orphan_cgroups(min_age_s=0)
        left = [g for g in made + servers if g.exists()]

        assert not set(made + servers) & set(young)
        assert busy.poll() is None  # a process in a cgroup is never killed: its cgroup stays, and its server's
        assert set(removed) & set(made + servers) == {
            g for g in made + servers if dead in g.parts and g not in (occupied, occupied.parent)
        }
        assert set(left) == {occupied, occupied.parent} | {g for g in made + servers if alive in g.parts}
    finally:
        busy.kill()
        busy.wait()
        for group in made + servers:  # children before their server's directory
            if group.exists():
                group.rmdir()
