"""The embedded endpoint behaves as E2B where clients written elsewhere tell the difference (#13).

Each test drives the unmodified SDKs (Python sync and async, npm where it has the call) and checks the
resulting state a second way: a shell command in the sandbox, the REST API, or the raw HTTP answer.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import gzip
import json
import logging
import os
import resource
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FileType,
    InvalidArgumentException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
)
from js_sdk import run_js

from bench.localbox.files import download_encoding
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread
from bench.remote.slowness import scaled


def envd(endpoint: LocalEndpoint, sandbox: Sandbox) -> httpx.Client:
    """A plain client of the sandbox's envd, authenticated as the SDK is."""
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}
    # On a quiet host a 512 MiB gzip bomb is inflated and written in seconds; a busy one takes its slowness longer.
    return httpx.Client(base_url=endpoint.sandbox_url, headers=headers, timeout=scaled(30))


def wait_for(predicate: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    """Wait for a condition the server reaches on its own (after a client left); fail with `what` if it never does
    (`limit_s` on a quiet host, scaled by this one's slowness)."""
    deadline = time.monotonic() + scaled(limit_s)
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# --- 1. a directory's mode is its permission bits ---------------------------------------------------------


def test_a_directorys_mode_is_its_permission_bits_only(sandbox: Sandbox, tmp_path: Path) -> None:
    sandbox.commands.run("mkdir -p /home/user/d/inner && chmod 750 /home/user/d/inner")

    info = sandbox.files.get_info("/home/user/d")
    listed = {e.name: e.mode for e in sandbox.files.list("/home/user/d")}
    made = run_js(
        "const s = await Sandbox.connect(values.id); return (await s.files.getInfo('/home/user/d')).mode;",
        tmp_path,
        id=sandbox.sandbox_id,
    )
    shell = sandbox.commands.run("stat -c %a /home/user/d /home/user/d/inner").stdout

    assert (info.type, info.mode, listed, made) == (FileType.DIR, 0o755, {"inner": 0o750}, 0o755)
    assert shell == "755\n750\n"


# --- 2. removing a missing path succeeds ------------------------------------------------------------------


def test_removing_a_missing_path_succeeds_as_envds_remove_all(sandbox: Sandbox, tmp_path: Path) -> None:
    sandbox.files.remove("/home/user/never-there")
    run_js(
        "const s = await Sandbox.connect(values.id); await s.files.remove('/home/user/not-either');",
        tmp_path,
        id=sandbox.sandbox_id,
    )

    left = sandbox.commands.run("ls -d /home/user/never-there /home/user/not-either 2>/dev/null; true").stdout

    assert left == ""
    assert sandbox.files.exists("/home/user/never-there") is False


# --- 3. an upload answers and replaces the file's metadata ------------------------------------------------

XATTRS = 'python3 -c "import os,sys; print(sorted(os.listxattr(sys.argv[1])))" '


def test_an_upload_answers_its_metadata_and_replaces_or_clears_the_old(sandbox: Sandbox) -> None:
    first = sandbox.files.write("/home/user/m.txt", "1", metadata={"a": "1", "b": "2"})
    second = sandbox.files.write("/home/user/m.txt", "2", metadata={"c": "3"})
    after_second = sandbox.files.get_info("/home/user/m.txt").metadata
    third = sandbox.files.write("/home/user/m.txt", "3")
    after_third = sandbox.files.get_info("/home/user/m.txt").metadata
    xattrs = sandbox.commands.run(XATTRS + "/home/user/m.txt").stdout

    assert (first.metadata, second.metadata, third.metadata) == ({"a": "1", "b": "2"}, {"c": "3"}, None)
    assert (after_second, after_third) == ({"c": "3"}, None)
    assert xattrs == "[]\n"


# --- 4. files whose stat size is 0 are read whole, as the sandbox reads them --------------------------------


def test_a_proc_file_of_size_zero_is_read_whole_and_the_connection_stays_usable(
    sandbox: Sandbox, endpoint: LocalEndpoint
) -> None:
    hostname = sandbox.files.read("/proc/sys/kernel/hostname")
    status = sandbox.files.read("/proc/1/status")
    with envd(endpoint, sandbox) as client:
        raw = client.get("/files", params={"path": "/proc/sys/kernel/hostname"})
        again = client.get("/files", params={"path": "/proc/sys/kernel/hostname"})
    shell = sandbox.commands.run("stat -c %s /proc/sys/kernel/hostname; cat /proc/sys/kernel/hostname").stdout

    assert shell == f"0\n{sandbox.sandbox_id}\n" and hostname == f"{sandbox.sandbox_id}\n"
    assert status.startswith("Name:\t")
    assert raw.headers["content-length"] == str(len(hostname)) and raw.text == again.text == hostname


# --- 5. killing a sandbox cuts its streams ----------------------------------------------------------------


def test_killing_the_sandbox_cuts_a_streaming_command_without_an_end_event(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60)
    handle = sbx.commands.run("echo started; sleep 60", background=True)
    threading.Timer(0.5, lambda: Sandbox.kill(sbx.sandbox_id)).start()

    with pytest.raises(SandboxNotRunningException) as cut:
        handle.wait()
    health = httpx.get(f"{endpoint.sandbox_url}/health", headers={"E2b-Sandbox-Id": sbx.sandbox_id})

    assert "killed or reached its end of life" in str(cut.value)
    assert health.status_code == 502 and "was not found" in health.json()["message"]


def test_killing_the_sandbox_cuts_an_async_stream_too(endpoint: LocalEndpoint) -> None:
    async def scenario() -> str:
        sbx = await AsyncSandbox.create(timeout=60)
        handle = await sbx.commands.run("sleep 60", background=True)
        await sbx.kill()
        try:
            await handle.wait()
        except SandboxNotRunningException as exc:
            return str(exc)
        return "ended cleanly"

    assert "killed or reached its end of life" in asyncio.run(scenario())


def test_the_npm_sdk_sees_a_killed_sandbox_as_gone(endpoint: LocalEndpoint, tmp_path: Path) -> None:
    result = run_js(
        """
        const s = await Sandbox.create({ timeoutMs: 60000 });
        const handle = await s.commands.run('sleep 60', { background: true });
        await s.kill();
        try { await handle.wait(); return ['ended cleanly']; } catch (e) { return [e.name, e.message]; }
        """,
        tmp_path,
    )

    assert result[0] == "TimeoutError" and "killed or reached its end of life" in result[1]


def test_killing_the_sandbox_ends_a_watch_stream_as_the_sandbox_gone(endpoint: LocalEndpoint) -> None:
    async def scenario() -> BaseException | None:
        sbx = await AsyncSandbox.create(timeout=60)
        ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        await sbx.files.watch_dir("/home/user", on_event=lambda e: None, on_exit=ended.set_result, timeout=0)
        await sbx.kill()
        return await asyncio.wait_for(ended, scaled(30))

    assert isinstance(asyncio.run(scenario()), SandboxNotRunningException)


# A stopped sandbox's connections are lost as E2B's proxy loses them: no end message, no last chunk.
SLOW_ANSWER = """
import socket, threading, time
def answer(conn):
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 1000\\r\\n\\r\\nfirst")
    time.sleep(600)
listener = socket.create_server(("127.0.0.1", 8125))
print("listening", flush=True)
while True:
    threading.Thread(target=answer, args=(listener.accept()[0],), daemon=True).start()
"""


def stop(server: LocalServer, sandbox_id: str, how: str) -> None:
    """End a sandbox as E2B's are ended: killed, paused, or past the timeout it is given now."""
    url, key = server.endpoint.api_url, {"X-API-KEY": server.api_key}
    answer = {
        "kill": lambda: httpx.delete(f"{url}/sandboxes/{sandbox_id}", headers=key),
        "pause": lambda: httpx.post(f"{url}/sandboxes/{sandbox_id}/pause", headers=key),
        "timeout": lambda: httpx.post(f"{url}/sandboxes/{sandbox_id}/timeout", json={"timeout": 0}, headers=key),
    }[how]()
    assert answer.status_code == 204, answer.text


def read_until_stopped(server: LocalServer, sandbox_id: str, how: str, request: httpx.Request) -> tuple[int, str]:
    """Send `request`, stop the sandbox at its first bytes, read on: (bytes after them, how the answer ended)."""
    with httpx.Client(timeout=httpx.Timeout(scaled(60))) as client:
        answer = client.send(request, stream=True)
        chunks = answer.iter_raw()
        next(chunks)
        stop(server, sandbox_id, how)
        after = 0
        try:
            for chunk in chunks:
                after += len(chunk)
        except httpx.ReadError as exc:
            return after, f"reset: {exc}"
        except httpx.RemoteProtocolError as exc:
            return after, f"closed: {exc}"
        finally:
            answer.close()
    return after, "ended"


def own_sandbox(server: LocalServer) -> tuple[str, dict[str, str]]:
    created = httpx.post(
        f"{server.endpoint.api_url}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": server.api_key}
    ).json()
    return created["sandboxID"], {"E2b-Sandbox-Id": created["sandboxID"], "X-Access-Token": created["envdAccessToken"]}


