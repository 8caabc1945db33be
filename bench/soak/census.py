"""What an embedded endpoint holds on the host, counted from the kernel's own tables.

A `Holdings` is one count of an endpoint server's processes (its descendants), the network namespaces
they hold, the mounts and loop devices of its state directory, and its cgroups. Taken before and after
a run of that server's sandboxes, two equal counts mean the run left nothing behind. Everything is
found through what names the server (its pid, its state directory), never host-wide, so other servers
on the same host (other runs, other users' tests) do not enter the count.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..localbox.box import cgroup_roots
from ..localbox.disk import loop_backings, mounts_under
from ..remote.slowness import scaled

SETTLE_S = 30.0  # at most (on a quiet host), for teardown in the background to give back what a run held
SETTLE_POLL_S = 0.5


@dataclass(frozen=True)
class Holdings:
    """What one server holds on the host at one moment."""

    processes: int
    netns: int  # network namespaces of its processes other than its own
    mounts: int  # at or under its state directory
    loop_devices: int  # backed by a file under its state directory
    cgroups: int  # directories under its own cgroup directory, in every hierarchy

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def more_than(self, before: Holdings) -> dict[str, int]:
        """Each kind of which this count holds more than `before` -> how many more."""
        now, then = self.to_dict(), before.to_dict()
        return {kind: now[kind] - then[kind] for kind in now if now[kind] > then[kind]}


def children_map() -> dict[int, list[int]]:
    """Every process of the host's pid namespace -> its children, from /proc/PID/stat."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split(" ", 2)[1])  # the name may hold spaces and parentheses
            children[ppid].append(int(entry.name))
    return children


def descendants(root: int, prune: Callable[[int], bool] = lambda pid: False) -> list[int]:
    """The processes below `root` (not itself), leaving out the subtree of each child of `root` that `prune`
    accepts (asked of `root`'s own children only: a few, where the whole tree is hundreds)."""
    children = children_map()
    found, todo = [], [pid for pid in children.get(root, []) if not prune(pid)]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def started_from(module: str) -> Callable[[int], bool]:
    """A `prune` for the processes running `python -m module`."""

    def prune(pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return module.encode() in argv

    return prune


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or not ours to read
        return None


def _cgroup_dirs(name: str) -> int:
    """Cgroup directories below the server's own (`name`) in every hierarchy."""
    return sum(len(dirs) for root in cgroup_roots() for _, dirs, _ in os.walk(root / name))


def count(server_pid: int, state_dir: Path, prune: Callable[[int], bool] = lambda pid: False) -> Holdings:
    """What the server `server_pid`, whose sandboxes live under `state_dir`, holds on the host now.

    `prune`: processes below the server that are not its own (with their subtrees), e.g. the clients of a
    server that runs in the harness's process.
    """
    pids = descendants(server_pid, prune)
    own = _netns(server_pid)
    spaces = {space for space in map(_netns, pids) if space is not None and space != own}
    prefix = str(state_dir).rstrip("/") + "/"
    return Holdings(
        processes=len(pids),
        netns=len(spaces),
        mounts=len(mounts_under(state_dir)),
        loop_devices=sum(1 for backing in loop_backings().values() if backing.startswith(prefix)),
        cgroups=_cgroup_dirs(state_dir.name),
    )


def settled(
    take: Callable[[], Holdings],
    idle: Callable[[], bool],
    target: Holdings | None = None,
    limit_s: float = SETTLE_S,
) -> Holdings:
    """A count once the server is `idle` (nothing made or released in the background) and two counts in a
    row agree (and, given a `target`, neither is above it); at the limit (scaled by the host's slowness),
    the last count, which then shows what was left."""
    deadline = time.monotonic() + scaled(limit_s)
    last = take() if idle() else None
    while True:
        now = take() if idle() else None
        if now is not None and now == last and (target is None or not now.more_than(target)):
            return now
        if time.monotonic() > deadline:
            return now or last or take()
        last = now
        time.sleep(SETTLE_POLL_S)
