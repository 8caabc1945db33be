"""Regressions of the sandbox escape audit (#12): each finding, checked inside the sandbox and from the host.

These tests run their own embedded endpoint (no pool), so they can look at a sandbox's host side: its pid 1,
its box directory, its id range.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import logging
import os
import re
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, InvalidArgumentException, Sandbox
from netns import listener_in_own_netns

from bench.localbox import box as localbox_box
from bench.localbox import server as localbox_server
from bench.localbox.box import AGENT_PATH, ID_BASE, ID_COUNT, TASKS_MAX, Box, cgroup_roots, remove_tree, shift_ids
from bench.localbox.server import LocalServer, in_thread, new_state_dir
from bench.remote.slowness import scaled


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    local = LocalServer(pool_size=0)
    with in_thread(local):
        yield local


@pytest.fixture
def sbx(server: LocalServer) -> Iterator[Sandbox]:
    sandbox = create(server)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def create(server: LocalServer, internet: bool = True) -> Sandbox:
    ep = server.endpoint
    return Sandbox.create(
        timeout=int(scaled(120)),  # a lifetime that outlasts the test on a slow host
        api_key=ep.api_key,
        api_url=ep.api_url,
        sandbox_url=ep.sandbox_url,
        allow_internet_access=internet,
    )


def box_of(server: LocalServer, sandbox: Sandbox) -> Box:
    record = server.registry.get(sandbox.sandbox_id)
    assert record is not None
    return record.box


def pid1_of(server: LocalServer, sandbox: Sandbox) -> int:
    pid = box_of(server, sandbox)._root_pid()
    assert pid is not None
    return pid


def run(sandbox: Sandbox, script: str, user: str = "root") -> str:
    """stdout and stderr of a script that is expected to end 0."""
    result = sandbox.commands.run(script, user=user)
    return result.stdout + result.stderr


def host_status(pid: int) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def test_sandbox_root_cannot_write_proc_sys_even_through_sudo(sbx: Sandbox) -> None:
    before = Path("/proc/sys/kernel/core_pattern").read_text()

    out = run(sbx, "sudo sh -c 'echo \"|/tmp/x\" > /proc/sys/kernel/core_pattern' 2>&1; echo rc=$?", user="user")

    assert out.splitlines() == ["sh: 1: cannot create /proc/sys/kernel/core_pattern: Read-only file system", "rc=2"]
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_pid1_has_no_effective_capability_and_sandbox_root_is_an_unprivileged_host_uid(
    server: LocalServer, sbx: Sandbox
) -> None:
    # Returns once the background child has become `sleep` (a fork not yet exec'd is still named bash).
    run(sbx, 'sleep 300 >/dev/null 2>&1 & until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done')
    box = box_of(server, sbx)
    pid1 = pid1_of(server, sbx)
    # Read right after each spawn: pid 1 drops its capabilities before a user's command can run. (A root
    # command may see pid 1 holding, while it spawns that command, the capabilities the command holds.)
    status_line = "grep -E '^(CapEff|Seccomp|NoNewPrivs):' /proc/1/status"
    seen_inside = {run(sbx, status_line, user="user") for _ in range(40)}
    sleeper = next(p for p in os.listdir("/proc") if p.isdigit() and _is_child_named(int(p), pid1, "sleep"))

    status = host_status(pid1)
    root_command = host_status(int(sleeper))
    assert box.ids is not None
    base = box.ids.base
    assert (base - ID_BASE) % ID_COUNT == 0 and base >= ID_BASE
    assert status["Uid"].split() == [str(base)] * 4
    assert root_command["Uid"].split() == [str(base)] * 4
    assert status["CapEff"] == "0000000000000000"
    assert seen_inside == {"CapEff:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t2\n"}
    assert os.readlink(f"/proc/{pid1}/ns/user") != os.readlink("/proc/self/ns/user")
    assert os.readlink(f"/proc/{pid1}/ns/net") != os.readlink("/proc/self/ns/net")


def _is_child_named(pid: int, parent: int, name: str) -> bool:
    try:
        status = host_status(pid)
    except OSError:
        return False
    return status.get("PPid") == str(parent) and status.get("Name") == name


def test_pid1_holds_no_host_file_and_never_loads_a_library_of_the_sandbox(server: LocalServer, sbx: Sandbox) -> None:
    # A sandbox that asks libc's NSS for a module of its own: pid 1 must never load it.
    run(sbx, "sed -i 's/^passwd:.*/passwd: files compat systemd/; s/^group:.*/group: files compat/' /etc/nsswitch.conf")
    run(sbx, "useradd -m worker")
    sbx.files.write("/home/worker/owned", "x", user="worker")
    listed = sbx.files.list("/home/worker")
    pid1 = pid1_of(server, sbx)

    targets = [os.readlink(f"/proc/{pid1}/fd/{fd}") for fd in os.listdir(f"/proc/{pid1}/fd")]
    sandbox_dev = os.stat(f"/proc/{pid1}/root/etc/passwd").st_dev
    mapped_devs = {line.split()[3] for line in Path(f"/proc/{pid1}/maps").read_text().splitlines()}

    assert {e.owner for e in listed} == {"worker"} and "owned" in {e.name for e in listed}
    assert all(re.fullmatch(r"(socket|pipe|anon_inode):.*|/dev/null", t) for t in targets), targets
    assert f"{os.major(sandbox_dev):02x}:{os.minor(sandbox_dev):02x}" not in mapped_devs


def test_masked_proc_files_read_empty(sbx: Sandbox) -> None:
    script = "for f in kcore keys timer_list sysrq-trigger; do [ -e /proc/$f ] && echo $f $(wc -c < /proc/$f); done"

    lines = run(sbx, script + "; true").splitlines()

    assert lines and all(line.endswith(" 0") for line in lines), lines
    assert "keys 0" in lines


SYSCALLS = {  # name: (x86_64, aarch64, arguments)
    "keyctl": (250, 219, (0, -3)),  # KEYCTL_GET_KEYRING_ID of the user keyring
    "add_key": (248, 217, (b"user", b"k", b"v", 1, -4)),
    "bpf": (321, 280, (0, 0, 0)),
    "unshare": (272, 97, (0x10000000,)),
    "mount": (165, 40, (b"none", b"/mnt", b"tmpfs", 0, 0)),
    "clone_newuser": (56, 220, (0x10000000 | 17, 0, 0, 0, 0)),
    "vsock_socket": (41, 198, (40, 1, 0)),  # AF_VSOCK, SOCK_STREAM: the host's virtual machine sockets
}


def test_seccomp_refuses_keyrings_bpf_mounts_new_namespaces_and_vsock(sbx: Sandbox) -> None:
    script = textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        column = 0 if os.uname().machine == "x86_64" else 1
        for name, row in {SYSCALLS!r}.items():
            rc = libc.syscall(row[column], *row[2])
            print(name, rc, ctypes.get_errno())
    """)
    sbx.files.write("/tmp/calls.py", script)

    out = run(sbx, "python3 /tmp/calls.py")

    assert out.splitlines() == [f"{name} -1 {errno.EPERM}" for name in SYSCALLS]