RESET = "reset: [Errno 104] Connection reset by peer"


@pytest.mark.parametrize("how", ["kill", "pause", "timeout"])
@pytest.mark.parametrize(
    "rpc, message",
    [
        ("/process.Process/Start", {"process": {"cmd": "/bin/sleep", "args": ["60"]}}),
        ("/filesystem.Filesystem/WatchDir", {"path": "/home/user"}),
    ],
)
def test_a_stopped_sandboxs_streams_lose_their_connection_without_an_end_message(
    own_server: LocalServer, how: str, rpc: str, message: dict
) -> None:
    sandbox_id, headers = own_sandbox(own_server)
    headers["Content-Type"] = "application/connect+json"
    request = httpx.Request("POST", own_server.endpoint.sandbox_url + rpc, headers=headers, content=envelope(message))
    try:
        ended = read_until_stopped(own_server, sandbox_id, how, request)
    finally:
        httpx.delete(f"{own_server.endpoint.api_url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": own_server.api_key})

    assert ended == (0, RESET)


def test_a_port_connection_of_a_paused_sandbox_is_cut(own_server: LocalServer) -> None:
    sandbox_id, headers = own_sandbox(own_server)
    headers["Content-Type"] = "application/connect+json"
    run = envelope({"process": {"cmd": "/usr/bin/python3", "args": ["-c", SLOW_ANSWER]}})
    port = httpx.Request(
        "GET", own_server.endpoint.sandbox_url, headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "8125"}
    )
    try:
        with (
            httpx.Client(base_url=own_server.endpoint.sandbox_url, headers=headers, timeout=scaled(60)) as envd,
            envd.stream("POST", "/process.Process/Start", content=run) as server,
        ):
            frames = server.iter_raw()
            while b'"stdout"' not in next(frames):  # its "listening"
                pass
            ended = read_until_stopped(own_server, sandbox_id, "pause", port)
    finally:
        httpx.delete(f"{own_server.endpoint.api_url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": own_server.api_key})

    assert ended == (0, RESET)


