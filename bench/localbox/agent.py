"""The in-sandbox agent: pid 1 of one sandbox.

Forked from the fork-server (``agent.py --zygote``) or started as ``python -I -S agent.py --launch CONFIG``,
with a SOCK_SEQPACKET control socket. The launched process enters a user namespace of its own (sandbox
root is an unprivileged host uid of a subordinate range), new mount/pid/uts/ipc/net namespaces owned by
it, and forks pid 1, which mounts the sandbox root (overlayfs over an idmapped template), enters it with
pivot_root, then serves requests: spawn processes and open files *inside* the sandbox, handing the
resulting file descriptors back to the server (SCM_RIGHTS). As pid 1 it also reaps orphans.

Runs with the standard library only and imports everything before pivot_root: after that, the import
path is emptied, so no module of the sandbox's can ever be loaded into pid 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import os
import platform
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios

MAX_MESSAGE = 1 << 20
MAX_LAYERS = 64  # lower layers of a sandbox's root

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.setfsuid.argtypes = [ctypes.c_uint]
libc.setfsgid.argtypes = [ctypes.c_uint]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.inotify_init1.argtypes = [ctypes.c_int]
libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
libc.syscall.restype = ctypes.c_long

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_CAP_AMBIENT = 4, 24, 22, 47
MACHINE = platform.machine()
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}[MACHINE]
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every architecture
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 0x1, 0x4, 0x100000
MOVE_MOUNT_F_EMPTY_PATH = 4
AT_FDCWD = -100

# Capabilities a sandbox's root keeps (in the sandbox's own user namespace; none in the host's): a container
# runtime's usual default set, without mknod and net_raw (hand-made frames would pass under every packet filter).
KEPT_CAPS = {0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31}  # chown dac_override fowner fsetid kill setgid
# setuid setpcap net_bind_service sys_chroot audit_write setfcap
LAST_CAP = 40

# modify attrib moved_from moved_to create delete close_write delete_self move_self
IN_EVENTS = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x8 | 0x400 | 0x800

# /proc paths that reveal or change the host, as container runtimes hide them: files get /dev/null over
# them, directories an empty read-only tmpfs; the rest are read-only.
MASKED_PROC_FILES = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "sysrq-trigger", "kallsyms")
MASKED_PROC_DIRS = ("acpi", "asound", "scsi", "firmware", "driver")
READ_ONLY_PROC = ("sys", "bus", "fs", "irq")


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


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


def idmapped_template(lower: str, userns_pid: int) -> int:
    """A detached, read-only copy of the template's mount whose files show the sandbox's ids (host root only)."""
    fd = _check(
        libc.syscall(SYS_OPEN_TREE, AT_FDCWD, lower.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE),
        "open_tree of the template",
    )
    userns = os.open(f"/proc/{userns_pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        flags = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV  # setuid stays: sudo is in the template
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", flags, 0, 0, userns))
        _check(
            libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, attr, 32),
            "idmapped mount of the template (needs Linux 5.19+ and a file system that supports it)",
        )
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.close(userns)
    return fd


def setup_root(lower_fds: list[int]) -> None:
    """Mount the sandbox's root (cwd: the box directory) and make it the root of this mount namespace."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    layers = []
    for n, fd in enumerate(lower_fds):
        target = f"lower/{n}"
        os.mkdir(target)
        _check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH), "move_mount")
        os.close(fd)
        layers.append(target)
    # userxattr: overlayfs keeps its own attributes in user.* xattrs, the only ones a user namespace may set.
    mount("overlay", "merged", "overlay", 0, f"lowerdir={':'.join(layers)},upperdir=upper,workdir=work,userxattr")
    mount("proc", "merged/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount_own_cgroup("merged/sys/fs/cgroup")
    dev = "merged/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
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
    # Each boot has its own boot id (the kernel's is the host's): a file of /dev bound over it, rewritten per boot.
    with open(f"{dev}/.boot_id", "w") as f:
        f.write(random_uuid() + "\n")
    os.chmod(f"{dev}/.boot_id", 0o444)
    mount(f"{dev}/.boot_id", f"merged{BOOT_ID}", None, MS_BIND)
    mask_proc("merged/proc")
    os.chdir("merged")
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def mount_own_cgroup(target: str) -> None:
    """The sandbox's own cgroups (the root of its cgroup namespace), read-only, where a VM's guest sees its own
    CPU and memory: the unified hierarchy on a cgroup v2 host, the cpu and memory hierarchies on a v1 host."""
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    wanted: list[tuple[str, str, str | None]]
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        wanted = [("cgroup2", target, None)]
    else:
        with open("/proc/self/mounts") as mounts:
            found = [line.split() for line in mounts]
        hierarchies = [
            (point, [o for o in options.split(",") if o in ("cpu", "cpuacct", "memory")])
            for _, point, kind, options, *_ in found
            if kind == "cgroup" and point.startswith("/sys/fs/cgroup/")
        ]
        wanted = [
            ("cgroup", f"{target}/{os.path.basename(point)}", ",".join(controllers))
            for point, controllers in hierarchies
            if {"cpu", "memory"} & set(controllers)
        ]
    for kind, path, controller in wanted:
        os.makedirs(path, exist_ok=True)
        with contextlib.suppress(OSError):  # a kernel that refuses it leaves the sandbox as it was
            mount(kind, path, kind, flags, controller)


def random_uuid() -> str:
    """A random (version 4) UUID, as the kernel writes a boot id."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def mask_proc(proc: str) -> None:
    for name in MASKED_PROC_FILES:
        if os.path.isfile(f"{proc}/{name}"):
            mount("/dev/null", f"{proc}/{name}", None, MS_BIND)
    for name in MASKED_PROC_DIRS:
        if os.path.isdir(f"{proc}/{name}"):
            mount("tmpfs", f"{proc}/{name}", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0")
    for name in READ_ONLY_PROC:
        path = f"{proc}/{name}"
        if os.path.isdir(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(path, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def set_capabilities(effective: set[int], permitted: set[int]) -> None:
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    for cap in range(LAST_CAP + 1):
        word, bit = divmod(cap, 32)
        if cap in permitted:
            data[word].permitted |= 1 << bit
        if cap in effective:
            data[word].effective |= 1 << bit
    _check(libc.capset(ctypes.byref(header), data), "capset")


def drop_capabilities() -> None:
    """Commands (sudo included) can gain at most KEPT_CAPS; pid 1 keeps them only as permitted ones."""
    for cap in range(LAST_CAP + 1):
        if cap not in KEPT_CAPS:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    set_capabilities(set(), KEPT_CAPS)


# --- seccomp: the usual container defaults, as a deny list ----------------------------------------------
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[MACHINE]
DENIED_SYSCALLS = {  # name: (x86_64, aarch64); refused with EPERM
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "unshare": (272, 97),
    "setns": (308, 268), "move_mount": (429, 429), "open_tree": (428, 428), "fsopen": (430, 430),
    "fsmount": (432, 432), "fsconfig": (431, 431), "fspick": (433, 433), "mount_setattr": (442, 442),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "perf_event_open": (298, 241),
    "userfaultfd": (323, 282), "open_by_handle_at": (304, 265), "acct": (163, 89), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "settimeofday": (164, 170), "clock_settime": (227, 112),
    "clock_adjtime": (305, 266), "adjtimex": (159, 171), "quotactl": (179, 60), "lookup_dcookie": (212, 18),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "syslog": (103, 116), "vhangup": (153, 58), "nfsservctl": (180, 42), "pidfd_getfd": (438, 438),
}  # fmt: skip
SYS_CLONE, SYS_CLONE3 = {"x86_64": (56, 435), "aarch64": (220, 435)}[MACHINE]
SYS_SOCKET = {"x86_64": 41, "aarch64": 198}[MACHINE]
AF_INET, AF_INET6, AF_PACKET, AF_VSOCK = 2, 10, 17, 40
SOCK_RAW, SOCK_PACKET, SOCK_TYPE_MASK = 3, 10, 0xF  # the type's low bits (NONBLOCK and CLOEXEC are flags above)
CLONE_NEW_ANY = 0x7E020080  # newns newcgroup newuts newipc newuser newpid newnet newtime
X32_SYSCALL_BIT = 0x40000000
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000


def seccomp_program() -> bytes:
    """Classic BPF: another architecture is killed, denied calls and namespace-making clones get EPERM, clone3
    ENOSYS (its flags are out of a filter's reach; libc then falls back to clone); so do packet sockets and
    raw inet sockets (a second lock on hand-made frames, after the missing CAP_NET_RAW), and vsock sockets (the
    host's virtual machine sockets, which a sandbox has no business reaching)."""
    ld, jeq, jset, jge, ret, and_ = 0x20, 0x15, 0x45, 0x35, 0x06, 0x54
    column = 0 if MACHINE == "x86_64" else 1
    denied = sorted({numbers[column] for numbers in DENIED_SYSCALLS.values()})
    rows: list[tuple[int, int | str, int, int] | str] = [
        (ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH), (ret, 0, 0, RET_KILL_PROCESS),
        (ld, 0, 0, 0), (jge, "eperm", 0, X32_SYSCALL_BIT),
        *((jeq, "eperm", 0, nr) for nr in denied),
        (jeq, "enosys", 0, SYS_CLONE3), (jeq, "clone", 0, SYS_CLONE), (jeq, "socket", 0, SYS_SOCKET),
        (ret, 0, 0, RET_ALLOW),
        "clone", (ld, 0, 0, 16), (jset, "eperm", 0, CLONE_NEW_ANY), (ret, 0, 0, RET_ALLOW),
        "socket", (ld, 0, 0, 16), (jeq, "eperm", 0, AF_PACKET), (jeq, "eperm", 0, AF_VSOCK),
        (jeq, "inet", 0, AF_INET), (jeq, "inet", 0, AF_INET6), (ret, 0, 0, RET_ALLOW),
        "inet", (ld, 0, 0, 24), (and_, 0, 0, SOCK_TYPE_MASK),
        (jeq, "eperm", 0, SOCK_RAW), (jeq, "eperm", 0, SOCK_PACKET), (ret, 0, 0, RET_ALLOW),
        "eperm", (ret, 0, 0, RET_ERRNO | errno.EPERM),
        "enosys", (ret, 0, 0, RET_ERRNO | errno.ENOSYS),
    ]  # fmt: skip
    labels: dict[str, int] = {}
    program: list[tuple[int, int | str, int, int]] = []
    for row in rows:
        if isinstance(row, str):
            labels[row] = len(program)
        else:
            program.append(row)
    return b"".join(
        struct.pack("HBBI", c, labels[jt] - i - 1 if isinstance(jt, str) else jt, jf, k)
        for i, (c, jt, jf, k) in enumerate(program)
    )


def install_seccomp() -> None:
    program = seccomp_program()
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog)
    # Installed with CAP_SYS_ADMIN of the sandbox's user namespace rather than no_new_privs, which every
    # command would inherit: it would turn setuid off, and sudo with it.
    _check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fprog_buffer), 0, 0), "seccomp")


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