def test_pid1s_command_line_names_no_host_path(server: LocalServer, sbx: Sandbox) -> None:
    shown = sbx.commands.run("tr '\\0' '\\n' < /proc/1/cmdline").stdout.split()
    missing = [
        word for word in shown if word.startswith("/") and sbx.commands.run(f"test -e '{word}' || echo gone").stdout
    ]

    assert shown and not missing, shown  # a path there that the sandbox does not have is the host's
    assert not any(str(AGENT_PATH.parent) in word or "e2b-bench-localbox" in word for word in shown), shown


LISTEN = textwrap.dedent("""
    import socket, sys
    s = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    print("up", flush=True)
    s.accept()
""")
CONNECT = textwrap.dedent("""
    import socket, sys
    for address in sys.argv[1:]:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), 5).close()
            print("reached")
        except OSError as exc:
            print(type(exc).__name__)
""")


def test_a_sandbox_reaches_neither_the_hosts_loopback_nor_another_sandbox(server: LocalServer, sbx: Sandbox) -> None:
    other = create(server)
    try:
        host_listener = socket.create_server(("127.0.0.1", 0))
        host_port = host_listener.getsockname()[1]
        server_port = server.port
        for sandbox in (sbx, other):
            sandbox.files.write("/tmp/listen.py", LISTEN)
            sandbox.files.write("/tmp/connect.py", CONNECT)
        other_listener = other.commands.run("python3 /tmp/listen.py 7001", background=True)
        own_listener = sbx.commands.run("python3 /tmp/listen.py 7002", background=True)
        for handle in (other_listener, own_listener):
            next(iter(handle))  # "up": listening before anyone connects

        out = run(sbx, f"python3 /tmp/connect.py {host_port} {server_port} 7001 7002", user="user")
    finally:
        other.kill()
        host_listener.close()

    assert out.splitlines() == ["ConnectionRefusedError"] * 3 + ["reached"]


