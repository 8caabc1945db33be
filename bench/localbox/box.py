"""One isolated sandbox environment: the agent process, its namespaces, root and processes."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import fcntl
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from ..remote.slowness import scaled
from .agentlink import AgentError, AgentGone, AgentLink
from .disk import Disks, drop_unwritten, released, unmount
from .network import EgressRules, resolvers, uplink_release, uplinks_table

log = logging.getLogger("e2b-bench.localbox")
AGENT_PATH = Path(__file__).with_name("agent.py")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SIGNAL_NAMES: dict[int, str] = {
    signal.SIGKILL: "killed", signal.SIGTERM: "terminated", signal.SIGINT: "interrupt",
    signal.SIGHUP: "hangup", signal.SIGQUIT: "quit", signal.SIGABRT: "aborted",
    signal.SIGSEGV: "segmentation fault", signal.SIGPIPE: "broken pipe", signal.SIGBUS: "bus error",
    signal.SIGUSR1: "user defined signal 1", signal.SIGUSR2: "user defined signal 2",
    signal.SIGALRM: "alarm clock", signal.SIGFPE: "floating point exception", signal.SIGILL: "illegal instruction",
}  # fmt: skip
READ_CHUNK = 1 << 16
END_ON_EXIT_POLL_S = 0.01  # how often a command that ended early looks whether its sandbox has gone quiet
END_ON_EXIT_MAX_S = 60.0  # what still runs this long after the command's process exited is cut off
# What a quiet host needs, with margin; every wait below is scaled by the host's slowness (bench/remote/slowness.py).
START_S = 15.0  # a sandbox's agent and network up
WARM_S = 10.0  # one login shell
EXIT_S = 5.0  # a killed process (a sandbox's holder, its uplink) has exited and been seen to
CONNECT_S = 10.0  # a TCP connect inside the sandbox
EGRESS_S = 10.0  # one nftables transaction
T = TypeVar("T")
IDLE_STATES = frozenset("STtZXI")  # /proc states of a thread that waits (or is gone), not one that runs
# A create's blocking steps (its disk, cgroups, the fork-server's answer) and a teardown's (cgroups, unmount,
# files) have threads of their own, apart from each other and from the default executor: a create never
# queues behind a teardown, which waits on the kernel, nor behind a snapshot's copy or a template's build.
SETUP = ThreadPoolExecutor(max_workers=4, thread_name_prefix="e2b-bench-setup")
TEARDOWN = ThreadPoolExecutor(max_workers=4, thread_name_prefix="e2b-bench-teardown")


async def setup_step(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` on a SETUP thread, awaited to its end even by a caller cancelled meanwhile (the
    cancellation then goes on): a thread cannot be stopped, and what it makes after its caller gave up (a
    mounted disk, a fork-server's answer) would be made after the caller's clean-up, and stay."""
    work = asyncio.get_running_loop().run_in_executor(SETUP, function, *args)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # the cancellation is what the caller hears of
        raise


@dataclass(frozen=True)
class ExitStatus:
    """What envd reports in an end event, derived like Go's os.ProcessState."""

    exit_code: int
    exited: bool
    status: str
    error: str | None

    @classmethod
    def from_wait_status(cls, raw: int) -> ExitStatus:
        if os.WIFEXITED(raw):
            code = os.WEXITSTATUS(raw)
            text = f"exit status {code}"
            return cls(code, True, text, text if code else None)
        sig = os.WTERMSIG(raw)
        text = f"signal: {SIGNAL_NAMES.get(sig, f'signal {sig}')}"
        return cls(-1, False, text, text)


# A command's output one stream may hold unsent (its client not reading) before the server stops reading the
# command's pipes: the command then blocks on its writes, as under envd, whose fan-out to its streams waits for
# the slowest. Output no stream listens to is read and dropped, as envd drops it.
OUTPUT_HELD_MAX = 1 << 20


class OutputQueue(asyncio.Queue):
    """One stream's events of a command, counting the output bytes it holds; taking from it may let the
    command's paused pipes be read again."""

    def __init__(self, record: ProcessRecord) -> None:
        super().__init__()
        self.record = record
        self.held = 0

    def put_nowait(self, item: tuple) -> None:
        super().put_nowait(item)
        if item[0] == "data":
            self.held += len(item[2])

    def get_nowait(self) -> tuple:
        item = super().get_nowait()
        if item[0] == "data":
            self.held -= len(item[2])
            if self.held <= OUTPUT_HELD_MAX // 2:
                self.record.drained()
        return item


ENDED_KEPT_S = 30.0  # envd keeps an ended process's exit this long for a late Connect (terminatedRetentionTTL)


@dataclass
class ProcessRecord:
    """A process started through envd, with everyone currently listening to it."""

    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str
    tag: str | None
    pty: bool
    stdin_fd: int | None = None
    pty_fd: int | None = None
    outputs: dict[int, str] = field(default_factory=dict)  # open output fd -> stdout|stderr|pty
    exit: ExitStatus | None = None
    subscribers: list[asyncio.Queue] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    reaped: asyncio.Event = field(default_factory=asyncio.Event)  # the process is gone (waited for)
    input_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # input is written in the order it came
    input_waiters: set[asyncio.Future] = field(default_factory=set)  # writes waiting for the process to read
    done_callbacks: list[Callable[[], object]] = field(default_factory=list)
    paused: Callable[[], None] | None = None  # while its pipes are not read (a stream is full): resumes them

    def subscribe(self) -> asyncio.Queue:
        queue = OutputQueue(self)
        self.subscribers.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        with contextlib.suppress(ValueError):
            self.subscribers.remove(queue)
        self.drained()

    def publish(self, event: tuple) -> None:
        for queue in self.subscribers:
            queue.put_nowait(event)

    @property
    def full(self) -> bool:
        """A stream holds as much unsent output as it may: the command's pipes wait."""
        return any(isinstance(q, OutputQueue) and q.held >= OUTPUT_HELD_MAX for q in self.subscribers)

    def drained(self) -> None:
        if self.paused is not None and not self.full:
            resume, self.paused = self.paused, None
            resume()


# A sandbox's tasks (processes and threads: the kernel counts both). E2B's sandboxes are VMs whose own kernel bounds
# them by memory (a 512 MiB guest's threads-max is 4,096), and a fork bomb there spends its own kernel only; here
# every sandbox's forks and exits take the host kernel's locks, and 2,048 or more bombing tasks made another
# sandbox's `true` take 1-2.7 s on a 2-core host, 1,024 up to 1.2 s (once in nine), 512 at most 0.26 s (SECURITY.md).
# A real workload stays below it: a browser is a few hundred threads, a JVM, a Jupyter kernel or a parallel build on
# 2 vCPUs some tens to a hundred.
TASKS_MAX = 512


@dataclass(frozen=True)
class Limits:
    """What the template advertises, enforced by cgroup controllers (where the host mounts them) and, for
    the disk, by a file system of that size (where the host can attach loop devices: see disk.py)."""

    memory_mb: int = 512
    cpu_count: int = 2
    pids: int = TASKS_MAX
    disk_mb: int = 2048


@dataclass(frozen=True)
class BoxSettings:
    """How a box is isolated and how its commands behave (quirks included)."""

    internet: bool = True
    session_leader: bool = False  # a command leads its own session (setsid then forks)
    end_on_exit: bool = False  # report the end at process exit instead of at output EOF
    profile_lines: tuple[str, ...] = ()  # appended to the sandbox's login profile
    hidden_paths: tuple[str, ...] = ()  # template files removed from the sandbox's view (quirks)
    upload_truncates_first: bool = False  # an upload truncates before the chown (the extra_write_event quirk)
    root_home_of_user: bool = False  # root's commands get the default user's HOME (the root_home_of_user quirk)
    limits: Limits = field(default_factory=Limits)


