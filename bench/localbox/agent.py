"""The in-sandbox agent: pid 1 of one sandbox.

Started by the server as ``unshare --mount --pid --uts --ipc [--net] --fork -- python -I -S agent.py CONFIG``
with a SOCK_SEQPACKET control socket on fd 3. It mounts the sandbox root (overlayfs over the template),
enters it with pivot_root, then serves requests: spawn processes and open files *inside* the sandbox,
handing the resulting file descriptors back to the server (SCM_RIGHTS). As pid 1 it also reaps orphans.

Runs with the standard library only and imports everything before pivot_root: after that, the host's
library directory is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import grp
import json
import os
import platform
import pwd
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import time

MAX_MESSAGE = 1 << 20

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.setfsuid.argtypes = [ctypes.c_uint]
libc.setfsgid.argtypes = [ctypes.c_uint]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.inotify_init1.argtypes = [ctypes.c_int]
libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}[platform.machine()]

# Capabilities a sandbox's root keeps: a container runtime's usual default set, without mknod.
KEPT_CAPS = {0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31}  # chown dac_override fowner fsetid kill setgid
# setuid setpcap net_bind_service net_raw sys_chroot audit_write setfcap
LAST_CAP = 40

IN_EVENTS = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x8  # modify attrib moved_from moved_to create delete close_write


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(
        libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {fstype or 'bind'} {source} on {target}",
    )


def setup_root(config: dict) -> None:
    """Mount the sandbox's root and make it the root of this mount namespace."""
    merged = config["merged"]
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    options = f"lowerdir={config['lower']},upperdir={config['upper']},workdir={config['work']}"
    mount("overlay", merged, "overlay", 0, options)
    mount("proc", f"{merged}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    dev = f"{merged}/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=64k")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        open(f"{dev}/{name}", "w").close()
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    os.mkdir(f"{dev}/pts")
    mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    os.symlink("pts/ptmx", f"{dev}/ptmx")
    os.mkdir(f"{dev}/shm", 0o1777)
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{dev}/{name}")
    os.symlink("/proc/self/fd/1", f"{dev}/stdout")
    os.symlink("/proc/self/fd/2", f"{dev}/stderr")
    os.chdir(merged)
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def drop_capabilities() -> None:
    for cap in range(LAST_CAP + 1):
        if cap not in KEPT_CAPS:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


class Creds(contextlib.AbstractContextManager):
    """Filesystem credentials of a sandbox user for the duration of one file operation."""

    def __init__(self, uid: int, gid: int, groups: list[int]) -> None:
        self.uid, self.gid, self.groups = uid, gid, groups

    def __enter__(self) -> Creds:
        if self.uid != 0:
            os.setgroups(self.groups)
            libc.setfsgid(self.gid)
            libc.setfsuid(self.uid)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.uid != 0:
            libc.setfsuid(0)
            libc.setfsgid(0)
            os.setgroups([])


_users: dict[str, tuple[tuple[float, float], tuple[int, int, list[int], str]]] = {}


def user_ids(name: str) -> tuple[int, int, list[int], str]:
    """uid, gid, groups and home of a user; cached until /etc/passwd or /etc/group change (useradd)."""
    try:
        stamp = (os.stat("/etc/passwd").st_mtime, os.stat("/etc/group").st_mtime)
    except OSError:
        stamp = (0.0, 0.0)
    cached = _users.get(name)
    if cached and cached[0] == stamp:
        return cached[1]
    entry = pwd.getpwnam(name)
    groups = sorted({g.gr_gid for g in grp.getgrall() if name in g.gr_mem} | {entry.pw_gid})
    ids = (entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)
    _users[name] = (stamp, ids)
    return ids


def as_user(argv: list[str], uid: int, gid: int, groups: list[int]) -> list[str]:
    """The pty path's user switch: done by the exec'd program, since that path forks a Python anyway."""
    if uid == 0 and gid == 0:
        return argv
    group_arg = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", group_arg, "--", *argv]


# A command starts with every signal at its default and none blocked, as a process envd starts does;
# the agent itself ignores SIGTERM/SIGINT/SIGHUP, and ignored signals survive exec.
DEFAULT_SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


def find_program(name: str, env: dict[str, str]) -> str:
    """`name` looked up in the command's own PATH, as execvpe would."""
    if "/" in name:
        return name
    found = shutil.which(name, path=os.pathsep.join(os.get_exec_path(env)))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "executable file not found in $PATH", name)
    return found