def test_pid1s_descriptors_are_out_of_reach_and_the_files_api_follows_no_link_out_of_the_sandbox(sbx: Sandbox) -> None:
    # pid 1 is not dumpable: even the sandbox's root cannot open its descriptors
    denied = sbx.commands.run("ls /proc/1/fd 2>&1; echo rc=$?", user="root").stdout
    assert "Permission denied" in denied and denied.rstrip().endswith("rc=2")
    for path in ("/proc/self/fd/1", "/proc/1/fd/2"):
        with pytest.raises(InvalidArgumentException, match="leaves the sandbox"):
            sbx.files.read(path, user="root")


def test_state_is_private_and_a_setuid_file_of_a_sandbox_runs_as_no_one_else(server: LocalServer, sbx: Sandbox) -> None:
    run(sbx, "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id")
    box = box_of(server, sbx)
    copy = box.dir / "upper" / "tmp" / "suid-id"
    assert box.ids is not None

    st = copy.stat()
    with pytest.raises(PermissionError):
        subprocess.run([str(copy)], user=65534, group=65534, capture_output=True, check=False)
    state_root = server.registry.config.state_dir.parent

    assert st.st_mode & stat.S_ISUID and st.st_uid == box.ids.base
    assert stat.S_IMODE(state_root.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.registry.config.state_dir.stat().st_mode) == 0o700
    assert (box.dir.stat().st_uid, stat.S_IMODE(box.dir.stat().st_mode)) == (box.ids.base, 0o700)


def test_leftovers_that_cannot_be_removed_are_named_in_one_sentence_and_serve_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = tmp_path / "server-4194999-1" / "boxes" / "abc" / "merged" / "pinned"
    stuck.parent.mkdir(parents=True)
    stuck.touch()
    subprocess.run(["chattr", "+i", str(stuck)], check=True)  # a mount would not do: leftover mounts are unmounted
    try:
        with caplog.at_level(logging.WARNING, logger="e2b-bench.localbox"):
            fresh = new_state_dir(tmp_path)
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)

    messages = [r.getMessage() for r in caplog.records]
    assert fresh.parent == tmp_path and fresh.name.startswith(f"server-{os.getpid()}-")
    assert len(messages) == 1 and messages[0].count(". ") == 0
    assert "could not be removed" in messages[0] and "abc" in messages[0]


def deep_tree(top: Path, depth: int, uid: int) -> None:
    """top/dir/dir/... with a file f (and a setuid file s at the bottom), all owned by uid."""
    top.mkdir()
    os.chown(top, uid, uid)
    fd = os.open(top, os.O_RDONLY)
    for level in range(depth):
        os.mkdir("dir", dir_fd=fd)
        os.chown("dir", uid, uid, dir_fd=fd)
        child = os.open("dir", os.O_RDONLY, dir_fd=fd)
        for name in ("f", "s") if level == depth - 1 else ("f",):
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=child))
            os.chown(name, uid, uid, dir_fd=child)
        if level == depth - 1:
            os.chmod("s", 0o4755, dir_fd=child)
        os.close(fd)
        fd = child
    os.close(fd)


def test_a_tree_deeper_than_any_path_is_removed(tmp_path: Path) -> None:
    top = tmp_path / "deep"
    deep_tree(top, 3000, 0)  # 12,000 bytes of path: deeper than PATH_MAX and Python's recursion limit

    assert remove_tree(top) is True
    assert not top.exists()