# --- 6. kill returns once the process is gone -------------------------------------------------------------


def test_a_kill_returns_once_the_process_is_reaped(sandbox: Sandbox) -> None:
    seen: list[tuple[bool, bool]] = []
    for _ in range(20):
        command = sandbox.commands.run("sleep 60", background=True)
        pty = sandbox.pty.create(PtySize(rows=24, cols=80))
        killed = (sandbox.commands.kill(command.pid), sandbox.pty.kill(pty.pid))
        listed = {p.pid for p in sandbox.commands.list()}
        alive = sandbox.commands.run(f"ls -d /proc/{command.pid} /proc/{pty.pid} 2>/dev/null; true").stdout
        seen.append((killed == (True, True), not ({command.pid, pty.pid} & listed) and alive == ""))

    assert seen == [(True, True)] * 20


# --- 7. a stream whose client went away is cancelled ------------------------------------------------------


def inotify_fds() -> int:
    """inotify instances this process holds: the endpoint serves from a thread of it, reading each watch's."""
    found = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            found += os.readlink(fd) == "anon_inode:inotify"
        except OSError:
            continue
    return found


def test_a_watch_whose_client_went_away_is_closed(sandbox: Sandbox) -> None:
    before = inotify_fds()

    async def watch_and_leave() -> int:
        async_sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        handle = await async_sbx.files.watch_dir("/home/user", on_event=lambda e: None)
        during = inotify_fds()
        await handle.stop()
        return during

    during = asyncio.run(watch_and_leave())

    assert during == before + 1
    wait_for(lambda: inotify_fds() == before, "the watch outlived its client")