def spawn_as(
    argv: list[str], env: dict[str, str], cwd: str, ids: tuple[int, int, list[int]], stdio: list[int], session: bool
) -> int:
    """posix_spawn (vfork + exec: no Python runs in the child) `argv` as uid/gid/groups; returns the pid.

    posix_spawn cannot switch users, but POSIX_SPAWN_RESETIDS makes the child's effective ids the parent's
    real ones and exec copies them to the saved ids. So for the length of the call the agent (single
    threaded) takes the user's ids as its real ids and groups, keeping root as effective and saved ids, and
    the child comes out exactly as setpriv would leave it: the user's ids everywhere, no capabilities.
    """
    uid, gid, groups = ids
    program = find_program(argv[0], env)
    switch = (uid, gid) != (0, 0)
    # The dup2s run in order: an end already on 0-2 (the agent's own stdio closed) could be overwritten.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) if fd < 3 else fd for fd in stdio]
    os.chdir(cwd)
    try:
        os.setgroups(groups)
        if switch:
            os.setresgid(gid, 0, 0)
            os.setresuid(uid, 0, 0)
        if not os.access(cwd, os.X_OK):  # with the real ids, the user's: envd changes directory after setuid
            raise PermissionError(errno.EACCES, "permission denied", cwd)
        return os.posix_spawn(
            program,
            argv,
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(moved)],
            resetids=switch,
            setsid=session,
            setsigmask=(),
            setsigdef=DEFAULT_SIGNALS,
        )
    finally:
        if switch:
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)
        os.setgroups([])
        os.chdir("/")
        for fd in set(moved) - set(stdio):
            os.close(fd)


BOOT_ID = "/proc/sys/kernel/random/boot_id"
SYS_OPENAT2, AT_FDCWD, RESOLVE_NO_MAGICLINKS = 437, -100, 0x02


PROC_READ_MAX = 16 << 20


def read_here(fd: int) -> int:
    """A copy of what this process reads from `fd` (at most PROC_READ_MAX bytes), in a memfd; `fd` is closed."""
    copy = os.memfd_create("read", os.MFD_CLOEXEC)
    try:
        total = 0
        while total < PROC_READ_MAX:
            try:
                chunk = os.read(fd, min(1 << 16, PROC_READ_MAX - total))
            except BlockingIOError:
                break
            if not chunk:
                break
            os.write(copy, chunk)
            total += len(chunk)
        os.lseek(copy, 0, os.SEEK_SET)
    except BaseException:
        os.close(copy)
        raise
    finally:
        os.close(fd)
    return copy


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_in_sandbox(path: str, flags: int, mode: int = 0) -> int:
    """open(2) refusing magic links (/proc/self/fd/N, /proc/PID/root, ...): they lead to files outside the root."""
    if "\0" in path:
        raise OSError(errno.EINVAL, "path contains a NUL byte", path)
    how = OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_NO_MAGICLINKS)
    fd = libc.syscall(SYS_OPENAT2, AT_FDCWD, path.encode(), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, "a link that leaves the sandbox" if err == errno.ELOOP else os.strerror(err), path)
    return fd


FILE_TYPES = {stat.S_IFREG: "file", stat.S_IFDIR: "directory", stat.S_IFLNK: "symlink"}


def entry_info(path: str) -> dict:
    st = os.lstat(path)
    kind = FILE_TYPES.get(stat.S_IFMT(st.st_mode), "other")
    info = {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode) | (stat.S_IFMT(st.st_mode) == stat.S_IFDIR) * 0o20000000000,
        "permissions": stat.filemode(st.st_mode),
        "owner": _name_of(pwd.getpwuid, st.st_uid),
        "group": _name_of(grp.getgrgid, st.st_gid),
        "mtime_ns": st.st_mtime_ns,
        "metadata": read_metadata(path),
    }
    if kind == "symlink":
        info["symlink_target"] = os.path.realpath(path)
        with contextlib.suppress(OSError):
            target = os.stat(path)
            info["target_type"] = FILE_TYPES.get(stat.S_IFMT(target.st_mode), "other")
    return info


METADATA_PREFIX = "user.e2b."