def test_a_sandbox_layer_is_shifted_to_template_ids_at_any_depth_dropping_setuid(tmp_path: Path) -> None:
    top = tmp_path / "layer"
    deep_tree(top, 2000, ID_BASE + 1000)

    try:
        shift_ids(top, -ID_BASE)

        owners = subprocess.run(["find", str(top), "-printf", "%U:%G\n"], capture_output=True, text=True).stdout
        fd = os.open(top, os.O_RDONLY)
        for _ in range(2000):
            fd, parent = os.open("dir", os.O_RDONLY, dir_fd=fd), fd
            os.close(parent)
        setuid = os.stat("s", dir_fd=fd).st_mode
        os.close(fd)
    finally:
        remove_tree(top)  # pytest's own clean-up of tmp_path is recursive
    assert set(owners.splitlines()) == {"1000:1000"}
    assert len(owners.splitlines()) == 1 + 2000 * 2 + 1  # top, each dir and its f, the setuid s
    assert stat.S_IMODE(setuid) == 0o755  # a layer holds no setuid file (#25)


def test_a_sandbox_with_a_deep_tree_answers_metrics_and_is_cleaned_up(server: LocalServer) -> None:
    sandbox = create(server)
    sandbox.files.write(
        "/tmp/deep.py", "import os\nos.chdir('/tmp')\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
    )
    run(sandbox, "python3 /tmp/deep.py")
    box_dir = box_of(server, sandbox).dir

    metrics = sandbox.get_metrics()
    sandbox.kill()
    deadline = time.monotonic() + scaled(30)
    while box_dir.exists() and time.monotonic() < deadline:  # files are removed in the background
        time.sleep(0.05)

    assert len(metrics) == 1
    assert not box_dir.exists()


def test_input_to_a_process_that_does_not_read_never_stops_the_server(sbx: Sandbox) -> None:
    run(sbx, "mkfifo /tmp/go && chmod 666 /tmp/go")
    reader = sbx.commands.run("read -r _ < /tmp/go; wc -c", background=True, stdin=True)
    chunk = b"y" * (1 << 20)

    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(lambda: [sbx.commands.send_stdin(reader.pid, chunk) for _ in range(4)])
        meanwhile = run(sbx, "echo other command", user="user")  # while 4 MiB wait for a reader
        run(sbx, "echo > /tmp/go")
        sending.result(timeout=60)
    sbx.commands.close_stdin(reader.pid)
    result = reader.wait()

    assert meanwhile == "other command\n"
    assert result.stdout == f"{4 << 20}\n"


def test_ten_thousand_idle_connections_do_not_stop_a_new_client(server: LocalServer) -> None:
    idle = []
    try:
        for _ in range(10_000):
            conn = socket.socket()
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", server.port))
            idle.append(conn)

        response = httpx.get(f"{server.endpoint.api_url}/sandboxes", headers={"X-API-Key": server.api_key}, timeout=60)
    finally:
        for conn in idle:
            conn.close()

    assert response.status_code == 200


def test_limits_of_the_template_are_enforced_in_the_sandbox(server: LocalServer, sbx: Sandbox) -> None:
    threads = textwrap.dedent("""
        import threading
        stop = threading.Event()
        started = 0
        try:
            while True:
                threading.Thread(target=stop.wait).start()
                started += 1
        except RuntimeError as exc:
            print(started < 4096, exc)
        stop.set()
    """)
    sbx.files.write("/tmp/threads.py", threads)

    pids = run(sbx, "python3 /tmp/threads.py")
    with pytest.raises(CommandExitException) as memory:
        sbx.commands.run("python3 -c 'b = b\"x\" * (1 << 30); print(len(b))'")

    assert pids == "True can't start new thread\n"
    assert (memory.value.exit_code, memory.value.error) == (-1, "signal: killed")


