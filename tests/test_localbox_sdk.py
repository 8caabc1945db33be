"""The unmodified e2b Python SDK (sync and async) against the embedded endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

from bench.localbox.box import default_state_root
from bench.localbox.files import MAX_READ_AHEAD
from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import scaled

# --- commands ---------------------------------------------------------------------------------


def test_run_streams_stdout_and_reports_exit_codes(sandbox: Sandbox) -> None:
    chunks: list[str] = []

    def heard(chunk: str) -> None:  # the command prints 2 and 3 only once its first line has reached us
        chunks.append(chunk)
        if len(chunks) == 1:
            sandbox.files.write("/tmp/go", "")

    ok = sandbox.commands.run(
        "echo 1; until [ -e /tmp/go ]; do sleep 0.01; done; echo 2; echo 3", on_stdout=heard, timeout=scaled(60)
    )
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo out; echo oops >&2; exit 3")

    assert (ok.exit_code, ok.stdout, chunks[0], "".join(chunks)) == (0, "1\n2\n3\n", "1\n", "1\n2\n3\n")
    assert (failed.value.exit_code, failed.value.stdout, failed.value.stderr) == (3, "out\n", "oops\n")
    assert failed.value.error == "exit status 3"


def test_a_command_runs_in_a_login_shell_as_user_in_home(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo $0 $(whoami) $(pwd) $HOME; shopt -q login_shell && echo login")

    assert result.stdout == "/bin/bash user /home/user /home/user\nlogin\n"


def test_the_login_profile_sets_debians_path_for_user_and_root(sandbox: Sandbox) -> None:
    user_path = sandbox.commands.run("echo $PATH").stdout
    root_path = sandbox.commands.run("echo $PATH", user="root").stdout
    sh_path = sandbox.commands.run("env -i sh -l -c 'echo $PATH'").stdout

    assert user_path == sh_path == "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games\n"
    assert root_path == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"


STATUS_FIELDS = "grep -E '^(Uid|Gid|Groups|SigBlk|CapEff|CapPrm):' /proc/self/status"


@pytest.mark.parametrize(
    ("user", "ids", "caps"),
    # root: a container runtime's default set minus NET_RAW
    [("user", ("1000", "1000", "1000"), "0000000000000000"), ("root", ("0", "0", "0"), "00000000a00405fb")],
)
def test_a_command_has_the_users_ids_default_signals_and_only_its_stdio(
    sandbox: Sandbox, user: str, ids: tuple[str, str, str], caps: str
) -> None:
    status = sandbox.commands.run(STATUS_FIELDS, user=user).stdout
    ignored = sandbox.commands.run("grep SigIgn /proc/self/status", user=user).stdout.split()[1]
    terminated = sandbox.commands.run("sleep 30 & kill -TERM $!; wait $!; echo $?", user=user).stdout
    hung_up = sandbox.commands.run("sleep 30 & kill -HUP $!; wait $!; echo $?", user=user).stdout
    # listed once the child is sleep (before its exec it is a copy of the shell, with the shell's descriptors)
    descriptors = sandbox.commands.run(
        'sleep 5 & until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done; ls /proc/$!/fd; kill $!', user=user
    ).stdout.split()

    uid, gid, groups = ids
    fields = dict(line.split(":\t", 1) for line in status.splitlines())
    assert fields == {
        "Uid": "\t".join([uid] * 4),
        "Gid": "\t".join([gid] * 4),
        "Groups": f"{groups} ",
        "SigBlk": "0000000000000000",
        "CapPrm": caps,
        "CapEff": caps,
    }
    # HUP, INT, QUIT and TERM at their defaults (only glibc's two internal real-time signals may be ignored)
    assert int(ignored, 16) & ~(3 << 31) == 0
    assert (terminated, hung_up) == ("143\n", "129\n")
    assert descriptors == ["0", "1", "2"]


def test_create_envs_reach_every_command_and_command_envs_override_them(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60, envs={"FROM_CREATE": "c", "BOTH": "create"})
    try:
        first = sbx.commands.run("echo $FROM_CREATE $BOTH")
        second = sbx.commands.run("echo $FROM_CREATE $BOTH", envs={"BOTH": "command"})
    finally:
        sbx.kill()

    assert (first.stdout, second.stdout) == ("c create\n", "c command\n")


def test_cwd_and_user_root(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/home/user/work dir")

    relative = sandbox.commands.run("pwd", cwd="work dir")
    as_root = sandbox.commands.run("whoami; echo $HOME; pwd", user="root")

    assert relative.stdout == "/home/user/work dir\n"
    assert as_root.stdout == "root\n/root\n/root\n"


def test_a_cwd_the_user_cannot_enter_is_refused_as_envd_refuses_it(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p /root/inner /tmp/closed/deeper && chmod 700 /tmp/closed", user="root")

    with pytest.raises(SandboxException) as home:
        sandbox.commands.run("pwd", cwd="/root")
    with pytest.raises(SandboxException) as below:
        sandbox.commands.run("pwd", cwd="/tmp/closed/deeper")
    as_root = sandbox.commands.run("pwd", cwd="/root/inner", user="root")

    # envd's exec changes directory after setuid: the fork/exec fails, and Start answers invalid_argument
    # (internal/services/process/start.go handleStart, handler/handler.go Start).
    wanted = "error starting process '/bin/bash -l -c pwd': fork/exec /bin/sh: permission denied"
    assert (type(home.value), type(below.value)) == (InvalidArgumentException, InvalidArgumentException)
    assert str(home.value) == str(below.value) == wanted
    assert as_root.stdout == "/root/inner\n"


def test_sigkill_reports_minus_one_and_a_second_kill_returns_false(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)

    listed = [p.pid for p in sandbox.commands.list()]
    killed = sandbox.commands.kill(handle.pid)
    with pytest.raises(CommandExitException) as ended:
        handle.wait()
    again = sandbox.commands.kill(handle.pid)

    assert handle.pid in listed
    assert (killed, again) == (True, False)
    assert (ended.value.exit_code, ended.value.error) == (-1, "signal: killed")


def test_stdin_send_and_close(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("read line; echo got:$line; cat; echo eof", background=True, stdin=True)

    sandbox.commands.send_stdin(handle.pid, "ping\n")
    sandbox.commands.send_stdin(handle.pid, "rest\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()

    assert result.stdout == "got:ping\nrest\neof\n"


def test_disconnect_does_not_kill_and_connect_reattaches(sandbox: Sandbox) -> None:
    # it outlives the disconnect whatever the host's speed: it ends only once reattached
    handle = sandbox.commands.run("until [ -e /tmp/on ]; do sleep 0.01; done; echo later; exit 4", background=True)
    handle.disconnect()

    again = sandbox.commands.connect(handle.pid)
    sandbox.files.write("/tmp/on", "")
    with pytest.raises(CommandExitException) as ended:
        again.wait()

    assert ended.value.stdout == "later\n"
    assert ended.value.exit_code == 4


def test_the_request_deadline_kills_the_process(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("echo $$ > /tmp/pid; sleep 30", timeout=1)

    # gone at once or within seconds (the kill follows the deadline): asked until it is, 30 s at most
    alive = sandbox.commands.run(
        "for _ in $(seq 300); do kill -0 $(cat /tmp/pid) 2>/dev/null || { echo gone; exit; }; sleep 0.1; done; "
        "echo alive"
    )

    assert alive.stdout == "gone\n"


def test_setsid_inside_a_command_keeps_its_exit_code_and_late_output(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as ended:
        sandbox.commands.run("exec setsid bash -c 'sleep 1; echo late; exit 5'")

    assert (ended.value.exit_code, ended.value.stdout) == (5, "late\n")


def test_pty_runs_an_interactive_shell_and_resizes(sandbox: Sandbox) -> None:
    output = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))

    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; tty; exit 7\n")
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=output.extend)

    text = output.decode(errors="replace")
    assert "40 120" in text
    assert "/dev/pts/" in text
    assert ended.value.exit_code == 7


def test_output_of_concurrent_commands_is_neither_lost_nor_mixed(sandbox: Sandbox) -> None:
    handles = [sandbox.commands.run(f"for i in $(seq 1 300); do echo {n}-$i; done", background=True) for n in range(8)]

    results = [h.wait() for h in handles]

    for n, result in enumerate(results):
        assert result.stdout == "".join(f"{n}-{i}\n" for i in range(1, 301))


def test_large_output_arrives_whole(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("head -c 3000000 /dev/zero | tr '\\0' 'x'")

    assert len(result.stdout) == 3_000_000


# --- files ------------------------------------------------------------------------------------


def test_files_round_trip_text_and_bytes_through_every_upload_form(sandbox: Sandbox) -> None:
    blob = bytes(range(256)) * 64

    sandbox.files.write("/home/user/multipart.bin", blob)
    sandbox.files.write("/home/user/octet.bin", blob, use_octet_stream=True)
    sandbox.files.write("/home/user/gzip.bin", blob, gzip=True)
    infos = sandbox.files.write_files(
        [WriteEntry(path="one.txt", data="first"), WriteEntry(path="/tmp/two.txt", data="second")]
    )

    for name in ("multipart", "octet", "gzip"):
        assert sandbox.files.read(f"/home/user/{name}.bin", format="bytes") == blob
    assert sandbox.files.read("/home/user/gzip.bin", format="bytes", gzip=True) == blob
    assert [i.path for i in infos] == ["/home/user/one.txt", "/tmp/two.txt"]
    assert sandbox.files.read("one.txt") == "first"


def test_bodies_larger_than_the_read_ahead_arrive_whole_in_every_upload_form(sandbox: Sandbox) -> None:
    blob = os.urandom(MAX_READ_AHEAD + (3 << 20) + 1)
    digest = hashlib.sha256(blob).hexdigest()

    for name, options in (("multipart", {}), ("octet", {"use_octet_stream": True}), ("gzip", {"gzip": True})):
        sandbox.files.write(f"/tmp/{name}.bin", blob, **options)
    found = sandbox.commands.run("cd /tmp && sha256sum multipart.bin octet.bin gzip.bin").stdout.split()

    assert found[0::2] == [digest] * 3


def test_several_large_parts_of_one_multipart_body_each_reach_their_own_file_whole(sandbox: Sandbox) -> None:
    blobs = [
        os.urandom(3 << 20),
        os.urandom((2 << 20) + 7),
        os.urandom(5),
    ]  # the body read by a thread: parts switch there
    paths = ["/tmp/parts/a.bin", "/home/user/b.bin", "/tmp/parts/c.bin"]
    sandbox.commands.run("mkdir -p /tmp/parts && echo old-and-longer-than-five > /tmp/parts/c.bin")

    infos = sandbox.files.write_files(
        [WriteEntry(path=path, data=blob) for path, blob in zip(paths, blobs, strict=True)]
    )
    found = sandbox.commands.run(f"sha256sum {' '.join(paths)}").stdout.split()

    assert [info.path for info in infos] == paths
    assert found[0::2] == [hashlib.sha256(blob).hexdigest() for blob in blobs]


# what a file held and what is uploaded over it (sizes): an existing file is written over in place and cut
# where the upload ends, so it must hold the upload's bytes and nothing else, as envd's O_TRUNC leaves it
OVERWRITES = {"a longer file": (3 << 20, 1000), "a shorter one": (1000, 3 << 20), "one as long": (2 << 20, 2 << 20)}


@pytest.mark.parametrize("form", [{}, {"use_octet_stream": True}, {"gzip": True}], ids=["multipart", "octet", "gzip"])
def test_an_upload_over_a_file_leaves_exactly_the_uploads_bytes(sandbox: Sandbox, form: dict) -> None:
    cases = {**OVERWRITES, "emptied": (5000, 0)}
    for index, (old, _) in enumerate(cases.values()):
        sandbox.commands.run(f"head -c {old} /dev/urandom > /home/user/over{index}")
    uploads = [os.urandom(new) for _, new in cases.values()]

    for index, data in enumerate(uploads):
        sandbox.files.write(f"/home/user/over{index}", data, **form)
    found = sandbox.commands.run(f"cd /home/user && for i in $(seq 0 {len(cases) - 1}); do stat -c %s over$i; done")
    digests = sandbox.commands.run("cd /home/user && sha256sum over*").stdout.split()[0::2]

    assert found.stdout.split() == [str(len(data)) for data in uploads]
    assert digests == [hashlib.sha256(data).hexdigest() for data in uploads]


def test_a_client_leaving_mid_upload_over_a_file_leaves_only_what_it_sent(
    sandbox: Sandbox, endpoint: LocalEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    # as envd's O_TRUNC and copy would: the old contents are gone, the bytes that arrived may be there
    sandbox.commands.run("head -c 8M /dev/zero | tr '\\0' o > /home/user/left.bin")
    host, port = endpoint.sandbox_url.removeprefix("http://").split(":")
    head = (
        f"POST /files?path=/home/user/left.bin&username=user HTTP/1.1\r\nHost: {host}\r\n"
        f"E2b-Sandbox-Id: {sandbox.sandbox_id}\r\nX-Access-Token: {sandbox._envd_access_token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {8 << 20}\r\n\r\n"
    )

    with socket.create_connection((host, int(port))) as leaving:
        leaving.sendall(head.encode() + b"n" * (3 << 20))
    deadline = time.monotonic() + scaled(30)  # the server sees the close once it reads on, then cuts the file
    while int(sandbox.commands.run("stat -c %s /home/user/left.bin").stdout) > 3 << 20:
        assert time.monotonic() < deadline, "the file still holds its old contents past the upload's bytes"
        time.sleep(0.05)
    others = sandbox.commands.run("tr -d n < /home/user/left.bin | wc -c").stdout

    assert others.strip() == "0"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []  # a client's leaving: no error


def test_a_refused_upload_reports_the_refusal_and_writes_nothing(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/home/user/taken")

    with pytest.raises(SandboxException) as multipart:
        sandbox.files.write("/home/user/taken", os.urandom(5 << 20))
    with pytest.raises(SandboxException) as octet:
        sandbox.files.write("/home/user/taken", os.urandom(5 << 20), use_octet_stream=True)
    left = sandbox.commands.run("test -d /home/user/taken && ls -A /home/user/taken").stdout

    assert str(multipart.value) == str(octet.value) == "path '/home/user/taken' is a directory"
    assert left == ""
    assert sandbox.files.write("/home/user/after.txt", "still fine").path == "/home/user/after.txt"


def test_files_written_as_user_belong_to_user_and_as_root_to_root(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/deep/er/mine.txt", "x")
    sandbox.files.write("/root/theirs.txt", "y", user="root")

    mine = sandbox.files.get_info("/home/user/deep/er/mine.txt")
    theirs = sandbox.files.get_info("/root/theirs.txt", user="root")
    parents = sandbox.commands.run("stat -c %U /home/user/deep /home/user/deep/er")

    assert (mine.owner, theirs.owner) == ("user", "root")
    assert parents.stdout == "user\nuser\n"


def test_list_exists_info_rename_remove_and_missing_files(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/tree/a/b.txt", "b")
    sandbox.files.write("/home/user/tree/c.txt", "cc")

    shallow = sorted(e.path for e in sandbox.files.list("/home/user/tree"))
    deep = sorted(e.path for e in sandbox.files.list("/home/user/tree", depth=2))
    info = sandbox.files.get_info("/home/user/tree/c.txt")
    made, made_again = sandbox.files.make_dir("/home/user/new"), sandbox.files.make_dir("/home/user/new")
    moved = sandbox.files.rename("/home/user/tree/c.txt", "/home/user/new/c.txt")
    sandbox.files.remove("/home/user/tree")

    assert shallow == ["/home/user/tree/a", "/home/user/tree/c.txt"]
    assert deep == ["/home/user/tree/a", "/home/user/tree/a/b.txt", "/home/user/tree/c.txt"]
    assert (info.name, info.type, info.size, info.permissions) == ("c.txt", FileType.FILE, 2, "-rw-r--r--")
    assert (made, made_again) == (True, False)
    assert moved.path == "/home/user/new/c.txt"
    assert sandbox.files.exists("/home/user/tree") is False
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/nope")


def test_file_metadata_is_stored_and_listed(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/tagged.txt", "t", metadata={"origin": "bench"})

    info = sandbox.files.get_info("/home/user/tagged.txt")

    assert info.metadata == {"origin": "bench"}


def test_signed_urls_work_without_the_access_token(sandbox: Sandbox) -> None:
    upload = sandbox.upload_url("/home/user/signed.txt")
    download = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=60)

    sent = httpx.post(upload, files={"file": ("signed.txt", b"via url")})
    got = httpx.get(download)
    forged = httpx.get(download.replace("signature=v1_", "signature=v1_x"))

    assert sent.status_code == 200
    assert got.content == b"via url"
    assert forged.status_code == 401


def test_gzip_download_is_compressed_on_the_wire(sandbox: Sandbox, endpoint: LocalEndpoint) -> None:
    sandbox.files.write("/home/user/z.txt", "z" * 100_000)
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox._envd_access_token,  # the SDK keeps it; we reuse it for a raw request
        "Accept-Encoding": "gzip",
    }

    raw = httpx.get(f"{endpoint.sandbox_url}/files", params={"path": "/home/user/z.txt"}, headers=headers)

    assert raw.headers["content-encoding"] == "gzip"
    assert raw.content == b"z" * 100_000
    assert raw.num_bytes_downloaded < 1_000


def test_watch_dir_polling_reports_creates_and_writes(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/home/user/watched")
    watcher = sandbox.files.watch_dir("/home/user/watched", recursive=True)

    sandbox.files.write("/home/user/watched/new.txt", "1")
    sandbox.commands.run("mkdir /home/user/watched/sub && sleep 0.2 && echo x > /home/user/watched/sub/inner.txt")
    expected = {("new.txt", "CREATE"), ("sub", "CREATE"), ("sub/inner.txt", "CREATE")}
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + scaled(10)  # polled until they are all there; the bound only if one never is
    while not expected <= seen and time.monotonic() < deadline:
        seen |= {(e.name, e.type.name) for e in watcher.get_new_events()}
        time.sleep(0.05)
    watcher.stop()

    assert expected <= seen


# --- lifecycle --------------------------------------------------------------------------------


COUNTER = (  # written aside and renamed: a reader never sees the file truncated but not yet written
    "nohup bash -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count;"
    " sleep 0.05; done' >/dev/null 2>&1 &"
)


def count_reaching(sandbox: Sandbox, at_least: int) -> int:
    """The counter once it reaches `at_least` (or where it stood after a minute: it stopped); 0 before the
    counter wrote its first value."""
    deadline = time.monotonic() + 60
    while True:
        value = int(sandbox.commands.run("cat /tmp/count 2>/dev/null || echo 0").stdout)
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def in_upper_layer(sandbox_id: str, path: str) -> Path:
    """A file the sandbox wrote, as the host sees it in the sandbox's upper layer (read only by the test)."""
    found = list(default_state_root().glob(f"server-*/boxes/{sandbox_id}/upper{path}"))
    assert len(found) == 1, found
    return found[0]