_databases: dict[str, tuple[tuple[int, int], list[list[str]]]] = {}


def read_database(path: str) -> list[list[str]]:
    """The rows of /etc/passwd or /etc/group, read as plain files and cached until they change.

    Never through libc's NSS: that would load whatever libraries the sandbox's nsswitch.conf names into pid 1.
    """
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_ino)
    except OSError:
        return []
    cached = _databases.get(path)
    if cached and cached[0] == stamp:
        return cached[1]
    text = read_bounded(path, DATABASE_MAX).decode("utf-8", errors="replace")
    rows = [line.split(":") for line in text.split("\n") if line.count(":") >= 3 and not line.startswith("#")]
    _databases[path] = (stamp, rows)
    return rows


DATABASE_MAX = 4 << 20  # bytes of /etc/passwd or /etc/group pid 1 reads: a sandbox user can replace either


def read_bounded(path: str, limit: int) -> bytes:
    """A regular file of at most `limit` bytes, whole; anything else (a FIFO, which would block pid 1 forever, a
    device, a file larger than the limit, which could exhaust its memory) is an error naming the limit."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open does not wait for a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file: pid 1 reads no other kind", path)
        data = b""
        while st.st_size <= limit and len(data) <= limit and (piece := os.read(fd, limit + 1 - len(data))):
            data += piece
        if st.st_size > limit or len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes, which is all pid 1 reads of it", path)
        return data
    finally:
        os.close(fd)


def user_ids(name: str) -> tuple[int, int, list[int], str]:
    """uid, gid, groups and home of a user, as /etc/passwd and /etc/group say now (useradd included)."""
    for row in read_database("/etc/passwd"):
        if row[0] == name and len(row) >= 6 and row[2].isdigit() and row[3].isdigit():
            uid, gid = int(row[2]), int(row[3])
            members = {int(g[2]) for g in read_database("/etc/group") if g[2].isdigit() and name in g[3].split(",")}
            return uid, gid, sorted(members | {gid}), row[5]
    raise KeyError(f"getpwnam(): name not found: '{name}'")


def name_of(database: str, ident: int) -> str:
    for row in read_database(database):
        if row[2] == str(ident):
            return row[0]
    return str(ident)


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

    The child may run before this returns, so for a user the agent drops its effective capabilities before
    the spawn (nothing left needs them: the ids go back to root as the saved ones, the groups are reset by
    the next operation): a command that reads /proc/1/status sees none. A root command needs them for the
    exec, as root's search of directories it does not own goes through CAP_DAC_*.
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
        if switch:
            set_capabilities(set(), KEPT_CAPS)
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
        if switch:  # back to the saved ids: allowed without a capability
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)
        else:
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
        "owner": name_of("/etc/passwd", st.st_uid),
        "group": name_of("/etc/group", st.st_gid),
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
        sources: list[socket.socket | int] = [self.sock, wake_r]
        while True:
            try:
                readable, _, _ = select.select(sources, [], [])
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
            set_capabilities(KEPT_CAPS, KEPT_CAPS)  # effective only while an operation runs
            os.setgroups([])  # a spawn for a user leaves the user's groups behind
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
            set_capabilities(set(), KEPT_CAPS)
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
        if socket.gethostname() != message["hostname"]:  # set at start, while pid 1 could
            raise PermissionError(errno.EPERM, "the hostname is set when the sandbox starts")
        with open("/etc/hostname", "w") as f:
            f.write(message["hostname"] + "\n")
        with open("/etc/hosts", "w") as f:
            f.write(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{message['hostname']}\n")
        if message.get("nameserver"):
            with contextlib.suppress(OSError), open("/etc/resolv.conf", "w") as f:
                f.write(f"nameserver {message['nameserver']}\n")
        for line in message.get("profile", []):
            with open("/etc/profile.d/zz-e2b-bench.sh", "a") as f:
                f.write(line + "\n")
        for path in message.get("hide", []):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
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

    # envd's filesystem RPCs (internal/services/filesystem: stat.go, dir.go, move.go, remove.go, watch.go) act as
    # root: the request's user only expands `~` and relative paths and owns the directories they make
    # (permissions.EnsureDirs). So do these: a user may stat, list, watch, move and remove what it could not itself.

    def op_stat(self, message: dict, fds: list[int]) -> dict:
        return entry_info(message["path"])

    def op_list(self, message: dict, fds: list[int]) -> list[dict]:
        path = message["path"]
        require_dir(path)
        return list_dir(path, message.get("depth", 1))

    def op_mkdir(self, message: dict, fds: list[int]) -> dict:
        uid, gid, _, _ = user_ids(message["user"])
        path = message["path"]
        if os.path.isdir(path):  # envd stats through links (dir.go MakeDir): a link to a directory is one
            raise FileExistsError(errno.EEXIST, "directory already exists", path)
        if os.path.lexists(path):  # envd: invalid_argument, which the SDKs raise, where a directory gives False
            raise NotADirectoryError(errno.ENOTDIR, "path already exists but it is not a directory", path)
        make_dirs(path, uid, gid)
        return entry_info(path)

    def op_move(self, message: dict, fds: list[int]) -> dict:
        uid, gid, _, _ = user_ids(message["user"])
        parent = os.path.dirname(message["destination"])
        if not os.path.isdir(parent):
            make_dirs(parent, uid, gid)
        os.rename(message["source"], message["destination"])
        return entry_info(message["destination"])

    def op_remove(self, message: dict, fds: list[int]) -> dict:
        path = message["path"]
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return {}

    def op_watch(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
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
        with open("/dev/.boot_id", "w") as f:  # bound over BOOT_ID by setup_root
            f.write(message["boot_id"] + "\n")
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
        """A regular file to download (through links or not), as envd serves only those: a device, FIFO or
        socket is refused before it is opened (opening one can act, reading one need never end), and again
        after, should the path have changed in between. Opened non-blocking, so nothing here waits.

        Opened by root, whoever asks: envd's GetFiles (internal/api/download.go) looks the user up only to expand
        `~` and relative paths, then opens the file itself, so a user downloads what only root may read."""
        path = message["path"]
        found = open_in_sandbox(path, os.O_PATH)  # names the file without opening it
        try:
            _refuse_irregular(os.fstat(found).st_mode, path)
        finally:
            os.close(found)
        fd = open_in_sandbox(path, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        try:
            _refuse_irregular(st.st_mode, path)
        except OSError:
            os.close(fd)
            raise
        stat_size = st.st_size
        if stat.S_ISREG(st.st_mode) and st.st_dev == os.stat("/proc").st_dev:
            fd = read_here(fd)  # what a /proc file says depends on who reads it: the sandbox, not the server
            st = os.fstat(fd)
        return {"size": st.st_size, "stat_size": stat_size, "regular": stat.S_ISREG(st.st_mode)}, [fd]

    def op_write_open(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """envd's upload: parents made for the user, the file opened by root and given to the user.

        The upload's metadata replaces the file's (none clears it). Only regular files are written:
        opening a FIFO would wait for a reader. An existing file keeps its contents: the server writes over
        them and cuts the file where its data ends (`created` says whether there is anything to cut), which
        spares freeing its pages here and allocating them again for the same bytes.
        """
        uid, gid, _, _ = user_ids(message["user"])
        path = message["path"]
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            make_dirs(parent, uid, gid)
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "path is a directory", path)
        fd, created = open_upload(path)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            os.set_blocking(fd, True)
            if message.get("truncate_first"):  # the extra_write_event quirk: a WRITE before the chown's CHMOD
                os.ftruncate(fd, 0)
            # envd's order, as a watcher sees it: a new file CREATE, CHMOD (the chown), then the data's WRITE; an
            # existing one CHMOD, then WRITE (envd chowns, then opens with O_TRUNC; here the data's writes and the
            # server's cut at its end).
            os.fchown(fd, uid, gid)
            for name in os.listxattr(fd):
                if name.startswith(METADATA_PREFIX):
                    os.removexattr(fd, name)
            for key, value in (message.get("metadata") or {}).items():
                os.setxattr(fd, METADATA_PREFIX + key, value.encode())
        except BaseException:
            os.close(fd)
            raise
        return {"created": created}, [fd]


def open_upload(path: str) -> tuple[int, bool]:
    """An upload's file opened for writing (non-blocking: a FIFO without a reader fails instead of waiting),
    and whether this open created it: a new file is never truncated, so no WRITE precedes its data's."""
    for _ in range(3):
        try:
            return open_in_sandbox(path, os.O_WRONLY | os.O_NONBLOCK), False
        except FileNotFoundError:
            pass
        try:
            return open_in_sandbox(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK, 0o644), True
        except FileExistsError:
            pass  # made in between by the sandbox: open it as an existing file
    # A dangling link (O_EXCL does not follow it) or a path that keeps changing: created through, as envd's open.
    return open_in_sandbox(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644), True