def default_state_root() -> Path:
    return Path(tempfile.gettempdir()) / f"e2b-bench-localbox-{os.getuid()}"


def private_dir(path: Path) -> Path:
    """A directory only its owner (host root) can enter: nothing under it can be run, setuid or not, by
    another host user. One that exists already must be ours and not a link."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(errno.EPERM, "state directory is not a directory of this user", str(path))
    if stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)
    return path


ID_BASE, ID_COUNT, ID_RANGES = 100000, 65536, 4096


SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


@dataclass(frozen=True)
class SubordinateIds:
    """The host's subordinate id configuration (/etc/subuid, /etc/subgid: `name:first:count` lines) as it
    bears on sandboxes: ranges given to the server's user (by name or uid), and those given to anyone else."""

    own_uids: tuple[range, ...] = ()
    own_gids: tuple[range, ...] = ()
    others: tuple[range, ...] = ()

    @classmethod
    def read(cls, files: tuple[Path, Path] | None = None) -> SubordinateIds:
        files = files or SUBID_FILES
        owner = {str(os.getuid())}
        with contextlib.suppress(KeyError):
            owner.add(pwd.getpwuid(os.getuid()).pw_name)
        own: list[list[range]] = [[], []]
        others: list[range] = []
        for kind, path in enumerate(files):
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines():
                    name, _, rest = line.strip().partition(":")
                    first, _, count = rest.partition(":")
                    if name.startswith("#") or not (first.isdigit() and count.isdigit()):
                        continue
                    ids = range(int(first), int(first) + int(count))
                    (own[kind] if name in owner else others).append(ids)
        return cls(tuple(own[0]), tuple(own[1]), tuple(others))

    def slots(self) -> list[int]:
        """The n of each range ID_BASE + n * ID_COUNT a sandbox may have: inside the server user's uid and
        gid ranges where it has any (both files), else clear of every range configured for someone else."""
        every = set(range(ID_RANGES))
        if self.own_uids or self.own_gids:
            inside = [set().union(*(_slots(r, within=True) for r in mine)) for mine in (self.own_uids, self.own_gids)]
            return sorted(every & inside[0] & inside[1])
        return sorted(every.difference(*(_slots(r, within=False) for r in self.others)))