def test_pause_freezes_processes_and_resume_keeps_their_memory(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        sbx.commands.run(COUNTER)
        before = count_reaching(sbx, 3)
        assert sbx.pause() is True
        counter = in_upper_layer(sbx.sandbox_id, "/tmp/count")
        while_paused = [counter.read_text()]
        time.sleep(0.5)  # ten ticks of a counter that is not frozen
        while_paused.append(counter.read_text())
        resumed = Sandbox.connect(sbx.sandbox_id)
        right_after = int(resumed.commands.run("cat /tmp/count").stdout)
        later = count_reaching(resumed, right_after + 1)
    finally:
        Sandbox.kill(sbx.sandbox_id)

    assert while_paused[0] == while_paused[1]  # frozen: no process of the sandbox ran
    assert before <= int(while_paused[0]) <= right_after  # it went on from where it stopped, not from 0
    assert later > right_after  # and the process, with its count in memory, runs on


def test_the_timeout_kills_the_sandbox_at_end_at(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=1)
    end_at = Sandbox.get_info(sbx.sandbox_id).end_at

    gone: Exception | None = None
    gone_at = None
    deadline = time.monotonic() + scaled(30)  # asked until the sandbox is gone; the bound only if it never is
    while gone is None and time.monotonic() < deadline:
        try:
            Sandbox.get_info(sbx.sandbox_id)
            time.sleep(0.05)
        except Exception as error:  # which one is asserted below
            gone, gone_at = error, datetime.now(UTC)

    assert type(gone).__name__ == "SandboxNotFoundException"
    assert gone_at is not None and gone_at >= end_at  # not before its end


def test_list_by_metadata_finds_own_sandbox(sandbox: Sandbox) -> None:
    query = SandboxQuery(state=[SandboxState.RUNNING], metadata={"test": "localbox"})

    found = [s.sandbox_id for s in Sandbox.list(query=query).next_items()]

    assert sandbox.sandbox_id in found


def test_async_sdk_runs_commands_and_files(endpoint: LocalEndpoint) -> None:
    async def scenario() -> tuple[str, str, bool]:
        sbx = await AsyncSandbox.create(timeout=60)
        try:
            result = await sbx.commands.run("echo async")
            await sbx.files.write("/home/user/a.txt", "async file")
            text = await sbx.files.read("/home/user/a.txt")
            seen = asyncio.Event()
            handle = await sbx.files.watch_dir("/home/user", on_event=lambda e: e.name == "watched.txt" and seen.set())
            await sbx.files.write("/home/user/watched.txt", "w")
            with contextlib.suppress(TimeoutError):  # waited for; the bound only if it never comes
                await asyncio.wait_for(seen.wait(), scaled(10))
            await handle.stop()
            return result.stdout, text, seen.is_set()
        finally:
            await sbx.kill()

    assert asyncio.run(scenario()) == ("async\n", "async file", True)