def _refuse_irregular(mode: int, path: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "path is a directory", path)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file", path)


def run_agent(config: dict, sock: socket.socket, lower_fds: list[int]) -> None:
    """Pid 1: mount and enter the sandbox's root, give up what it needs no more, serve the server's requests."""
    try:
        setup_root(lower_fds)
        socket.sethostname(config["hostname"])
        loopback_up()
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):  # the server's stdio is a host file: not for a sandbox's pid 1
            os.dup2(null, fd)
        os.close(null)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/1/fd, /proc/1/mem by the sandbox
        install_seccomp()
        drop_capabilities()
        os.environ.clear()
        sys.path.clear()  # a module imported from now on would be the sandbox's: none is, and none can be
        sys.path_importer_cache.clear()
    except Exception as exc:  # reported to the server, which turns it into a clear create error
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"op": "failed", "error": str(exc)}).encode())
        raise
    Agent(sock, config).serve()


CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x20000000, 0x40000000, 0x10000000
CLONE_NEWCGROUP = 0x02000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
libc.unshare.argtypes = [ctypes.c_int]


def map_ids(config: dict, sync: socket.socket) -> None:
    """Host root's half of entering a user namespace: once the sandbox's holder has unshared its user
    namespace, write its id maps and send it the template mounted with those ids."""
    holder = os.getppid()
    if sync.recv(1) != b"u":
        return
    base, count = config["ids"]
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder}/{name}", "w") as f:
                f.write(f"0 {base} {count}\n")
        # Layers in overlay's lowerdir order (a snapshot's copy, ..., the template), each owned by ids 0..count.
        fds = [idmapped_template(layer, holder) for layer in config["lower"].split(":")]
    except OSError as exc:
        sync.send(f"e{exc}".encode())
        return
    socket.send_fds(sync, [b"m"], fds)