def read_metadata(path: str) -> dict[str, str]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(METADATA_PREFIX):
            with contextlib.suppress(OSError):
                found[name[len(METADATA_PREFIX) :]] = os.getxattr(path, name, follow_symlinks=False).decode()
    return found


def _name_of(lookup, ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def list_dir(path: str, depth: int) -> list[dict]:
    entries = []
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        info = entry_info(child)
        entries.append(info)
        if depth > 1 and info["type"] == "directory":
            with contextlib.suppress(OSError):
                entries.extend(list_dir(child, depth - 1))
    return entries


def require_dir(path: str) -> None:
    if not os.path.isdir(path):
        if os.path.lexists(path):
            raise NotADirectoryError(errno.ENOTDIR, "path is not a directory", path)
        raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)


def make_dirs(path: str, uid: int, gid: int) -> None:
    """mkdir -p where every directory created belongs to the user."""
    missing = []
    head = path
    while head not in ("/", "") and not os.path.lexists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)
        os.lchown(directory, uid, gid)


class Agent:
    def __init__(self, sock: socket.socket, config: dict) -> None:
        self.sock = sock
        self.config = config
        self.children: set[int] = set()
        self.watches: dict[int, tuple[int, dict[int, str]]] = {}
        self.next_watch = 1
        self.envs: dict[str, str] = {}

    # --- transport -----------------------------------------------------------------------------
    def send(self, message: dict, fds: list[int] = ()) -> None:  # type: ignore[assignment]
        data = json.dumps(message).encode()
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            try:
                readable, _, _ = select.select([self.sock, wake_r], [], [])
            except InterruptedError:
                continue
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                self.reap()
            if self.sock in readable:
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                except InterruptedError:
                    continue
                if not data:
                    return  # the server went away: the sandbox ends with it
                for fd in fds:  # commands are spawned without closing fds: none may be inheritable
                    os.set_inheritable(fd, False)
                self.dispatch(json.loads(data), fds)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.send({"op": "exit", "pid": pid, "status": status})

    def dispatch(self, message: dict, fds: list[int]) -> None:
        op = message["op"]
        reply: dict = {"op": "reply", "id": message.get("id")}
        out_fds: list[int] = []
        try:
            handler = getattr(self, f"op_{op}")
            result = handler(message, fds)
            if isinstance(result, tuple):
                result, out_fds = result
            reply["ok"] = True
            reply["result"] = result
        except OSError as exc:
            reply.update(ok=False, errno=exc.errno, error=exc.strerror or str(exc), filename=exc.filename)
        except Exception as exc:
            reply.update(ok=False, errno=None, error=f"{type(exc).__name__}: {exc}")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.send(reply, out_fds)
        for fd in out_fds:
            os.close(fd)

    # --- operations ----------------------------------------------------------------------------
    def op_ping(self, message: dict, fds: list[int]) -> dict:
        return {"pid": os.getpid()}

    def op_configure(self, message: dict, fds: list[int]) -> dict:
        socket.sethostname(message["hostname"])
        with open("/etc/hostname", "w") as f:
            f.write(message["hostname"] + "\n")
        with open("/etc/hosts", "w") as f:
            f.write(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{message['hostname']}\n")
        for line in message.get("profile", []):
            with open("/etc/profile.d/zz-e2b-bench.sh", "a") as f:
                f.write(line + "\n")
        return {}

    def op_user(self, message: dict, fds: list[int]) -> dict:
        uid, gid, groups, home = user_ids(message["user"])
        return {"uid": uid, "gid": gid, "groups": groups, "home": home}

    def op_spawn(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        uid, gid, groups, home = user_ids(message["user"])
        cwd = message.get("cwd") or home
        env = dict(message["env"])
        if not os.path.isdir(cwd):
            raise FileNotFoundError(errno.ENOENT, "working directory does not exist", cwd)
        if message.get("pty"):
            return self._spawn_pty(message, (uid, gid, groups), cwd, env)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        if message.get("stdin"):
            stdin, in_w = os.pipe2(os.O_CLOEXEC)
            parent_fds = [out_r, err_r, in_w]
        else:
            stdin = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            parent_fds = [out_r, err_r]
        child_fds = [stdin, out_w, err_w]
        try:
            session = bool(message.get("session_leader"))
            pid = spawn_as(message["argv"], env, cwd, (uid, gid, groups), child_fds, session)
        except BaseException:
            for fd in parent_fds:
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        self.children.add(pid)
        return {"pid": pid}, parent_fds

    def _spawn_pty(
        self, message: dict, ids: tuple[int, int, list[int]], cwd: str, env: dict[str, str]
    ) -> tuple[dict, list[int]]:
        """A session leader with the pty as its controlling terminal: that needs code in the child, so a fork."""
        cols, rows = message["pty"]
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

        def preexec() -> None:
            for sig in DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            proc = subprocess.Popen(
                as_user(message["argv"], *ids),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=env,
                preexec_fn=preexec,
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        proc.returncode = 0  # reaped by `reap`, never waited on through this object
        self.children.add(proc.pid)
        return {"pid": proc.pid}, [master]

    def op_signal(self, message: dict, fds: list[int]) -> dict:
        pid = message["pid"]
        if pid not in self.children:
            raise ProcessLookupError(errno.ESRCH, "no such process", str(pid))
        os.kill(pid, message["signal"])
        return {}

    def op_resize(self, message: dict, fds: list[int]) -> dict:
        cols, rows = message["size"]
        fcntl.ioctl(fds[0], termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        return {}

    def _creds(self, message: dict) -> tuple[Creds, int, int, str]:
        uid, gid, groups, home = user_ids(message["user"])
        return Creds(uid, gid, groups), uid, gid, home

    def op_open(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        creds, uid, gid, _ = self._creds(message)
        path = message["path"]
        with creds:
            if message["mode"] == "r":
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    raise IsADirectoryError(errno.EISDIR, "path is a directory", path)
                return {"size": st.st_size}, [fd]
            parent = os.path.dirname(path)
            if not os.path.isdir(parent):
                make_dirs(parent, uid, gid)
            if os.path.isdir(path):
                raise IsADirectoryError(errno.EISDIR, "path is a directory", path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            with contextlib.suppress(PermissionError):
                os.fchown(fd, uid, gid)
            for key, value in (message.get("metadata") or {}).items():
                os.setxattr(fd, METADATA_PREFIX + key, value.encode())
            return {}, [fd]

    def op_stat(self, message: dict, fds: list[int]) -> dict:
        with self._creds(message)[0]:
            return entry_info(message["path"])

    def op_list(self, message: dict, fds: list[int]) -> list[dict]:
        with self._creds(message)[0]:
            path = message["path"]
            require_dir(path)
            return list_dir(path, message.get("depth", 1))

    def op_mkdir(self, message: dict, fds: list[int]) -> dict:
        creds, uid, gid, _ = self._creds(message)
        path = message["path"]
        with creds:
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, "directory already exists", path)
            make_dirs(path, uid, gid)
            return entry_info(path)

    def op_move(self, message: dict, fds: list[int]) -> dict:
        creds, uid, gid, _ = self._creds(message)
        with creds:
            parent = os.path.dirname(message["destination"])
            if not os.path.isdir(parent):
                make_dirs(parent, uid, gid)
            os.rename(message["source"], message["destination"])
            return entry_info(message["destination"])

    def op_remove(self, message: dict, fds: list[int]) -> dict:
        with self._creds(message)[0]:
            path = message["path"]
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            return {}

    def op_watch(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        with self._creds(message)[0]:
            path = message["path"]
            require_dir(path)
            fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            paths: dict[int, str] = {}
            dirs = [path]
            if message.get("recursive"):
                for root, subdirs, _ in os.walk(path):
                    dirs.extend(os.path.join(root, d) for d in subdirs)
            for directory in dirs:
                wd = libc.inotify_add_watch(fd, directory.encode(), IN_EVENTS)
                if wd >= 0:
                    paths[wd] = directory
            watch_id = self.next_watch
            self.next_watch += 1
            self.watches[watch_id] = (fd, paths)
            # The server reads a duplicate; this copy stays open so later subdirectories can be added.
            return {"watch": watch_id, "paths": {str(k): v for k, v in paths.items()}}, [os.dup(fd)]

    def op_watch_add(self, message: dict, fds: list[int]) -> dict:
        fd, paths = self.watches[message["watch"]]
        added = {}
        for root, subdirs, _ in os.walk(message["path"]):
            for directory in [root, *(os.path.join(root, d) for d in subdirs)]:
                wd = libc.inotify_add_watch(fd, directory.encode(), IN_EVENTS)
                if wd >= 0:
                    paths[wd] = directory
                    added[str(wd)] = directory
        return {"paths": added}

    def op_watch_close(self, message: dict, fds: list[int]) -> dict:
        entry = self.watches.pop(message["watch"], None)
        if entry:
            os.close(entry[0])
        return {}

    def op_boot_id(self, message: dict, fds: list[int]) -> dict:
        """A boot id of this boot of this sandbox, where the kernel's own would be the same for all."""
        source = "/dev/.boot_id"
        with open(source, "w") as f:
            f.write(message["boot_id"] + "\n")
        os.chmod(source, 0o444)
        if not os.path.ismount(BOOT_ID):
            mount(source, BOOT_ID, None, MS_BIND)
        return {}

    def op_connect(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """A TCP connection to a port of the sandbox's own loopback, handed to the server (E2B's port proxy)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        err = sock.connect_ex(("127.0.0.1", int(message["port"])))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(err, os.strerror(err), f"127.0.0.1:{message['port']}")
        return {"pending": err == errno.EINPROGRESS}, [sock.detach()]

    def op_read_open(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """A file to download, opened non-blocking (a FIFO without a writer reads as empty, never hangs)."""
        with self._creds(message)[0]:
            fd = open_in_sandbox(message["path"], os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, "path is a directory", message["path"])
        stat_size = st.st_size
        if stat.S_ISREG(st.st_mode) and st.st_dev == os.stat("/proc").st_dev:
            fd = read_here(fd)  # what a /proc file says depends on who reads it: the sandbox, not the server
            st = os.fstat(fd)
        return {"size": st.st_size, "stat_size": stat_size, "regular": stat.S_ISREG(st.st_mode)}, [fd]

    def op_write_open(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """envd's upload: parents made for the user, the file opened by root and given to the user.

        The upload's metadata replaces the file's (none clears it). Only regular files are written:
        opening a FIFO would wait for a reader.
        """
        uid, gid, _, _ = user_ids(message["user"])
        path = message["path"]
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            make_dirs(parent, uid, gid)
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "path is a directory", path)
        fd = open_in_sandbox(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            os.fchown(fd, uid, gid)
            for name in os.listxattr(fd):
                if name.startswith(METADATA_PREFIX):
                    os.removexattr(fd, name)
            for key, value in (message.get("metadata") or {}).items():
                os.setxattr(fd, METADATA_PREFIX + key, value.encode())
        except BaseException:
            os.close(fd)
            raise
        return {}, [fd]


def run_agent(config: dict) -> None:
    """Become the sandbox: join its cgroup, mount and enter its root, serve the server's requests."""
    sock = socket.socket(fileno=config["control_fd"])
    sock.set_inheritable(False)
    try:
        for path in config.get("cgroup_procs") or []:
            with open(path, "w") as f:
                f.write("0")
        setup_root(config)
        drop_capabilities()
        os.environ.clear()
    except Exception as exc:  # reported to the server, which turns it into a clear create error
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"op": "failed", "error": str(exc)}).encode())
        time.sleep(0.05)
        raise
    Agent(sock, config).serve()


CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_SET_PDEATHSIG = 1
libc.unshare.argtypes = [ctypes.c_int]


def start_sandbox(config: dict) -> None:
    """In a fresh child of the zygote: new namespaces, then pid 1 of them, as `unshare --fork --kill-child`."""
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | (CLONE_NEWNET if config.get("net") else 0)
    _check(libc.unshare(flags), "unshare")
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            run_agent(config)
        finally:
            os._exit(0)
    os.close(config["control_fd"])
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def zygote(control_fd: int) -> None:
    """Fork-server: sandboxes are forked from this already-started interpreter (a fresh one costs ~60 ms)."""
    sock = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
        if sock in readable:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            if not data:
                return  # the server is gone: sandboxes already started live on until theirs closes
            config = json.loads(data)
            config["control_fd"] = fds[0]
            pid = os.fork()
            if pid == 0:
                sock.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                try:
                    start_sandbox(config)
                finally:
                    os._exit(1)
            os.close(fds[0])
            sock.send(json.dumps({"pid": pid}).encode())


def main() -> None:
    if sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]))
        return
    run_agent(json.loads(sys.argv[1]))


if __name__ == "__main__":
    try:
        main()
    except Exception:
        sys.exit(1)
