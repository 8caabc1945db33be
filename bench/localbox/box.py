"""One isolated sandbox environment: the agent process, its namespaces, root and processes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .agentlink import AgentError, AgentGone, AgentLink
from .network import EgressRules

log = logging.getLogger("e2b-bench.localbox")
AGENT_PATH = Path(__file__).with_name("agent.py")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SIGNAL_NAMES = {
    signal.SIGKILL: "killed", signal.SIGTERM: "terminated", signal.SIGINT: "interrupt",
    signal.SIGHUP: "hangup", signal.SIGQUIT: "quit", signal.SIGABRT: "aborted",
    signal.SIGSEGV: "segmentation fault", signal.SIGPIPE: "broken pipe", signal.SIGBUS: "bus error",
    signal.SIGUSR1: "user defined signal 1", signal.SIGUSR2: "user defined signal 2",
    signal.SIGALRM: "alarm clock", signal.SIGFPE: "floating point exception", signal.SIGILL: "illegal instruction",
}  # fmt: skip
READ_CHUNK = 1 << 16
END_ON_EXIT_GRACE_S = 0.25


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

    def subscribe(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self.subscribers.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        with contextlib.suppress(ValueError):
            self.subscribers.remove(queue)

    def publish(self, event: tuple) -> None:
        for queue in self.subscribers:
            queue.put_nowait(event)


@dataclass(frozen=True)
class BoxSettings:
    """How a box is isolated and how its commands behave (quirks included)."""

    internet: bool = True
    session_leader: bool = False  # a command leads its own session (setsid then forks)
    end_on_exit: bool = False  # report the end at process exit instead of at output EOF
    profile_lines: tuple[str, ...] = ()  # appended to the sandbox's login profile


class Freezer:
    """The sandbox's cgroup: lists its processes and freezes them (SIGSTOP when no cgroup)."""

    def __init__(self, name: str) -> None:
        self.path: Path | None = None
        self.v2 = False
        v1 = Path("/sys/fs/cgroup/freezer")
        unified = Path("/sys/fs/cgroup/cgroup.controllers")
        with contextlib.suppress(OSError):
            if v1.is_dir():
                self.path = v1 / "e2b-bench" / name
            elif unified.exists():
                self.path, self.v2 = Path("/sys/fs/cgroup/e2b-bench") / name, True
            if self.path:
                self.path.mkdir(parents=True, exist_ok=True)

    @property
    def procs_file(self) -> str | None:
        return str(self.path / "cgroup.procs") if self.path else None

    def pids(self, fallback_root: int | None) -> list[int]:
        if self.path:
            with contextlib.suppress(OSError):
                return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return _namespace_pids(fallback_root) if fallback_root else []

    async def freeze(self, frozen: bool, fallback_root: int | None) -> None:
        if self.path:
            state = self.path / ("cgroup.freeze" if self.v2 else "freezer.state")
            want = ("1" if frozen else "0") if self.v2 else ("FROZEN" if frozen else "THAWED")
            state.write_text(want)
            for _ in range(200):
                current = (self.path / "cgroup.events").read_text() if self.v2 else state.read_text().strip()
                if (f"frozen {want}" in current) if self.v2 else current == want:
                    return
                await asyncio.sleep(0.005)
            return
        sig = signal.SIGSTOP if frozen else signal.SIGCONT
        for pid in self.pids(fallback_root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def remove(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                self.path.rmdir()


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

        async with self.lock:
            return await asyncio.get_running_loop().run_in_executor(None, exchange)

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
        self, name: str, template_root: Path, state_dir: Path, settings: BoxSettings, zygote: Zygote | None = None
    ) -> None:
        self.name = name
        self.zygote = zygote
        self.template_root = template_root
        self.dir = state_dir / name
        self.settings = settings
        # Cgroups are host-wide: the server's own directory name keeps two servers' boxes apart.
        self.freezer = Freezer(f"{state_dir.parent.name}/{name}")
        self.link: AgentLink | None = None
        self.holder: Holder | None = None
        self.processes: dict[int, ProcessRecord] = {}
        self._early_exits: dict[int, int] = {}
        self._users: dict[str, dict] = {}
        self._cpu_sample: tuple[float, float] | None = None
        self.on_exit: Callable[[], None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, hostname: str, timeout: float = 15.0) -> None:
        for sub in ("upper", "work", "merged"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "lower": str(self.template_root),
            "upper": str(self.dir / "upper"),
            "work": str(self.dir / "work"),
            "merged": str(self.dir / "merged"),
            "control_fd": child_sock.fileno(),
            "cgroup_procs": [self.freezer.procs_file] if self.freezer.procs_file else [],
            "net": not self.settings.internet,
        }
        if self.zygote is not None:
            self.holder = Holder.of_pid(await self.zygote.launch(config, child_sock))
        else:
            self.holder = await self._unshare(config, child_sock)
        child_sock.close()
        (self.dir / "pid").write_text(str(self.holder.pid))
        self.link = AgentLink(parent_sock, self._on_process_exit)
        asyncio.get_running_loop().create_task(self._watch_unshare())
        try:
            await self.link.ready(timeout)
            await self.link.result("configure", hostname=hostname, profile=list(self.settings.profile_lines))
        except (AgentError, TimeoutError) as exc:
            log = self.dir / "agent.log"
            log_tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            await self.kill()
            raise AgentError(f"{exc}; agent log: {log_tail.strip() or '(empty)'}") from exc
        except asyncio.CancelledError:  # server shutting down mid-start: leave nothing behind
            await self.kill()
            raise

    async def _unshare(self, config: dict, child_sock: socket.socket) -> Holder:
        """Without a fork-server: `unshare` + a fresh interpreter per sandbox."""
        command = ["unshare", "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child"]
        if not self.settings.internet:
            command.append("--net")
        command += ["--", sys.executable, "-I", "-S", str(AGENT_PATH), json.dumps(config)]
        with open(self.dir / "agent.log", "wb") as log:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=[child_sock.fileno()],
                start_new_session=True,
            )
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
        await asyncio.wait_for(record.done.wait(), 10)

    async def kill(self, wait_for_files: bool = True) -> asyncio.Future | None:
        """End every process of the sandbox (all are gone on return) and remove its files.

        With `wait_for_files=False` the files are removed in the background; the returned future ends then.
        """
        if self.holder and self.holder.alive:
            with contextlib.suppress(OSError):
                await self.freezer.freeze(False, self._root_pid())
            root = self._root_pid()
            for pid in self.freezer.pids(root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # pid 1's death ends every process of the namespace; the holder exits once pid 1 is reaped,
            # so when it has, nothing of the sandbox is left. (Killing the holder first would not wait.)
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(root, signal.SIGKILL)  # type: ignore[arg-type]
            await self.holder.wait(5)
            if self.holder.alive:
                self.holder.kill()
                await self.holder.wait(5)
        if self.link:
            self.link.close()
        for record in list(self.processes.values()):
            self._finish(record, ExitStatus.from_wait_status(signal.SIGKILL))
        removal = asyncio.get_running_loop().run_in_executor(None, self._remove_files)
        if wait_for_files:
            await removal
            return None
        return removal

    def _remove_files(self) -> None:
        for _ in range(50):
            self.freezer.remove()
            if not self.freezer.path or not self.freezer.path.exists():
                break
            time.sleep(0.02)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _root_pid(self) -> int | None:
        if not self.holder:
            return None
        try:
            children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text().split()
            return int(children[0]) if children else None
        except OSError:
            return None

    async def freeze(self) -> None:
        await self.freezer.freeze(True, self._root_pid())

    async def thaw(self) -> None:
        await self.freezer.freeze(False, self._root_pid())

    # --- ports ------------------------------------------------------------------------------
    async def connect(self, port: int, timeout: float = 10.0) -> socket.socket:
        """A connected, non-blocking TCP socket to `port` on the sandbox's loopback."""
        result, fds = await self._call("connect", port=port)
        sock = socket.socket(fileno=fds[0])
        if result["pending"]:  # type: ignore[index]
            loop = asyncio.get_running_loop()
            writable = loop.create_future()
            loop.add_writer(sock.fileno(), writable.set_result, None)
            try:
                await asyncio.wait_for(writable, timeout)
            except BaseException:
                sock.close()
                raise
            finally:
                loop.remove_writer(sock.fileno())
            if err := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                sock.close()
                raise AgentError(os.strerror(err), err)
        return sock

    async def apply_egress(self, rules: EgressRules) -> None:
        """Enforce egress rules in the sandbox's network stack; this box shares the host's, so it cannot."""
        raise AgentError("the sandbox shares the host's network stack, where rules cannot be applied", errno.ENOSYS)

    # --- filesystem-only pause --------------------------------------------------------------
    async def power_off(self) -> Path:
        """End the sandbox but keep its root's changes (returned): a pause without memory."""
        self.on_exit = None  # not an exit of the sandbox: it is paused
        await self.freeze()
        kept = self.dir.parent / f"{self.name}.upper"
        os.rename(self.dir / "upper", kept)  # frozen: nothing writes while the upper layer moves
        await self.kill()
        return kept

    async def power_on(self, hostname: str, kept: Path) -> None:
        """Cold-boot this (new) box on the root's changes kept by `power_off`: new processes, a new boot id."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.rename(kept, self.dir / "upper")
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
    def usage(self) -> tuple[float, int, int]:
        """(cpu percent since the previous sample, resident memory bytes, disk bytes written)."""
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        cpu_seconds, rss = 0.0, 0
        for pid in self.freezer.pids(self._root_pid()):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                cpu_seconds += (int(fields[11]) + int(fields[12])) / ticks
                rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        now = time.monotonic()
        percent = 0.0
        if self._cpu_sample:
            elapsed = now - self._cpu_sample[0]
            if elapsed > 0:
                percent = max(0.0, (cpu_seconds - self._cpu_sample[1]) / elapsed * 100 / (os.cpu_count() or 1))
        self._cpu_sample = (now, cpu_seconds)
        return percent, rss, _tree_size(self.dir / "upper")

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
            return
        self._close_output(record, fd)
        self._maybe_finish(record)

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
            # Such an endpoint ends a command shortly after its process exits, whatever is still to come.
            asyncio.get_running_loop().call_later(END_ON_EXIT_GRACE_S, self._finish, record, record.exit)
        self._maybe_finish(record)

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
        record.publish(("end" if self.running else "gone", status))
        record.done.set()
        record.reaped.set()
        for callback in record.done_callbacks:
            callback()
        self.processes.pop(record.pid, None)

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
        """A non-blocking fd of a file to download, opened with the user's rights; magic links refused."""
        result, fds = await self._call("read_open", path=path, user=user)
        return fds[0], result  # type: ignore[return-value]

    async def open_write(self, path: str, user: str, metadata: dict[str, str]) -> int:
        """A file opened for an upload as envd opens it: by root, then owned by the user."""
        _, fds = await self._call("write_open", path=path, user=user, metadata=metadata)
        return fds[0]

    async def fs(self, op: str, **fields: object) -> object:
        return await self._call_result(op, **fields)

    async def watch(self, path: str, recursive: bool, user: str) -> tuple[int, int, dict[int, str]]:
        result, fds = await self._call("watch", path=path, recursive=recursive, user=user)
        return result["watch"], fds[0], {int(k): v for k, v in result["paths"].items()}

    async def _call(self, op: str, fds: list[int] = (), **fields: object) -> tuple[object, list[int]]:  # type: ignore[assignment]
        if self.link is None:
            raise AgentGone("sandbox is not running")
        return await self.link.call(op, fds, **fields)

    async def _call_result(self, op: str, fds: list[int] = (), **fields: object):  # type: ignore[assignment]
        if self.link is None:
            raise AgentGone("sandbox is not running")
        return await self.link.result(op, fds, **fields)


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total