def test_the_cpu_count_the_api_reports_is_the_sandboxs_cpu_quota_and_it_is_accounted(
    server: LocalServer, sbx: Sandbox
) -> None:
    cgroup = box_of(server, sbx).cgroup
    cpu = cgroup.paths[0] if cgroup.v2 else cgroup.controllers["cpu"]

    def quota() -> tuple[int, int]:
        if cgroup.v2:
            limit, period = (cpu / "cpu.max").read_text().split()
            return int(limit), int(period)
        return int((cpu / "cpu.cfs_quota_us").read_text()), int((cpu / "cpu.cfs_period_us").read_text())

    def periods() -> int:
        return int(dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())["nr_periods"])

    before = periods()
    run(sbx, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")  # a fixed amount of work, not a duration
    limit, period = quota()

    assert limit == sbx.get_info().cpu_count * period
    assert periods() > before  # the bandwidth controller counts the sandbox's CPU time against the quota


def test_metrics_count_the_memory_a_sandbox_holds_from_its_cgroup(sbx: Sandbox) -> None:
    run(sbx, "mkfifo /tmp/hold && chmod 666 /tmp/hold")
    holder = sbx.commands.run(
        "python3 -c \"b = b'x' * (200 << 20); print('held', flush=True); open('/tmp/hold').read()\"", background=True
    )
    assert next(iter(holder))[0] == "held\n"

    metrics = sbx.get_metrics()
    run(sbx, "echo > /tmp/hold")
    holder.wait()

    assert (200 << 20) <= metrics[-1].mem_used <= metrics[-1].mem_total


def test_a_connection_that_never_finishes_its_headers_is_closed(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(localbox_server, "HEADER_TIMEOUT_S", 0.5)  # the deadline under test, short to wait out
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        slow.settimeout(scaled(30))  # the server's timer is scaled by the same factor (it runs in this process)

        assert slow.recv(1024) == b""


@pytest.fixture
def test_host() -> Iterator[str]:
    with listener_in_own_netns() as address:
        yield address


def test_internet_access_reaches_out_but_not_the_hosts_loopback_and_off_reaches_nothing(
    server: LocalServer, test_host: str
) -> None:
    online, offline = create(server), create(server, internet=False)
    try:
        with socket.create_server(("127.0.0.1", 0)) as host_listener:
            loopback = f"10.0.2.2:{host_listener.getsockname()[1]}"  # slirp's address for the host
            seen = {}
            for label, sandbox in (("online", online), ("offline", offline)):
                sandbox.files.write("/tmp/connect.py", CONNECT)
                seen[label] = run(sandbox, f"python3 /tmp/connect.py {test_host} {loopback}", user="user").split()
    finally:
        online.kill()
        offline.kill()

    assert seen == {"online": ["reached", "OSError"], "offline": ["OSError", "OSError"]}  # unreachable, not refused


def test_a_sandboxs_uplink_holds_nothing_of_the_server_but_its_exit_pipe(server: LocalServer) -> None:
    first, second = create(server), create(server)
    try:
        reader = first.commands.run("cat", background=True, stdin=True)  # pipes the server holds
        uplink = box_of(server, second).uplink
        assert uplink is not None

        def targets(pid: int | str) -> set[str]:
            found = set()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed since
                    found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            return found

        shared = targets(uplink.process.pid) & targets("self")
        exit_pipe = f"pipe:[{os.fstat(uplink._exit_w).st_ino}]"
        reader.kill()
    finally:
        first.kill()
        second.kill()

    assert shared - {"/dev/null"} == {exit_pipe}


def host_bounds(box: Box) -> dict[str, str]:
    """A sandbox's CPU and task bounds as the host's cgroup files hold them (v2's names; v1's read as v2's)."""
    found = {}
    for root in cgroup_roots():
        path = root / box.cgroup_name
        for name in ("pids.max", "cpu.max", "cpu.weight", "cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us"):
            if (path / name).exists():
                found[name] = (path / name).read_text().strip()
    if "cpu.cfs_quota_us" in found:  # v1
        found["cpu.max"] = f"{found.pop('cpu.cfs_quota_us')} {found.pop('cpu.cfs_period_us')}"
        found["cpu.weight"] = str(int(found.pop("cpu.shares")) * 100 // 1024)
    return found


# Forks until bash's SECONDS (inherited by its subshells) reaches 60, then stops by itself (the test kills it first).
BOMB = "exec >/dev/null 2>&1; bomb() { [ $SECONDS -lt 60 ] && { bomb | bomb & }; }; bomb"


def test_a_sandbox_has_task_and_cpu_bounds_and_a_fork_bomb_in_it_keeps_anothers_commands_answering(
    server: LocalServer,
) -> None:
    bombed, other = create(server), create(server)
    try:
        box = box_of(server, bombed)
        bounds, others = host_bounds(box), host_bounds(box_of(server, other))
        cpus = bombed.get_info().cpu_count
        quiet = []
        for _ in range(5):
            started = time.perf_counter()
            run(other, "true")
            quiet.append(time.perf_counter() - started)
        bombed.commands.run(BOMB, background=True, timeout=0)
        deadline = time.monotonic() + scaled(10)
        while len(box.cgroup.pids(None)) < 0.9 * TASKS_MAX and time.monotonic() < deadline:  # seen from the host
            time.sleep(0.1)
        held = len(box.cgroup.pids(None))
        loaded = []
        until = time.monotonic() + 5
        while time.monotonic() < until:
            started = time.perf_counter()
            run(other, "true")
            loaded.append(time.perf_counter() - started)
        peak = len(box.cgroup.pids(None))
    finally:
        bombed.kill()
        other.kill()

    assert (box.cgroup.unbounded, bounds) == ({}, others)
    quota, period = map(int, bounds["cpu.max"].split())
    assert (bounds["pids.max"], quota / period, bounds["cpu.weight"]) == (str(TASKS_MAX), cpus, "100")
    # the bomb was at its bound throughout
    assert 0.9 * TASKS_MAX <= held <= TASKS_MAX and 0.9 * TASKS_MAX <= peak <= TASKS_MAX, (held, peak)
    assert max(loaded) <= max(quiet) + scaled(1.0), (quiet, loaded)


def test_a_bound_the_host_cannot_apply_is_named_once_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(localbox_box, "_reported_unbounded", set())
    v1_all = {"memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us", "cpu.shares"}
    with caplog.at_level(logging.WARNING, "e2b-bench.localbox"):
        complete = localbox_box._unbounded(v1_all, False, localbox_box.V1_CONTROLLERS)
        no_tasks = [localbox_box._unbounded(v1_all - {"pids.max"}, v2, ("memory", "cpu")) for v2 in (False, True)]
        again = localbox_box._unbounded(v1_all - {"pids.max"}, False, localbox_box.V1_CONTROLLERS)

    assert complete == {} and no_tasks[0] == {}  # a v1 cgroup not asked to have the pids hierarchy
    assert no_tasks[1] == {"tasks": "the pids controller is not enabled for /sys/fs/cgroup/e2b-bench"}
    assert list(again) == ["tasks"] and "pids" in again["tasks"]
    assert [r.getMessage() for r in caplog.records] == [
        f"sandboxes have no tasks bound on this host: {no_tasks[1]['tasks']}"
    ]


# The isolation case is22's scripts: one takes the user's whole share and holds it, the other asks for one of each.
_SPEC = importlib.util.spec_from_file_location(
    "user_limits", Path(__file__).resolve().parents[1] / "sandboxes" / "e2b" / "python" / "user_limits.py"
)
assert _SPEC is not None and _SPEC.loader is not None
USER_LIMITS = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(USER_LIMITS)


def test_a_sandbox_spending_its_per_user_kernel_limits_leaves_another_sandbox_and_host_root_theirs(
    server: LocalServer,
) -> None:
    greedy, other = create(server), create(server)
    try:
        greedy.files.write("/tmp/grab.py", USER_LIMITS.GRAB_USER_LIMITS)
        other.files.write("/tmp/probe.py", USER_LIMITS.PROBE_USER_LIMITS)
        holding = greedy.commands.run("python3 /tmp/grab.py", background=True)
        deadline = time.monotonic() + scaled(60)
        while not greedy.files.exists(USER_LIMITS.HELD) and time.monotonic() < deadline:
            time.sleep(0.2)
        held = [int(n) for n in greedy.files.read(USER_LIMITS.HELD).split()]
        in_other = run(other, "python3 /tmp/probe.py", user="user")
        as_host_root = subprocess.run(
            [sys.executable, "-c", USER_LIMITS.PROBE_USER_LIMITS], capture_output=True, text=True, check=True
        ).stdout
        holding.kill()
    finally:
        greedy.kill()
        other.kill()

    assert held[0] >= 1 and held[1] >= 1000 and held[2] >= 1, held  # it did take its share of each
    assert in_other == as_host_root == "queue=True signal=True inotify=True\n", (in_other, as_host_root)


def test_a_sandboxs_user_namespace_belongs_to_its_own_host_uid(server: LocalServer, sbx: Sandbox) -> None:
    box = box_of(server, sbx)
    fd = os.open(f"/proc/{pid1_of(server, sbx)}/ns/user", os.O_RDONLY)
    try:
        owner = struct.unpack("I", fcntl.ioctl(fd, NS_GET_OWNER_UID, b"\0" * 4))[0]
    finally:
        os.close(fd)

    assert box.ids is not None and owner == box.ids.base != 0


NS_GET_OWNER_UID = 0xB704