def _slots(ids: range, within: bool) -> range:
    """The n whose range ID_BASE + n * ID_COUNT lies within `ids`, or (within=False) overlaps it."""
    if within:
        return range(-(-(ids.start - ID_BASE) // ID_COUNT), (ids.stop - ID_BASE) // ID_COUNT)
    return range((ids.start - ID_BASE) // ID_COUNT, -(-(ids.stop - ID_BASE) // ID_COUNT))


class IdRange:
    """A sandbox's host uids and gids: 65,536 of them from ID_BASE + n * ID_COUNT (the usual /etc/subuid
    grid), among those the host's subordinate id configuration allows, n held through a lock file for the
    sandbox's life, so no two sandboxes of any server on this host share an id."""

    # Per lock directory, the lowest slot this server may find free: every slot below it is held by one of
    # its sandboxes or was free and then taken by another server. A create starts looking there, not at slot
    # 0 (one lock file tried per running sandbox: a burst of n creates tried n^2/2).
    _scan_from: dict[Path, int] = {}

    def __init__(self, base: int, lock_fd: int, locks: Path | None = None) -> None:
        self.base, self.count, self._lock_fd, self._locks = base, ID_COUNT, lock_fd, locks

    @classmethod
    def take(cls, locks: Path, subordinate: SubordinateIds | None = None) -> IdRange:
        private_dir(locks)
        allowed = subordinate.slots() if subordinate else _configured_slots()
        if not allowed:
            raise AgentError(
                f"/etc/subuid and /etc/subgid leave sandboxes no whole range of {ID_COUNT} ids at "
                f"{ID_BASE} + n * {ID_COUNT} (give the server's user one, e.g. root:{ID_BASE}:{ID_COUNT * 64})",
                errno.EAGAIN,
            )
        start = bisect.bisect_left(allowed, cls._scan_from.get(locks, 0))
        for n in allowed[start:] + allowed[:start]:
            fd = os.open(locks / str(n), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            cls._scan_from[locks] = n + 1
            return cls(ID_BASE + n * ID_COUNT, fd, locks)
        raise AgentError(f"all {len(allowed)} uid ranges are taken by running sandboxes", errno.EAGAIN)

    def release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
            if self._locks is not None:
                n = (self.base - ID_BASE) // ID_COUNT
                self._scan_from[self._locks] = min(n, self._scan_from.get(self._locks, n))


_slots_read: tuple[tuple, list[int]] | None = None  # (what the files were, their slots)


def _configured_slots() -> list[int]:
    """SubordinateIds.read().slots() of SUBID_FILES, read again only when one of the files changed."""
    global _slots_read
    stamp: list[object] = []
    for path in SUBID_FILES:
        try:
            st = path.stat()
            stamp.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stamp.append((str(path), None))
    if _slots_read is None or _slots_read[0] != tuple(stamp):
        _slots_read = (tuple(stamp), SubordinateIds.read().slots())
    return _slots_read[1]


V1_CONTROLLERS = ("freezer", "memory", "pids", "cpu", "cpuacct")
V2_CONTROLLERS = "+memory +pids +cpu"
# Each bound a sandbox's cgroups carry, and the files that set it (cgroup v2's, then v1's): one that none of its
# files set is named once in the server's log with the reason (see `Cgroup.unbounded`).
BOUND_FILES = {
    "memory": ("memory.max", "memory.limit_in_bytes"),
    "tasks": ("pids.max",),
    "cpu quota": ("cpu.max", "cpu.cfs_quota_us"),
    "cpu weight": ("cpu.weight", "cpu.shares"),
}
BOUND_CONTROLLERS = {"memory": "memory", "tasks": "pids", "cpu quota": "cpu", "cpu weight": "cpu"}
_reported_unbounded: set[str] = set()  # bounds this process has logged as not applied


def cgroup_roots() -> list[Path]:
    """Where this project's cgroups live on this host: one per v1 hierarchy, or the unified one."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base / "e2b-bench"]
    return [base / c / "e2b-bench" for c in V1_CONTROLLERS if (base / c).is_dir()]


class Cgroup:
    """The sandbox's cgroups: its limits, its processes, freezing (SIGSTOP when there is no freezer).

    Made in two steps: the object on the event loop (no I/O), the directories by `create`, a setup thread's
    work (a cgroup's mkdir and limits take the kernel's cgroup lock, which a busy host holds for milliseconds)."""

    def __init__(self, name: str, limits: Limits, v1_controllers: tuple[str, ...] = V1_CONTROLLERS) -> None:
        self.name, self.limits, self._v1_controllers = name, limits, v1_controllers
        self.paths: list[Path] = []
        self.controllers: dict[str, Path] = {}  # v1: hierarchy name -> this sandbox's directory in it
        self.v2 = False
        self._freezer: Path | None = None
        self._background = False  # made with the usual weight
        self._weight_files: list[tuple[str, str, str]] = []  # (file, lowest, usual): found by `create`
        self._weight_lock = threading.Lock()  # `background` (event loop) and `create` (a thread) agree on it
        self.unbounded: dict[str, str] = {}  # bound -> why this host does not apply it (found by `create`)

    def create(self) -> Cgroup:
        """Make the directories (one per v1 hierarchy, or one v2 directory) with the limits and the weight
        asked for so far."""
        self.v2 = (Path("/sys/fs/cgroup") / "cgroup.controllers").exists()
        paths, controllers = [], {}
        for root in cgroup_roots():
            if not self.v2 and root.parent.name not in self._v1_controllers:
                continue
            with contextlib.suppress(OSError):
                path = root / self.name
                if self.v2:
                    _enable_v2_controllers(path)
                path.mkdir(parents=True, exist_ok=True)
                paths.append(path)
                controllers[root.parent.name] = path
        applied = self._limit(paths, self.limits)
        weights = [
            (str(path / name), lowest, usual)
            for path in paths
            for name, lowest, usual in (("cpu.shares", "2", "1024"), ("cpu.weight", "1", "100"))
            if (path / name).exists()
        ]
        applied.update(Path(file).name for file, _, _ in weights)
        self.unbounded = _unbounded(applied, self.v2, self._v1_controllers)
        with self._weight_lock:
            self.paths, self.controllers, self._weight_files = paths, controllers, weights
            self._freezer = next((p for p in paths if self.v2 or "freezer" in p.parts), None)
            if self._background:
                self._weigh(True)
        return self

    @staticmethod
    def _limit(paths: list[Path], limits: Limits) -> set[str]:
        """Write the limits each directory has files for; the names of the files written."""
        memory, period = limits.memory_mb * 1024 * 1024, 100_000
        values = {
            "memory.max": memory, "pids.max": limits.pids, "cpu.max": f"{limits.cpu_count * period} {period}",
            "memory.swap.max": 0, "memory.limit_in_bytes": memory, "cpu.cfs_period_us": period,
            "cpu.cfs_quota_us": limits.cpu_count * period,
        }  # fmt: skip
        written = set()
        for path in paths:
            for name, value in values.items():
                if (path / name).exists():
                    with contextlib.suppress(OSError):
                        (path / name).write_text(str(value))
                        written.add(name)
        return written

    def background(self, on: bool) -> None:
        """Whether this sandbox yields the CPU to the others (a relative weight, not a limit; the same
        weight again writes nothing; before `create`, it is what `create` sets)."""
        with self._weight_lock:
            if on != self._background:
                self._background = on
                self._weigh(on)

    def _weigh(self, on: bool) -> None:
        # The files were found by `create`: a create taking a prepared sandbox writes one file on the event
        # loop, where looking for them (a stat per hierarchy and name, each waiting on the kernel's cgroup
        # locks while other sandboxes' cgroups are made and removed) cost a create 0.1-0.3 ms on this host.
        for file, lowest, usual in self._weight_files:
            with contextlib.suppress(OSError), open(file, "w") as f:
                f.write(lowest if on else usual)

    def join(self, pid: int) -> None:
        """Move a process (of the host: not one of the sandbox's, which join as they start) into these cgroups."""
        for path in self.procs_files:
            with open(path, "w") as f:
                f.write(str(pid))

    @property
    def procs_files(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in self.paths]

    def pids(self, fallback_root: int | None) -> list[int]:
        if self._freezer:
            with contextlib.suppress(OSError):
                return [int(p) for p in (self._freezer / "cgroup.procs").read_text().split()]
        return _namespace_pids(fallback_root) if fallback_root else []

    async def freeze(self, frozen: bool, fallback_root: int | None) -> None:
        if self._freezer:
            state = self._freezer / ("cgroup.freeze" if self.v2 else "freezer.state")
            want = ("1" if frozen else "0") if self.v2 else ("FROZEN" if frozen else "THAWED")
            state.write_text(want)
            for _ in range(200):
                current = (self._freezer / "cgroup.events").read_text() if self.v2 else state.read_text().strip()
                if (f"frozen {want}" in current) if self.v2 else current == want:
                    return
                await asyncio.sleep(0.005)
            return
        sig = signal.SIGSTOP if frozen else signal.SIGCONT
        for pid in self.pids(fallback_root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def counters(self) -> tuple[float, int] | None:
        """(cpu seconds, resident bytes) of the whole sandbox from its cgroup: a few reads, whatever it runs."""
        try:
            if self.v2 and self.paths:
                cpu = _keyed(self.paths[0] / "cpu.stat")["usage_usec"] / 1e6
                memory = _keyed(self.paths[0] / "memory.stat")
                return cpu, memory["anon"] + memory["file_mapped"]
            cpu = int((self.controllers["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
            memory = _keyed(self.controllers["memory"] / "memory.stat")
            return cpu, memory["total_rss"] + memory["total_mapped_file"]
        except (OSError, KeyError, ValueError, IndexError):
            return None

    def remove(self) -> bool:
        """True once every cgroup directory is gone."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.rmdir()
        return not any(p.exists() for p in self.paths)

    def remove_within(self, seconds: float) -> bool:
        """`remove`, again until it succeeds or `seconds` pass: a cgroup is busy until its last process, killed
        already, has been torn down by the kernel, which a loaded host takes its time over."""
        deadline, pause = time.monotonic() + seconds, 0.005
        while not self.remove():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        return True


def _unbounded(applied: set[str], v2: bool, v1_controllers: tuple[str, ...]) -> dict[str, str]:
    """The bounds of BOUND_FILES that none of the `applied` files set, each with the reason; each logged once per
    process (a host without a controller degrades to fewer bounds, said, not silently)."""
    missing = {}
    for bound, files in BOUND_FILES.items():
        controller = BOUND_CONTROLLERS[bound]
        if applied & set(files) or (not v2 and controller not in v1_controllers):
            continue  # set, or not asked of this cgroup (the uplink's has no freezer or cpuacct of its own)
        if v2:
            missing[bound] = f"the {controller} controller is not enabled for /sys/fs/cgroup/e2b-bench"
        elif not (Path("/sys/fs/cgroup") / controller).is_dir():
            missing[bound] = f"no cgroup v1 {controller} hierarchy is mounted at /sys/fs/cgroup/{controller}"
        else:
            missing[bound] = f"the sandbox's cgroup v1 {controller} directory or {'/'.join(files)} could not be written"
    for bound, reason in missing.items():
        if bound not in _reported_unbounded:
            _reported_unbounded.add(bound)
            log.warning("sandboxes have no %s bound on this host: %s", bound, reason)
    return missing


def _keyed(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}


def _enable_v2_controllers(path: Path) -> None:
    """Each parent must hand the controllers down for the sandbox's own cgroup to have them."""
    for parent in reversed([*path.parents][: len(path.relative_to("/sys/fs/cgroup").parts)]):
        parent.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text(V2_CONTROLLERS)


def _namespace_pids(root_pid: int) -> list[int]:
    try:
        target = os.readlink(f"/proc/{root_pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == target:
                    found.append(int(entry))
    return found


SLIRP4NETNS = shutil.which("slirp4netns")
NFT = shutil.which("nft", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")  # root's tools
NSENTER = shutil.which("nsenter")
SETPRIV = shutil.which("setpriv")  # util-linux, as unshare and nsenter
EGRESS_FILTER = NFT is not None and NSENTER is not None
UPLINK_LIMITS = Limits(memory_mb=128, pids=8)  # slirp4netns: its own cgroup, so its CPU is bounded too
UPLINK_CONTROLLERS = ("memory", "pids", "cpu")  # v1: only the hierarchies that bound it (each costs a create)


async def run_nft(script: str, timeout: float, netns_pid: int | None = None) -> None:
    """Run one nftables transaction as host root, in the host's network namespace or in `netns_pid`'s."""
    assert NFT is not None
    enter = [] if netns_pid is None else [NSENTER or "nsenter", f"--net=/proc/{netns_pid}/ns/net", "--"]
    process = await asyncio.create_subprocess_exec(
        *enter, NFT, "-f", "-", stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, error = await asyncio.wait_for(process.communicate(script.encode()), timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if process.returncode:
        raise AgentError(f"nft refused the rules: {error.decode(errors='replace').strip()}")


_uplinks_guarded = False


def guard_uplinks() -> bool:
    """Write the host's table that keeps sandboxes' uplinks off the host (network.py), once per server,
    before any uplink starts; False, said in one line, where nftables is missing or refuses it."""
    global _uplinks_guarded
    if NFT is None:
        log.warning(
            "nftables ('nft') is not installed: sandboxes' uplinks are not filtered on the host, so a "
            "sandbox reaches the host's own non-loopback addresses (and egress rules cannot be set)"
        )
        return False
    try:
        conf = Path("/etc/resolv.conf").read_text()
    except OSError:
        conf = ""
    gids = [ID_BASE + n * ID_COUNT for n in SubordinateIds.read().slots()]
    script = uplinks_table(gids, resolvers(conf))
    done = subprocess.run([NFT, "-f", "-"], input=script.encode(), capture_output=True, check=False, timeout=30)
    if done.returncode:
        error = done.stderr.decode(errors="replace").strip().splitlines()
        log.warning("nft refused the host's filter of sandboxes' uplinks: %s", error[-1] if error else "")
        return False
    _uplinks_guarded = True
    return True


def release_uplink(gid: int) -> None:
    """Remove what a server that died left in the host's table for `gid` (nothing, if there is nothing),
    unless a running sandbox holds that id range again."""
    if NFT is None or (gid - ID_BASE) % ID_COUNT:
        return
    with contextlib.suppress(OSError):
        lock = default_state_root() / "uid-ranges" / str((gid - ID_BASE) // ID_COUNT)
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the descriptor
            script = uplink_release(gid).encode()
            subprocess.run([NFT, "-f", "-"], input=script, capture_output=True, check=False, timeout=30)
        finally:
            os.close(fd)


class Uplink:
    """A sandbox's outbound network: slirp4netns gives its namespace a tap device (10.0.2.100/24, gateway
    10.0.2.2, DNS 10.0.2.3) whose connections leave through the host's stack, like a user-space NAT, and
    nothing reaches in. slirp4netns connects wherever a frame says, so its sockets (told apart by their gid,
    the sandbox's host root gid) are filtered in the host's network namespace: never to the host itself,
    and through the sandbox's egress rules (network.py). It runs in a cgroup of its own (CPU, memory and
    pids bounded) and exits with the namespace or, should the server die, when its exit pipe closes."""

    DNS = "10.0.2.3"

    def __init__(self, process: subprocess.Popen, exit_w: int, gid: int, cgroup: Cgroup) -> None:
        self.process, self._exit_w, self.gid, self.cgroup = process, exit_w, gid, cgroup
        self.has_egress_chain = False  # in the host's table: removed when the uplink stops
        self._exited = Holder.of_pid(process.pid)

    @classmethod
    async def start(cls, holder_pid: int, gid: int, cgroup_name: str, cpu_count: int, timeout: float) -> Uplink:
        assert SLIRP4NETNS is not None
        loop = asyncio.get_running_loop()
        cgroup = Cgroup(cgroup_name, replace(UPLINK_LIMITS, cpu_count=cpu_count), UPLINK_CONTROLLERS)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
        try:
            # Its cgroup, its spawn (the server's vfork and exec) and moving it in: a setup thread's work.
            process = await loop.run_in_executor(SETUP, cls._spawn, holder_pid, gid, cgroup, ready_w, exit_r)
        except BaseException:
            os.close(exit_w)
            os.close(ready_r)
            await loop.run_in_executor(TEARDOWN, cgroup.remove)
            raise
        finally:
            os.close(ready_w)
            os.close(exit_r)
        uplink = cls(process, exit_w, gid, cgroup)
        try:
            if await asyncio.wait_for(_read_byte(ready_r), timeout) != b"1":
                raise AgentError("the sandbox's network could not be set up (slirp4netns exited)")
        except BaseException:
            await uplink.stop()
            raise
        finally:
            os.close(ready_r)
        return uplink

    @staticmethod
    def _spawn(holder_pid: int, gid: int, cgroup: Cgroup, ready_w: int, exit_r: int) -> subprocess.Popen:
        """slirp4netns for `holder_pid`'s namespace, in `cgroup` (made here) once it started."""
        assert SLIRP4NETNS is not None
        cgroup.create()
        # The sandbox's gid, which its sockets carry, with host root's uid (to join the namespace): set by
        # setpriv, since Popen would fork (not vfork) the whole server to change groups itself.
        as_gid = [SETPRIV, f"--regid={gid}", "--clear-groups", "--"] if SETPRIV else []
        # Popen closes every other descriptor in the child (uvloop's spawn does not): it must hold
        # no listening socket, pipe or file of the server or of another sandbox.
        process = subprocess.Popen(
            [
                *as_gid, SLIRP4NETNS, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
                "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(holder_pid), "tap0",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(ready_w, exit_r), start_new_session=True,
            group=None if SETPRIV else gid, extra_groups=None if SETPRIV else [],
        )  # fmt: skip
        try:
            cgroup.join(process.pid)  # its start-up (ms) runs in the server's cgroups; its traffic in its own
        except BaseException:
            process.kill()
            process.wait()
            raise
        return process

    async def apply(self, rules: EgressRules, timeout: float) -> None:
        """Give this uplink's sockets `rules` in the host's table (where `guard_uplinks` made one)."""
        if _uplinks_guarded:
            self.has_egress_chain = True
            await run_nft(rules.uplink_script(self.gid), timeout)

    async def stop(self) -> None:
        if self._exit_w >= 0:
            os.close(self._exit_w)
            self._exit_w = -1
        self._exited.kill()
        await self._exited.wait(scaled(EXIT_S))
        if self._exited.alive:  # killed, but not yet gone (a loaded host): reaped off the event loop when it is
            await asyncio.get_running_loop().run_in_executor(None, self.process.wait)
        with contextlib.suppress(ChildProcessError):
            self.process.wait(0)  # reaped now: it has exited
        if self.has_egress_chain:
            self.has_egress_chain = False
            try:
                await run_nft(uplink_release(self.gid), 10)
            except (AgentError, OSError, TimeoutError) as exc:  # the next rules of this gid replace what is left
                log.warning("uplink of gid %d: %s", self.gid, exc)
        if not await asyncio.get_running_loop().run_in_executor(TEARDOWN, self.cgroup.remove_within, scaled(EXIT_S)):
            log.warning("uplink of gid %d: its cgroup is still busy", self.gid)


async def _read_byte(fd: int) -> bytes:
    """One byte from a pipe, read when it is readable (b"" at its end), without a thread."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 1)


class Holder:
    """The process holding a sandbox's namespaces: it exits once pid 1 of the sandbox has been reaped."""

    def __init__(self, pid: int, exited: asyncio.Future) -> None:
        self.pid = pid
        self.exited = exited

    @classmethod
    def of_pid(cls, pid: int) -> Holder:
        """Watch any process (not only our children) through a pidfd."""
        loop = asyncio.get_running_loop()
        exited: asyncio.Future = loop.create_future()
        pidfd = os.pidfd_open(pid)

        def done() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, done)
        return cls(pid, exited)

    @property
    def alive(self) -> bool:
        return not self.exited.done()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exited), timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class Zygote:
    """A fork-server (agent.py --zygote) sandboxes are forked from: no interpreter start per sandbox."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.lock = asyncio.Lock()

    @classmethod
    def start(cls) -> Zygote:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(AGENT_PATH), "--zygote", str(child.fileno())],
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        child.close()
        return cls(process, parent)

    async def launch(self, config: dict, control: socket.socket) -> int:
        """Fork one sandbox; returns the pid of the process that holds its namespaces."""

        def exchange() -> int:
            socket.send_fds(self.sock, [json.dumps(config).encode()], [control.fileno()])
            reply = self.sock.recv(65536)
            if not reply:
                raise AgentError("the sandbox fork-server exited")
            return int(json.loads(reply)["pid"])

        async with self.lock:  # held until the answer is read, or the next launch would read this one's
            return await setup_step(exchange)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(2)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Box:
    """Namespaces + overlay root + agent for one sandbox; all sandbox I/O goes through here."""

    def __init__(
        self,
        name: str,
        template_root: Path,
        state_dir: Path,
        settings: BoxSettings,
        zygote: Zygote | None = None,
        disks: Disks | None = None,
    ) -> None:
        self.name = name
        self.zygote = zygote
        self.template_root = template_root
        self.dir = state_dir / name
        # With disks, the box directory is the root of the sandbox's own file system, kept in this image
        # (which a filesystem-only pause keeps, unmounted); without, upper and work are on the host's.
        self.disks = disks
        self.image = state_dir / f"{name}.disk"
        self.mounted = False
        self.device = ""  # the loop device of its mounted disk
        self.keep_image = False
        self.settings = settings
        # Cgroups are host-wide: the server's own directory name keeps two servers' boxes apart.
        self.cgroup_name = f"{state_dir.parent.name}/{name}"
        self.cgroup = Cgroup(self.cgroup_name, settings.limits)
        self.ids: IdRange | None = None
        self.kept_ids: IdRange | None = None  # the id range of files kept by `power_off`
        self.kept_upper: Path | None = None  # files a cold boot starts on (`power_on`)
        self.ending = False  # kill() has begun: the sandbox's streams are cut, not ended
        self.uplink: Uplink | None = None
        self.link: AgentLink | None = None
        self.holder: Holder | None = None
        self.processes: dict[int, ProcessRecord] = {}
        self.ended: dict[int, tuple[ProcessRecord, float]] = {}  # exits kept for a late Connect (`ended_process`)
        self._early_exits: dict[int, int] = {}
        self._users: dict[str, dict] = {}
        self._cpu_sample: tuple[float, float] | None = None
        self._disk = DiskUsage(self.dir / "upper")
        self.on_exit: Callable[[], None] | None = None
        self.phases: dict[str, float] = {}  # ms each step of `start` took, in order
        self._phase_start = 0.0

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, hostname: str, timeout: float | None = None) -> None:
        self._phase_start = time.monotonic()
        if self.ids is None:  # a box given the range of files it reuses keeps it
            self.ids = IdRange.take(default_state_root() / "uid-ranges")
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Mounting its disk takes milliseconds: not on the event loop.
            await setup_step(self._make_dirs, self.ids.base)
            self._phase("disk")  # and cgroups
            config = {
                "box": str(self.dir),
                "lower": str(self.template_root),
                "ids": [self.ids.base, self.ids.count],
                "hostname": hostname,
                "cgroup_procs": self.cgroup.procs_files,
            }
            if self.zygote is not None:
                self.holder = Holder.of_pid(await self.zygote.launch(config, child_sock))
            else:
                self.holder = await self._launch(config, child_sock)
            self._phase("fork")
        except BaseException:  # nothing started: give back what was taken
            parent_sock.close()
            await self._teardown()
            raise
        finally:
            child_sock.close()
        (self.dir / "pid").write_text(str(self.holder.pid))
        timeout = scaled(START_S) if timeout is None else timeout
        self.link = AgentLink(parent_sock, self._on_process_exit)
        asyncio.get_running_loop().create_task(self._watch_unshare())
        try:
            await self.link.ready(timeout)
            self._phase("agent")
            dns = None
            if self.settings.internet and SLIRP4NETNS:
                assert self.holder is not None
                cpus = self.settings.limits.cpu_count
                self.uplink = await Uplink.start(
                    self.holder.pid, self.ids.base, f"{self.cgroup_name}.uplink", cpus, timeout
                )
                dns = Uplink.DNS
                self._phase("uplink")
            await self.link.result(
                "configure",
                hostname=hostname,
                profile=list(self.settings.profile_lines),
                hide=list(self.settings.hidden_paths),
                nameserver=dns,
            )
            self._phase("configure")
            log.debug("sandbox %s started: %s", self.name, ", ".join(f"{k} {v:.1f} ms" for k, v in self.phases.items()))
        except (AgentError, TimeoutError) as exc:
            await self.kill()
            raise AgentError(f"{exc}") from exc
        except asyncio.CancelledError:  # server shutting down mid-start: leave nothing behind
            await self.kill()
            raise

    def _phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = (now - self._phase_start) * 1000
        self._phase_start = now

    def _make_dirs(self, root_uid: int) -> None:
        """The sandbox's cgroups; the box directory and its upper layer, which belong to the sandbox's root: its
        holder enters the directory as host root, then works inside it with the sandbox's ids only."""
        self.cgroup.create()
        self.dir.mkdir(mode=0o700)
        if self.disks is not None:
            if self.kept_upper is None:
                self.device = self.disks.new(self.image, self.dir)
            else:  # a cold boot mounts the image `power_off` kept, which stays if it cannot be mounted
                self.keep_image = True
                self.device = self.disks.mount(self.image, self.dir)
            self.mounted, self.kept_upper, self.keep_image = True, None, False
            self.dir.chmod(0o700)
            remove_tree(self.dir / "lower")  # a kept disk's mount points of the previous boot
        for sub in ("upper", "work", "merged", "lower"):
            if sub == "upper" and self.kept_upper is not None:  # a cold boot on files kept by `power_off`
                os.rename(self.kept_upper, self.dir / sub)
                self.kept_upper = None
                continue
            (self.dir / sub).mkdir(mode=0o755, exist_ok=self.mounted)
        for path in (self.dir, self.dir / "upper", self.dir / "work", self.dir / "lower"):
            os.chown(path, root_uid, root_uid)

    async def _launch(self, config: dict, child_sock: socket.socket) -> Holder:
        """Without a fork-server: a fresh interpreter per sandbox."""
        config = {**config, "control_fd": child_sock.fileno()}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(AGENT_PATH), "--launch", json.dumps(config),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=[child_sock.fileno()], start_new_session=True,
        )  # fmt: skip
        exited = asyncio.ensure_future(process.wait())
        return Holder(process.pid, exited)

    async def _watch_unshare(self) -> None:
        assert self.holder is not None
        await asyncio.shield(self.holder.exited)
        if self.link:
            self.link.close()
        for record in list(self.processes.values()):
            self._finish(record, ExitStatus.from_wait_status(signal.SIGKILL))
        if self.on_exit:
            self.on_exit()

    @property
    def running(self) -> bool:
        return self.holder is not None and self.holder.alive

    async def warm_up(self) -> None:
        """Run one login shell so the first command of a sandbox does not pay for cold caches."""
        for user in ("user", "root"):
            await self.user(user)
        record = await self.spawn(
            cmd="/bin/bash", args=["-l", "-c", "true"], envs={}, cwd=None, user="user", tag=None, stdin=False, pty=None
        )
        await asyncio.wait_for(record.done.wait(), scaled(WARM_S))

    async def kill(self, wait_for_files: bool = True) -> asyncio.Future | None:
        """End every process of the sandbox (all are gone on return) and remove its files.

        With `wait_for_files=False` the files are removed in the background; the returned future ends then.
        """
        self.ending = True  # from now on a process that ends was cut by the sandbox's end, not by itself
        if self.mounted and not self.keep_image:
            # Its disk is deleted next: what the sandbox wrote and its file system has not yet written stays
            # unwritten (neither its processes' exit nor the unmount writes it back and flushes the host's disk)
            drop_unwritten(self.dir, self.device)
        if self.holder and self.holder.alive:
            with contextlib.suppress(OSError):
                await self.cgroup.freeze(False, self._root_pid())
            root = self._root_pid()
            for pid in self.cgroup.pids(root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # pid 1's death ends every process of the namespace; the holder exits once pid 1 is reaped,
            # so when it has, nothing of the sandbox is left. (Killing the holder first would not wait.)
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(root, signal.SIGKILL)  # type: ignore[arg-type]
            await self.holder.wait(scaled(EXIT_S))
            if self.holder.alive:
                self.holder.kill()
                await self.holder.wait(scaled(EXIT_S))
        if self.link:
            self.link.close()
        if self.uplink:
            await self.uplink.stop()
        for record in list(self.processes.values()):
            self._finish(record, ExitStatus.from_wait_status(signal.SIGKILL))
        removal = asyncio.ensure_future(self._teardown())
        if wait_for_files:
            await removal
            return None
        return removal

    async def _teardown(self) -> None:
        """Remove the sandbox's files, then wait (bounded, holding no thread) for its disk's loop device."""
        loop = await asyncio.get_running_loop().run_in_executor(TEARDOWN, self._remove_files)
        if loop is not None:
            await released(loop, self.dir)

    def _remove_files(self) -> tuple[str, str] | None:
        """Remove cgroups, disk and files; returns the loop device still letting go of the disk, if any."""
        device = None
        if not self.cgroup.remove_within(scaled(EXIT_S)):
            log.warning("sandbox %s: its cgroup is still busy", self.name)
        if self.mounted:  # the sandbox's files go with its file system, whatever it made of them
            try:
                device = unmount(self.dir, wait=False)
            except OSError as exc:  # its files are then removed one by one, the image left with the dir
                log.warning("sandbox %s: %s", self.name, exc)
            self.mounted = False
            if not self.keep_image:
                self.image.unlink(missing_ok=True)
        elif self.disks is not None and not self.keep_image:  # it failed before its disk was mounted
            self.image.unlink(missing_ok=True)
        remove_tree(self.dir)
        if self.ids is not None:
            self.ids.release()  # only now: no file or process of the sandbox holds its ids any more
        return device

    def _root_pid(self) -> int | None:
        if not self.holder:
            return None
        try:
            children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text().split()
            return int(children[0]) if children else None
        except OSError:
            return None

    async def freeze(self) -> None:
        await self.cgroup.freeze(True, self._root_pid())

    async def thaw(self) -> None:
        await self.cgroup.freeze(False, self._root_pid())

    # --- ports ------------------------------------------------------------------------------
    async def connect(self, port: int, timeout: float | None = None) -> socket.socket:
        """A connected, non-blocking TCP socket to `port` on the sandbox's loopback."""
        result, fds = await self._call("connect", port=port)
        sock = socket.socket(fileno=fds[0])
        if result["pending"]:
            loop = asyncio.get_running_loop()
            writable = loop.create_future()
            loop.add_writer(sock.fileno(), _set_once, writable)
            try:
                await asyncio.wait_for(writable, scaled(CONNECT_S) if timeout is None else timeout)
            except BaseException:
                sock.close()
                raise
            finally:
                loop.remove_writer(sock.fileno())
            if err := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                sock.close()
                raise AgentError(os.strerror(err), err)
        return sock

    async def apply_egress(self, rules: EgressRules, timeout: float | None = None) -> None:
        """Replace the sandbox's egress rules: in its network namespace (as host root, in that namespace only:
        the sandbox's root has no CAP_NET_ADMIN) and on its uplink's sockets in the host's, which no frame
        made in the sandbox gets around."""
        if not EGRESS_FILTER:
            raise AgentError("nftables is not installed, so egress rules cannot be enforced", errno.ENOSYS)
        if self.holder is None or not self.holder.alive:
            raise AgentError("the sandbox is not running")
        wait_s = scaled(EGRESS_S) if timeout is None else timeout
        await run_nft(rules.nft_script(), wait_s, self.holder.pid)
        if self.uplink is not None:
            await self.uplink.apply(rules, wait_s)

    # --- filesystem-only pause --------------------------------------------------------------
    async def power_off(self) -> Path:
        """End the sandbox but keep its root's changes (returned): a pause without memory."""
        self.on_exit = None  # not an exit of the sandbox: it is paused
        await self.freeze()
        if self.mounted:  # the whole disk is kept: unmounted by kill(), mounted again by `power_on`
            kept, self.keep_image = self.image, True
        else:
            kept = self.dir.parent / f"{self.name}.upper"
            os.rename(self.dir / "upper", kept)  # frozen: nothing writes while the upper layer moves
        # The kept files are owned by this box's host id range: it goes with them to the box that boots on them.
        self.kept_ids, self.ids = self.ids, None
        await self.kill()
        return kept

    async def power_on(self, hostname: str, kept: Path) -> None:
        """Cold-boot this (new) box on the root's changes kept by `power_off`: new processes, a new boot id."""
        self.kept_upper = kept
        await self.start(hostname)
        await self.new_boot_id()

    async def new_boot_id(self) -> None:
        """Give this boot its own boot id; a sandbox that cannot mount one still starts (and says so)."""
        try:
            await self._call_result("boot_id", boot_id=str(uuid.uuid4()))
        except AgentGone:
            raise
        except AgentError as exc:
            log.warning("sandbox %s keeps the host's boot id: %s", self.name, exc)

    # --- metrics ------------------------------------------------------------------------------
    def usage(self) -> tuple[float, int, int, int]:
        """(cpu percent since the previous sample, resident memory bytes, disk bytes used, disk size)."""
        cpu_seconds, rss = self.cgroup.counters() or self._process_counters()
        now = time.monotonic()
        percent = 0.0
        if self._cpu_sample:
            elapsed = now - self._cpu_sample[0]
            if elapsed > 0:
                percent = max(0.0, (cpu_seconds - self._cpu_sample[1]) / elapsed * 100 / (os.cpu_count() or 1))
        self._cpu_sample = (now, cpu_seconds)
        return percent, rss, *self._disk_usage()

    def _disk_usage(self) -> tuple[int, int]:
        """What `df /` shows in the sandbox (as envd reports it): its own disk's, or without one, the bytes
        written to the upper layer (counted by a thread) of the advertised size."""
        if self.mounted:
            with contextlib.suppress(OSError):
                fs = os.statvfs(self.dir)
                return (fs.f_blocks - fs.f_bfree) * fs.f_frsize, fs.f_blocks * fs.f_frsize
        return self._disk.sample(), self.settings.limits.disk_mb << 20

    def _process_counters(self) -> tuple[float, int]:
        """Without cpuacct and memory controllers: the sum over the sandbox's processes."""
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        cpu_seconds, rss = 0.0, 0
        for pid in self.cgroup.pids(self._root_pid()):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                cpu_seconds += (int(fields[11]) + int(fields[12])) / ticks
                rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        return cpu_seconds, rss

    # --- users --------------------------------------------------------------------------------
    async def user(self, name: str) -> dict:
        if name not in self._users:
            self._users[name] = await self._call_result("user", user=name)
        return self._users[name]

    def resolve(self, path: str, home: str) -> str:
        """envd's rule: `~` and relative paths are taken from the user's home."""
        if path == "~" or path.startswith("~/"):
            path = home + path[1:]
        if not path.startswith("/"):
            path = f"{home.rstrip('/')}/{path}"
        return os.path.normpath(path) if path != "/" else path

    # --- processes ----------------------------------------------------------------------------
    async def spawn(
        self,
        *,
        cmd: str,
        args: list[str],
        envs: dict[str, str],
        cwd: str | None,
        user: str,
        tag: str | None,
        stdin: bool,
        pty: tuple[int, int] | None,
    ) -> ProcessRecord:
        info = await self.user(user)
        home = info["home"]
        workdir = self.resolve(cwd, home) if cwd else home
        if self.settings.root_home_of_user and user == "root":
            home = (await self.user("user"))["home"]  # E2B's default user's
        env = {"PATH": DEFAULT_PATH, "HOME": home, "USER": user, "LOGNAME": user, "PWD": workdir, **envs}
        if pty:
            env.setdefault("TERM", "xterm-256color")
        result, fds = await self._call(
            "spawn",
            argv=[cmd, *args],
            env=env,
            cwd=workdir,
            user=user,
            stdin=stdin,
            pty=list(pty) if pty else None,
            session_leader=self.settings.session_leader,
        )
        record = ProcessRecord(pid=result["pid"], cmd=cmd, args=args, envs=envs, cwd=workdir, tag=tag, pty=bool(pty))
        loop = asyncio.get_running_loop()
        if pty:
            record.pty_fd = fds[0]
            record.outputs = {fds[0]: "pty"}
        else:
            record.outputs = {fds[0]: "stdout", fds[1]: "stderr"}
            if stdin:
                record.stdin_fd = fds[2]
                os.set_blocking(fds[2], False)  # a process that does not read must not stall the server
        for fd, kind in record.outputs.items():
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._read_output, record, fd, kind)
        self.processes[record.pid] = record
        # A new process takes its pid's and its tag's kept exit, as envd's Start does (terminated.Delete,
        # clearTerminatedForTag): a late Connect is never served a predecessor's end.
        for pid, (ended, _) in list(self.ended.items()):
            if pid == record.pid or (tag is not None and ended.tag == tag):
                del self.ended[pid]
        if record.pid in self._early_exits:
            # Not now: the caller subscribes right after this returns, and must not miss the end.
            loop.call_soon(self._on_process_exit, record.pid, self._early_exits.pop(record.pid))
        return record

    def _read_output(self, record: ProcessRecord, fd: int, kind: str) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO from a pty whose last holder closed it
            data = b""
        if data:
            record.publish(("data", kind, data))
            if record.full and record.paused is None:
                self._pause_output(record)
            return
        self._close_output(record, fd)
        self._maybe_finish(record)

    def _pause_output(self, record: ProcessRecord) -> None:
        """Stop reading the command's pipes until its fullest stream has sent half of what it holds."""
        loop = asyncio.get_running_loop()
        for fd in record.outputs:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(fd)

        def resume() -> None:
            for fd, kind in record.outputs.items():
                loop.add_reader(fd, self._read_output, record, fd, kind)

        record.paused = resume

    def _close_output(self, record: ProcessRecord, fd: int) -> None:
        if record.pty_fd == fd:
            self._drop_input(record, fd)
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        if record.pty_fd == fd:
            record.pty_fd = None
        record.outputs.pop(fd, None)

    def _on_process_exit(self, pid: int, raw_status: int) -> None:
        record = self.processes.get(pid)
        if record is None:
            self._early_exits[pid] = raw_status
            return
        record.exit = ExitStatus.from_wait_status(raw_status)
        record.reaped.set()
        if self.settings.end_on_exit and record.outputs:
            # Such an endpoint ends a command soon after its process exits, whatever is still to come.
            asyncio.get_running_loop().create_task(self._end_when_quiet(record))
        self._maybe_finish(record)

    async def _end_when_quiet(self, record: ProcessRecord) -> None:
        """End a command whose process exited (with the `end_on_exit` quirk) once its sandbox is quiet.

        "Soon" is not a fixed time, which on a loaded host would decide by load what gets through: the end
        comes when every process of the sandbox but pid 1 waits (or is gone) and the command's output
        holds nothing unread, twice in a row. So a leftover that is still running (`setsid sh -c pwd`)
        gets its output delivered, one that waits first (`sleep 1; echo late`) does not; after
        END_ON_EXIT_MAX_S the end comes anyway."""
        deadline = asyncio.get_running_loop().time() + END_ON_EXIT_MAX_S
        quiet = 0
        while not record.done.is_set() and asyncio.get_running_loop().time() < deadline:
            quiet = quiet + 1 if self._quiet(record) else 0
            if quiet == 2:
                break
            await asyncio.sleep(END_ON_EXIT_POLL_S)
        if not record.done.is_set() and record.exit is not None:
            self._finish(record, record.exit)

    def _quiet(self, record: ProcessRecord) -> bool:
        """No output unread and no thread of the sandbox (but pid 1's) running or runnable."""
        for fd in record.outputs:
            with contextlib.suppress(OSError):
                if int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder):
                    return False
        root = self._root_pid()
        for pid in self.cgroup.pids(root):
            if pid == root:
                continue
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # gone
            for task in tasks:
                try:
                    stat_line = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                except OSError:
                    continue
                # "pid (comm) S ...": the comm may hold spaces and parentheses, the state follows the last ")"
                if stat_line[stat_line.rindex(")") + 2] not in IDLE_STATES:
                    return False
        return True

    def _maybe_finish(self, record: ProcessRecord) -> None:
        if record.exit is not None and not record.outputs:
            self._finish(record, record.exit)

    def _finish(self, record: ProcessRecord, status: ExitStatus) -> None:
        if record.done.is_set():
            return
        for fd, kind in list(record.outputs.items()):
            # Whatever is already buffered is still delivered; later output is not waited for.
            with contextlib.suppress(OSError):
                while data := os.read(fd, READ_CHUNK):
                    record.publish(("data", kind, data))
            self._close_output(record, fd)
        if record.stdin_fd is not None:
            self._drop_input(record, record.stdin_fd)
            with contextlib.suppress(OSError):
                os.close(record.stdin_fd)
            record.stdin_fd = None
        record.exit = status
        # The sandbox itself is gone: its streams are cut, without an end event, as when E2B's VM stops.
        record.publish(("end" if self.running and not self.ending else "gone", status))
        record.done.set()
        record.reaped.set()
        for callback in record.done_callbacks:
            callback()
        self.processes.pop(record.pid, None)
        if self.running and not self.ending:
            self.ended[record.pid] = (record, time.monotonic() + ENDED_KEPT_S)

    def ended_process(self, pid: int | None = None, tag: str | None = None) -> ProcessRecord | None:
        """A process that ended at most ENDED_KEPT_S ago, by pid or tag: envd keeps each exit that long
        (internal/services/process/service.go terminatedRetentionTTL), and its Connect serves it as a start
        event and the end (connect.go lookupTerminated, serveTerminated)."""
        now = time.monotonic()
        for kept_pid, (record, until) in list(self.ended.items()):
            if until <= now:
                del self.ended[kept_pid]
            elif (pid is not None and kept_pid == pid) or (tag is not None and record.tag == tag):
                return record
        return None

    async def signal(self, pid: int, signum: int) -> None:
        await self._call_result("signal", pid=pid, signal=signum)

    async def write_input(self, record: ProcessRecord, data: bytes, pty: bool) -> None:
        """Write all of `data`, waiting (without blocking the loop) while the process does not read."""
        async with record.input_lock:
            view = memoryview(data)
            while view:
                fd = record.pty_fd if pty else record.stdin_fd
                if fd is None:
                    raise AgentError("stdin is not open for this process", errno.EBADF)
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    await self._writable(record, fd)

    async def _writable(self, record: ProcessRecord, fd: int) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not waiter.done():
                waiter.set_result(None)

        loop.add_writer(fd, ready)
        record.input_waiters.add(waiter)
        try:
            await waiter
        finally:
            record.input_waiters.discard(waiter)
            with contextlib.suppress(ValueError, OSError):
                loop.remove_writer(fd)

    def _drop_input(self, record: ProcessRecord, fd: int) -> None:
        """Writes still waiting on `fd` fail: it is about to close."""
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_writer(fd)
        for waiter in list(record.input_waiters):
            if not waiter.done():
                waiter.set_exception(AgentError("stdin was closed", errno.EPIPE))

    async def close_input(self, record: ProcessRecord) -> None:
        """Close stdin once the input sent before has been written."""
        async with record.input_lock:
            if record.stdin_fd is None:
                raise AgentError("stdin is not open for this process", errno.EBADF)
            os.close(record.stdin_fd)
            record.stdin_fd = None

    async def resize(self, record: ProcessRecord, cols: int, rows: int) -> None:
        if record.pty_fd is None:
            raise AgentError("process has no pty", errno.ENOTTY)
        await self._call_result("resize", [record.pty_fd], size=[cols, rows])

    # --- files --------------------------------------------------------------------------------
    async def open(self, path: str, mode: str, user: str, metadata: dict[str, str] | None = None) -> tuple[int, dict]:
        result, fds = await self._call("open", path=path, mode=mode, user=user, metadata=metadata or {})
        return fds[0], result

    async def open_read(self, path: str, user: str) -> tuple[int, dict]:
        """A non-blocking fd of a file to download, opened by root as envd opens it (the user names `~`); magic links
        refused."""
        result, fds = await self._call("read_open", path=path, user=user)
        return fds[0], result

    async def open_write(self, path: str, user: str, metadata: dict[str, str]) -> tuple[int, bool]:
        """A file opened for an upload as envd opens it: by root, then owned by the user; and whether it existed.
        An existing file keeps its contents: the writer cuts it where the upload's data ends (`files.FileSink`)."""
        truncate_first = self.settings.upload_truncates_first
        result, fds = await self._call(
            "write_open", path=path, user=user, metadata=metadata, truncate_first=truncate_first
        )
        return fds[0], not result["created"]

    async def fs(self, op: str, **fields: object) -> dict[str, Any]:
        """A filesystem operation answered with one object (an entry, added watch paths or nothing)."""
        return await self._call_result(op, (), **fields)

    async def list_dir(self, path: str, depth: int, user: str) -> list[dict[str, Any]]:
        """The entries under a directory down to `depth`, as the agent lists them."""
        return await self._link().result("list", path=path, depth=depth, user=user)

    async def watch(self, path: str, recursive: bool, user: str) -> tuple[int, int, dict[int, str]]:
        result, fds = await self._call("watch", path=path, recursive=recursive, user=user)
        return result["watch"], fds[0], {int(k): v for k, v in result["paths"].items()}

    # Every operation but "list" is answered with a JSON object; the agent's reply is untyped JSON.
    async def _call(self, op: str, fds: Sequence[int] = (), **fields: object) -> tuple[dict[str, Any], list[int]]:
        return await self._link().call(op, fds, **fields)

    async def _call_result(self, op: str, fds: Sequence[int] = (), **fields: object) -> dict[str, Any]:
        return await self._link().result(op, fds, **fields)

    def _link(self) -> AgentLink:
        if self.link is None:
            raise AgentGone("sandbox is not running")
        return self.link


class DiskUsage:
    """Bytes in the sandbox's upper layer, counted by a thread: the tree is the sandbox's to make huge or
    deep, and the event loop must not walk it. A sample is the last finished count (0 before the first)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bytes = 0
        self._counting = False
        self._lock = threading.Lock()

    def sample(self) -> int:
        with self._lock:
            start, self._counting = not self._counting, True
        if start:
            threading.Thread(target=self._count, name="disk-usage", daemon=True).start()
        return self.bytes

    def _count(self) -> None:
        try:
            self.bytes = sum(st.st_blocks * 512 for st in walk_tree(self.root) if not stat.S_ISDIR(st.st_mode))
        finally:
            with self._lock:
                self._counting = False


def walk_tree(root: Path) -> Iterator[os.stat_result]:
    """lstat of every entry under root, iteratively (no depth limit) and without following links."""
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    yield st
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)


DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk_down(
    root: Path, on_file: Callable[[int, str], None], on_dir: Callable[[int, str, os.stat_result], None]
) -> None:
    """Every entry under root, depth first, without recursion and holding one descriptor whatever the depth
    or path length: on_file(dir_fd, name) for each non-directory, on_dir(parent_fd, name, stat) for each
    directory once its contents are done. It climbs back through "..": for trees nothing else changes
    (a dead sandbox's, a frozen one's or a copy)."""
    fd = os.open(root, DIRECTORY_FLAGS)
    stack: list[tuple[str, list[str]]] = [("", _enter(fd, on_file))]
    try:
        while stack:
            name, pending = stack[-1]
            if pending:
                sub = pending.pop()
                try:
                    child = os.open(sub, DIRECTORY_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                os.close(fd)
                fd = child
                stack.append((sub, _enter(fd, on_file)))
                continue
            stack.pop()
            if not stack:
                break
            st = os.fstat(fd)
            parent = os.open("..", DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            on_dir(fd, name, st)
    finally:
        os.close(fd)


def _enter(fd: int, on_file: Callable[[int, str], None]) -> list[str]:
    subdirectories = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                on_file(fd, entry.name)
    return subdirectories


def remove_tree(root: Path) -> bool:
    """rm -rf that survives any depth and path length; True when root is gone (what cannot be removed is
    left, and said so by the return value)."""

    def unlink(fd: int, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=fd)

    def rmdir(fd: int, name: str, _: os.stat_result) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=fd)

    try:
        walk_down(root, unlink, rmdir)
    except FileNotFoundError:
        return True
    except OSError:
        if os.path.islink(root) or not os.path.isdir(root):
            with contextlib.suppress(OSError):
                root.unlink()
    with contextlib.suppress(OSError):
        os.rmdir(root)
    return not os.path.lexists(root)


def shift_ids(root: Path, by: int) -> None:
    """Add `by` to the owner and group of every entry of a tree, e.g. to turn a sandbox's upper directory (owned
    by its host id range) into a layer owned by ids 0..65535 as the template is, which any later sandbox mounts
    idmapped to its own range. Each inode is shifted once, however many hard links it has. A layer holds no
    setuid/setgid file (chown clears the bits and they stay cleared: on the host such a file would belong to
    root) and no device node but overlay's whiteouts (0:0). Dead, frozen or copied trees only."""
    shifted: set[tuple[int, int]] = set()

    def shift(fd: int | None, name: str, st: os.stat_result | None = None) -> None:
        st = st or os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISBLK(st.st_mode) or (stat.S_ISCHR(st.st_mode) and st.st_rdev != 0):
            os.unlink(name, dir_fd=fd)
            return
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in shifted:
                return
            shifted.add((st.st_dev, st.st_ino))
        os.chown(name, st.st_uid + by, st.st_gid + by, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(name, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID), dir_fd=fd)

    walk_down(root, shift, shift)
    shift(None, str(root))


def _set_once(future: asyncio.Future) -> None:
    """A ready callback that may fire again before its waiter removes it."""
    if not future.done():
        future.set_result(None)