def unshare_as(owner: int) -> None:
    """Unshare a user namespace owned by host uid and gid `owner` (the sandbox's root), not host root: what runs
    in it is charged to that uid where the kernel counts per user (inotify instances and watches, fanotify
    groups, POSIX message queues, pending signals, user namespaces, processes), so a sandbox exhausting its share
    leaves every other sandbox and host root theirs. The saved ids stay root's until the namespace exists:
    where the host refuses unprivileged user namespaces, it is made as host root after all (charged to root)."""
    os.setgroups([])
    os.setresgid(owner, owner, 0)
    os.setresuid(owner, owner, 0)
    made = libc.unshare(CLONE_NEWUSER) == 0
    refused = ctypes.get_errno()
    if not made:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)
        if refused not in (errno.EPERM, errno.EACCES):
            raise OSError(refused, f"unshare of a user namespace: {os.strerror(refused)}")
        _check(libc.unshare(CLONE_NEWUSER), "unshare of a user namespace")


def enter_user_namespace(config: dict) -> list[int]:
    """Become root of a new user namespace whose ids are the host's config["ids"] range; returns the
    lower layers' idmapped mounts."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    helper = os.fork()
    if helper == 0:
        try:
            ours.close()
            map_ids(config, theirs)
        finally:
            os._exit(0)
    theirs.close()
    try:
        unshare_as(config["ids"][0])
        ours.send(b"u")
        answer, fds, _, _ = socket.recv_fds(ours, 4096, MAX_LAYERS)
    finally:
        ours.close()
        os.waitpid(helper, 0)
    if not fds:
        reason = answer[1:].decode(errors="replace") or "its helper exited"
        raise OSError(errno.EPERM, f"the sandbox's user namespace could not be set up: {reason}")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setgroups([])
    return fds


def start_sandbox(config: dict, control_fd: int) -> None:
    """The holder: a user namespace and the namespaces it owns, then pid 1 of them (the holder exits with it).

    Runs as host root only until it has joined the sandbox's cgroups and entered its box directory (0700,
    the sandbox's own root); from there on it is the sandbox's unprivileged host uid.
    """
    sock = socket.socket(fileno=control_fd)
    sock.set_inheritable(False)
    try:
        for path in config.get("cgroup_procs") or []:
            with open(path, "w") as f:
                f.write("0")
        os.chdir(config["box"])
        lower_fds = enter_user_namespace(config)
        # A cgroup namespace of its own, entered once it is in its cgroups: those are the root of its view.
        namespaces = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP
        _check(libc.unshare(namespaces), "unshare")
    except Exception as exc:
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"op": "failed", "error": str(exc)}).encode())
        raise
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            run_agent(config, sock, lower_fds)
        finally:
            os._exit(0)
    sock.close()
    for fd in lower_fds:
        os.close(fd)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def zygote(control_fd: int) -> None:
    """Fork-server: sandboxes are forked from this already-started interpreter (a fresh one costs ~60 ms)."""
    sock = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Every object made so far is left out of garbage collection: a collection in a forked sandbox would write
    # to each of them, copying every page of the interpreter the fork shares with this process.
    gc.freeze()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sources: list[socket.socket | int] = [sock, wake_r]
    while True:
        readable, _, _ = select.select(sources, [], [])
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
            pid = os.fork()
            if pid == 0:
                sock.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                try:
                    start_sandbox(config, fds[0])
                finally:
                    os._exit(1)
            os.close(fds[0])
            sock.send(json.dumps({"pid": pid}).encode())


PROCESS_TITLE = b"e2b-bench-agent"


def hide_command_line() -> None:
    """/proc/<pid>/cmdline, which every process of the sandbox can read of its pid 1, names the agent's host path
    (and, launched without the fork-server, its configuration): the arguments' memory is overwritten with a
    title and zeros. Python holds copies of its arguments of its own: none is used from that memory again."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 of proc(5)
        title = PROCESS_TITLE[: end - start - 1]
        ctypes.memmove(start, title + b"\0" * (end - start - len(title)), end - start)


def main() -> None:
    hide_command_line()
    if sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]))
    elif sys.argv[1] == "--launch":
        config = json.loads(sys.argv[2])
        start_sandbox(config, config["control_fd"])


if __name__ == "__main__":
    try:
        main()
    except Exception:
        sys.exit(1)