@pytest.fixture(scope="module")
def own_server() -> Iterator[LocalServer]:
    """An endpoint whose registry the test can look into (the session's is reached only over HTTP)."""
    server = LocalServer(pool_size=0)
    with in_thread(server):
        yield server


def envelope(message: dict) -> bytes:
    data = json.dumps(message).encode()
    return b"\0" + struct.pack(">I", len(data)) + data


def test_a_command_stream_whose_client_went_away_is_cancelled(own_server: LocalServer) -> None:
    url = own_server.endpoint.api_url
    created = httpx.post(f"{url}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": own_server.api_key})
    sandbox_id, token = created.json()["sandboxID"], created.json()["envdAccessToken"]
    headers = {"Content-Type": "application/connect+json", "E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token}
    start = envelope({"process": {"cmd": "/bin/sleep", "args": ["60"]}})
    with (
        httpx.Client(base_url=url, headers=headers, timeout=scaled(10)) as client,
        client.stream("POST", "/process.Process/Start", content=start) as answer,
    ):
        chunks = answer.iter_raw()  # held: a dropped iterator closes the connection
        first = json.loads(next(chunks)[5:])
        pid = first["event"]["start"]["pid"]
        record = own_server.registry.sandboxes[sandbox_id].box.processes[pid]
        listening = len(record.subscribers)

    wait_for(lambda: not record.subscribers, "the stream outlived its client")
    assert listening == 1 and not record.done.is_set()  # the stream is gone, the process is not
    httpx.delete(f"{url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": own_server.api_key})


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_a_server_stops_at_once_after_a_client_dropped_the_stream_of_a_process_still_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The dropped stream's handler ended with its client: the shutdown waits for no connection (nor for its
    thread's bound), the process ends with its sandbox, and how the cancel ended the handler is not reported
    as a failure nobody heard."""
    server = LocalServer(pool_size=0)
    others = set(threading.enumerate())  # other tests' servers may be running
    with in_thread(server):
        sandbox_id, headers = own_sandbox(server)
        headers["Content-Type"] = "application/connect+json"
        with (
            httpx.Client(base_url=server.endpoint.sandbox_url, headers=headers, timeout=scaled(60)) as client,
            client.stream(
                "POST", "/process.Process/Start", content=envelope({"process": {"cmd": "/bin/sleep", "args": ["600"]}})
            ) as answer,
        ):
            pid = json.loads(next(answer.iter_raw())[5:])["event"]["start"]["pid"]
            box = server.registry.sandboxes[sandbox_id].box
            record = box.processes[pid]
        wait_for(lambda: not record.subscribers, "the stream outlived its client")
        holder = box.holder.pid  # type: ignore[union-attr]
        running = not record.done.is_set()
    gc.collect()  # a task whose failure nobody heard is reported as it is collected

    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert running  # the process outlived its stream, up to the shutdown
    assert [t.name for t in threading.enumerate() if t not in others and t.name == "embedded endpoint"] == []
    assert record.done.is_set() and gone(holder)
    assert [m for m in said if "did not stop" in m or "never retrieved" in m] == []


# --- 8. signed-URL refusals carry envd's messages ---------------------------------------------------------


def test_signed_url_refusals_carry_envds_messages(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/signed.txt", "s")
    expired = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=-10)
    forged = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=60).replace(
        "signature=v1_", "signature=v1_x"
    )

    answers = [httpx.get(url) for url in (expired, forged)]

    assert [(a.status_code, a.json()) for a in answers] == [
        (401, {"code": 401, "message": "signature is already expired"}),
        (401, {"code": 401, "message": "invalid signature"}),
    ]


def test_the_npm_sdks_expired_url_gets_envds_message(sandbox: Sandbox, tmp_path: Path) -> None:
    sandbox.files.write("/home/user/signed.txt", "s")

    answer = run_js(
        """
        const s = await Sandbox.connect(values.id);
        const url = await s.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -10000 });
        const res = await fetch(url);
        return [res.status, await res.json()];
        """,
        tmp_path,
        id=sandbox.sandbox_id,
    )

    assert answer == [401, {"code": 401, "message": "signature is already expired"}]


# --- 9. metrics honour their window -----------------------------------------------------------------------


def test_metrics_honour_the_window(sandbox: Sandbox, tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    before = sandbox.get_metrics(start=now - datetime.timedelta(hours=2), end=now - datetime.timedelta(hours=1))
    current = sandbox.get_metrics()
    js_before = run_js(
        "const s = await Sandbox.connect(values.id);"
        "return (await s.getMetrics({ start: new Date(Date.now() - 7200e3), end: new Date(Date.now() - 3600e3) }))"
        ".length;",
        tmp_path,
        id=sandbox.sandbox_id,
    )

    assert (before, js_before) == ([], 0)
    assert len(current) == 1 and current[0].mem_used > 0


# --- 10. a pause without memory cold-boots on resume -----------------------------------------------------

BOOT_STATE = (
    "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f22 /proc/1/stat; pgrep -f '^sleep 600$' | wc -l; cat ~/kept"
)
# A process that outlives its command, started only once it runs (a fork may exec after the command ends).
KEEP_RUNNING = (
    "sleep 600 >/dev/null 2>&1 & for i in $(seq 500); do pgrep -f '^sleep 600$' >/dev/null && break; sleep 0.01; done"
)


def test_a_filesystem_only_pause_cold_boots_on_resume(endpoint: LocalEndpoint) -> None:
    sbx = Sandbox.create(timeout=60)
    other = Sandbox.create(timeout=60)
    try:
        sbx.commands.run(f"echo on-disk > ~/kept; {KEEP_RUNNING}")
        before = sbx.commands.run(BOOT_STATE).stdout.split()
        other_boot = other.files.read("/proc/sys/kernel/random/boot_id")
        sbx.pause(mode="filesystem")
        state = Sandbox.get_info(sbx.sandbox_id).state
        resumed = Sandbox.connect(sbx.sandbox_id)
        after = resumed.commands.run(BOOT_STATE).stdout.split()
    finally:
        sbx.kill()
        other.kill()

    assert state.value == "paused"
    assert before[2:] == ["1", "on-disk"] and after[2:] == ["0", "on-disk"]  # processes gone, files kept
    assert len({before[0], after[0], other_boot.strip()}) == 3  # a boot id per boot of each sandbox
    assert before[1] != after[1]  # pid 1 is another process


def test_an_async_reboot_on_connect_drops_a_memory_pause(endpoint: LocalEndpoint) -> None:
    async def scenario() -> tuple[str, str]:
        sbx = await AsyncSandbox.create(timeout=60)
        try:
            await sbx.commands.run(KEEP_RUNNING)
            await sbx.pause()
            kept = await AsyncSandbox.connect(sbx.sandbox_id)
            running = (await kept.commands.run("pgrep -f '^sleep 600$' | wc -l")).stdout
            await kept.pause()
            rebooted = await AsyncSandbox.connect(sbx.sandbox_id, on_resume="reboot")
            return running, (await rebooted.commands.run("pgrep -f '^sleep 600$' | wc -l")).stdout
        finally:
            await sbx.kill()

    assert asyncio.run(scenario()) == ("1\n", "0\n")


# --- 11. uploads are written by root and handed to the user -----------------------------------------------


def test_an_upload_under_a_root_directory_belongs_to_the_user(sandbox: Sandbox) -> None:
    sandbox.files.write("/opt/made/by/upload.txt", "u")
    sandbox.files.write("/etc/motd", "welcome\n")

    owners = sandbox.commands.run("stat -c '%U %a %n' /opt/made /opt/made/by /opt/made/by/upload.txt /etc/motd")
    content = sandbox.commands.run("cat /etc/motd").stdout

    assert owners.stdout.splitlines() == [
        "user 755 /opt/made",
        "user 755 /opt/made/by",
        "user 644 /opt/made/by/upload.txt",
        "user 644 /etc/motd",
    ]
    assert content == "welcome\n"


def test_async_uploads_are_written_as_envd_writes_them(endpoint: LocalEndpoint) -> None:
    async def scenario() -> tuple[str, str | None, int]:
        sbx = await AsyncSandbox.create(timeout=60)
        try:
            await sbx.files.write("/srv/async/a.txt", "a", metadata={"k": "v"})
            owner = (await sbx.commands.run("stat -c %U /srv/async /srv/async/a.txt")).stdout
            info = await sbx.files.get_info("/srv/async")
            await sbx.files.remove("/srv/async/missing")
            return owner, (await sbx.files.get_info("/srv/async/a.txt")).metadata, info.mode
        finally:
            await sbx.kill()

    assert asyncio.run(scenario()) == ("user\nuser\n", {"k": "v"}, 0o755)


# --- 12. the base template has E2B's tools ----------------------------------------------------------------


def test_the_base_template_has_python_git_curl_sudo_and_xattr_tools(sandbox: Sandbox) -> None:
    found = sandbox.commands.run(
        "for t in python python3 git curl sudo getfattr setfattr; do command -v $t >/dev/null && echo $t; done;"
        " touch x; setfattr -n user.k -v v x && getfattr --only-values -n user.k x; echo"
    ).stdout

    assert found.split() == ["python", "python3", "git", "curl", "sudo", "getfattr", "setfattr", "v"]


# --- 13. an unimplemented route answers 501 naming the feature --------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "feature"),
    [
        ("GET", "/volumes", "volumes"),
        ("POST", "/v2/templates/x/builds/y/logs", "templates"),
        ("GET", "/sandboxes/abc/logs", "sandbox logs"),
        ("GET", "/no/such/thing", "this route"),
    ],
)
def test_an_unimplemented_route_answers_501_naming_the_feature(
    endpoint: LocalEndpoint, method: str, path: str, feature: str
) -> None:
    answer = httpx.request(method, endpoint.api_url + path, headers={"X-API-KEY": endpoint.api_key})

    assert answer.status_code == 501
    assert answer.json() == {
        "code": 501,
        "message": f"{feature} ({method} {path}) is not implemented by this endpoint",
        "error_code": "not_implemented",
    }


def test_an_envd_route_not_served_answers_501_from_envd(plain_envd: httpx.Client) -> None:
    answer = plain_envd.get("/envs")

    assert (answer.status_code, answer.json()) == (
        501,
        {
            "code": 501,
            "message": "this route (GET /envs) is not implemented by this endpoint",
            "error_code": "not_implemented",
        },
    )


# --- the server never blocks on a sandbox, and client errors are 4xx (#12) ---------------------------------


def test_a_fifo_download_is_refused_without_waiting_for_a_writer(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkfifo /home/user/fifo")

    with pytest.raises(InvalidArgumentException) as refused:
        sandbox.files.read("/home/user/fifo")
    other = sandbox.commands.run("echo answered").stdout

    assert "is not a regular file" in str(refused.value)
    assert other == "answered\n"


def test_an_upload_to_a_fifo_is_refused_without_waiting_for_a_reader(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkfifo /home/user/fifo-in")

    with pytest.raises(InvalidArgumentException) as refused:
        sandbox.files.write("/home/user/fifo-in", "x")

    assert "is not a regular file" in str(refused.value)
    assert sandbox.commands.run("test -p /home/user/fifo-in && echo fifo").stdout == "fifo\n"


def test_a_gzip_bomb_is_inflated_as_it_is_written_not_in_memory(sandbox: Sandbox, endpoint: LocalEndpoint) -> None:
    inflated = 512 << 20
    body = gzip.compress(bytes(inflated), compresslevel=9)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10

    with envd(endpoint, sandbox) as client:
        answer = client.post(
            "/files",
            params={"path": "/home/user/bomb"},
            content=body,
            headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
        )
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    size = sandbox.commands.run("stat -c %s /home/user/bomb && rm /home/user/bomb").stdout

    assert answer.status_code == 200 and len(body) < (1 << 20)
    assert size == f"{inflated}\n"
    assert peak_after - peak_before < inflated // 2


@pytest.fixture
def plain_envd(sandbox: Sandbox, endpoint: LocalEndpoint) -> Iterator[httpx.Client]:
    with envd(endpoint, sandbox) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/home/user/a\0b", "path contains a NUL byte"),
        ("/home/user/" + "d/" * 2100 + "f", "path is longer than 4095 bytes"),
        ("/home/user/" + "n" * 300, "is too long"),
        ("/proc/self/fd/1", "goes through a link that leaves the sandbox"),
        ("/proc/1/root/etc/hostname", "goes through a link that leaves the sandbox"),
    ],
)
def test_bad_paths_are_client_errors_in_e2bs_shape(plain_envd: httpx.Client, path: str, message: str) -> None:
    read = plain_envd.get("/files", params={"path": path})
    write = plain_envd.post(
        "/files", params={"path": path}, content=b"x", headers={"Content-Type": "application/octet-stream"}
    )

    for answer in (read, write):
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == 400 and message in answer.json()["message"]


# --- 16. network update -----------------------------------------------------------------------------------


def test_a_network_update_is_applied_or_refused_as_declared(sandbox: Sandbox, endpoint: LocalEndpoint) -> None:
    sandbox.update_network({"allow_out": ["8.8.8.8/32", "*.example.com"]})
    sandbox.update_network({"deny_out": ["10.0.0.0/8"]})
    with pytest.raises(SandboxException) as proxied:
        sandbox.update_network({"egress_proxy": {"address": "127.0.0.1:1080"}})
    bad = httpx.put(
        f"{endpoint.api_url}/sandboxes/{sandbox.sandbox_id}/network",
        json={"denyOut": ["example.com"]},
        headers={"X-API-KEY": endpoint.api_key},
    )
    missing = httpx.put(f"{endpoint.api_url}/sandboxes/nope/network", json={}, headers={"X-API-KEY": endpoint.api_key})
    still_out = sandbox.commands.run("echo reachable").stdout

    assert str(proxied.value) == "501: this endpoint cannot enforce an egress proxy ('egressProxy')"
    assert (bad.status_code, bad.json()["message"]) == (
        400,
        "'denyOut' entry is not a CIDR block or an IP address: 'example.com'",
    )
    assert missing.status_code == 404 and still_out == "reachable\n"


# A process that never reads its stdin, reporting how many bytes wait in it (FIONREAD) in ~/fill.
NON_READER = (
    'while true; do python3 -c \'import array,fcntl,termios; n=array.array("i",[0]);'
    " fcntl.ioctl(0, termios.FIONREAD, n); print(n[0])' > ~/fill.new && mv ~/fill.new ~/fill; sleep 0.05; done"
)


def test_stdin_for_a_process_that_does_not_read_waits_without_stalling_the_server(sandbox: Sandbox) -> None:
    reader = sandbox.commands.run(NON_READER, background=True, stdin=True)
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            sandbox.commands.send_stdin(reader.pid, b"x" * (1 << 20), request_timeout=60)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    wait_for(lambda: sandbox.commands.run("cat ~/fill; true").stdout == "65536\n", "stdin never filled up")
    answered = sandbox.commands.run("echo answered").stdout
    pending = sender.is_alive()
    sandbox.commands.kill(reader.pid)
    sender.join(30)

    assert (answered, pending) == ("answered\n", True)
    assert len(outcome) == 1 and isinstance(outcome[0], SandboxException)


@pytest.mark.parametrize(
    ("path", "message"),
    [("/home/user/a\0b", "path contains a NUL byte"), ("/home/user/" + "n" * 300, "File name too long")],
)
def test_bad_paths_in_filesystem_calls_are_invalid_arguments(plain_envd: httpx.Client, path: str, message: str) -> None:
    answer = plain_envd.post("/filesystem.Filesystem/MakeDir", json={"path": path})

    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_argument" and message in answer.json()["message"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"X-Metadata-Key": "caf\u00e9".encode()}, "printable US-ASCII"),
        ({"X-Metadata-Key": b"tab\there"}, "printable US-ASCII"),
        ({"X-Metadata-" + "k" * 247: "v"}, "metadata key longer than 246 bytes"),
        ({f"X-Metadata-k{i}": "v" * 200 for i in range(20)}, "metadata larger than 4096 bytes"),
    ],
)
def test_metadata_envd_refuses_is_refused_and_nothing_is_written(
    plain_envd: httpx.Client, sandbox: Sandbox, headers: dict[str, str | bytes], message: str
) -> None:
    answer = plain_envd.post(
        "/files",
        params={"path": "/home/user/meta.txt"},
        content=b"x",
        headers={"Content-Type": "application/octet-stream", **headers},
    )

    assert answer.status_code == 400 and message in answer.json()["message"]
    assert sandbox.files.exists("/home/user/meta.txt") is False


def test_the_npm_sdk_applies_egress_rules_and_gets_the_refusal_of_a_proxy(sandbox: Sandbox, tmp_path: Path) -> None:
    answer = run_js(
        """
        const s = await Sandbox.connect(values.id);
        await s.updateNetwork({ denyOut: ['198.51.100.0/24'] });
        try { await s.updateNetwork({ egressProxy: { address: '127.0.0.1:1080' } }); return 'applied'; }
        catch (e) { return e.message; }
        """,
        tmp_path,
        id=sandbox.sandbox_id,
    )

    assert "this endpoint cannot enforce an egress proxy ('egressProxy')" in answer
    assert sandbox.get_info().network == {"allow_out": [], "deny_out": ["198.51.100.0/24"]}


@pytest.mark.parametrize(
    ("accept", "encoding"),
    [
        ("", "identity"),
        ("gzip", "gzip"),  # what the SDKs send for gzip=True
        ("gzip, deflate", "identity"),  # httpx's and undici's default: envd answers plain bytes
        ("br;q=1, identity;q=0", None),  # neither identity nor gzip: 406
        ("*;q=0", None),
        ("gzip, identity;q=0", "gzip"),
        ("br, *;q=0", None),
    ],
)
def test_a_download_is_encoded_as_the_client_accepts_or_refused(accept: str, encoding: str | None) -> None:
    assert download_encoding(accept) == encoding
