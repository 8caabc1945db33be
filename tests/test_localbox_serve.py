"""`e2b-bench serve` as a process: exports, shutdown clean-up, crash recovery, debug ports, keepalives."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import scaled

REPO = Path(__file__).resolve().parents[1]


def start_serve(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], dict[str, str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "serve", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    exports: dict[str, str] = {}
    assert process.stdout is not None
    while len(exports) < 3:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"serve exited early: {process.stderr.read() if process.stderr else ''}")
        if match := re.match(r"export (E2B_\w+)=(.+)", line):
            value = match.group(2)
            if key_file := re.fullmatch(r'"\$\(cat (.+)\)"', value):  # the key is named by its file, never printed
                value = Path(key_file.group(1)).read_text().strip()
            exports[match.group(1)] = value
    return process, exports


@contextlib.contextmanager
def serve_until_done(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """`start_serve`, and a serve the test did not end (it failed first) stopped, never left running."""
    process, exports = start_serve(*args)
    try:
        yield process, exports
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=scaled(30))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sandbox_pids(server_dir: Path) -> set[int]:
    """Live processes holding the sandboxes of a server (from their pid files) and their pid 1s."""
    found = set()
    # boxes/ of this server's state directory or of the servers under it; never a walk into the sandboxes' own
    # trees, nor one that a disk mounted or removed meanwhile (a spare taken, a sandbox ended) breaks
    for boxes in (server_dir / "boxes", *server_dir.glob("*/boxes")):
        for pid_file in boxes.glob("*/pid"):
            with contextlib.suppress(OSError, ValueError):
                holder = int(pid_file.read_text())
                found |= {holder, *map(int, Path(f"/proc/{holder}/task/{holder}/children").read_text().split())}
    return {pid for pid in found if alive(pid)}


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "state"


def crash_then_serve_again(process: subprocess.Popen[str], running: set[int]) -> None:
    """SIGKILL a serve, give its sandboxes' processes a bounded while to end, then start and stop a second serve
    (which finds the first one's leftovers)."""
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=scaled(10))
    deadline = time.monotonic() + scaled(10)
    while any(alive(pid) for pid in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    second, _ = start_serve()
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=scaled(30))


def sandbox_via(exports: dict[str, str]) -> Sandbox:
    return Sandbox.create(
        timeout=60,
        api_key=exports["E2B_API_KEY"],
        api_url=exports["E2B_API_URL"],
        sandbox_url=exports["E2B_SANDBOX_URL"],
    )


def test_serve_prints_exports_and_sigterm_kills_every_sandbox_and_removes_its_files(state_dir: Path) -> None:
    process, exports = start_serve("--state-dir", str(state_dir), "--api-key", "e2b_" + "1" * 40)
    try:
        sbx = sandbox_via(exports)
        sbx.commands.run("nohup sleep 300 >/dev/null 2>&1 &")
        running = sandbox_pids(state_dir)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=scaled(30))  # the shutdown: its sandboxes killed, their files removed

    assert exports["E2B_API_URL"] == exports["E2B_SANDBOX_URL"]
    assert exports["E2B_API_URL"].startswith("http://127.0.0.1:")
    assert exports["E2B_API_KEY"] == "e2b_" + "1" * 40
    assert len(running) >= 1
    assert process.returncode == 0
    assert {pid for pid in running if alive(pid)} == set()
    assert not state_dir.exists() or not any(state_dir.rglob("upper"))
    assert str(state_dir) not in Path("/proc/mounts").read_text()


def test_serve_names_the_file_holding_its_api_key_and_never_prints_the_key(state_dir: Path) -> None:
    key = "e2b_" + "2" * 40
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "serve", "--state-dir", str(state_dir), "--api-key", key],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = [process.stdout.readline() for _ in range(5)]
        [export] = [line for line in banner if line.startswith("export E2B_API_KEY=")]
        exported = subprocess.run(["sh", "-c", f"{export.strip()}; echo $E2B_API_KEY"], capture_output=True, text=True)
        mode = stat.S_IMODE((state_dir / "api-key").stat().st_mode)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=scaled(30))

    assert key not in "".join(banner)
    assert export.strip() == f'export E2B_API_KEY="$(cat {state_dir / "api-key"})"'
    assert exported.stdout == key + "\n"  # the line still works as it is pasted
    assert mode == 0o600
    assert not (state_dir / "api-key").exists()  # gone with the server


def test_a_crashed_server_leaves_nothing_running_and_the_next_one_cleans_its_files(tmp_path: Path) -> None:
    with serve_until_done() as (process, exports):
        sbx = sandbox_via(exports)
        sbx.commands.run("nohup sleep 300 >/dev/null 2>&1 &")
        leftovers = [p for p in Path(f"/tmp/e2b-bench-localbox-{os.getuid()}").glob(f"server-{process.pid}-*")]
        running = set().union(*(sandbox_pids(p) for p in leftovers))

        crash_then_serve_again(process, running)

    assert len(leftovers) == 1 and len(running) >= 2
    assert {pid for pid in running if alive(pid)} == set()
    assert not leftovers[0].exists()


def test_serve_refuses_with_one_sentence_when_namespaces_cannot_be_made() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cli", "serve"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": "/nonexistent"},
        timeout=60,
        check=False,
    )

    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "unshare" in done.stderr


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


FETCH = (
    "import urllib.request, urllib.error\n"
    "try:\n"
    "    print(urllib.request.urlopen('http://127.0.0.1:49983/files?path=/etc/hostname', timeout=60).status)\n"
    "except urllib.error.HTTPError as refused:\n"
    "    print(refused.code)\n"
)


@pytest.mark.skipif(not (_free(3000) and _free(49983)), reason="ports 3000 and 49983 are taken on this host")
def test_debug_ports_serve_clients_that_never_call_the_api_if_they_run_as_the_servers_user() -> None:
    process, _ = start_serve("--debug-ports")
    try:
        code = (
            "from e2b import Sandbox\n"
            "s = Sandbox.create()\n"
            "print(s.sandbox_id, s.commands.run('hostname').stdout.strip(), s.files.write('d.txt', 'x').path)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            # Without the session endpoint's E2B_*_URL: they would win over debug mode's localhost ports.
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("E2B_")},
                "E2B_DEBUG": "true",
                "E2B_API_KEY": "e2b_unused",
            },
            timeout=60,
            check=False,
        )
        run_as = {"own user": [], "another user": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]}
        fetched = {
            who: subprocess.run(
                [*prefix, "/usr/bin/python3", "-c", FETCH], capture_output=True, text=True, timeout=120, check=False
            ).stdout.strip()
            for who, prefix in run_as.items()
        }
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=scaled(30))

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["debug_sandbox_id", "debug_sandbox_id", "/home/user/d.txt"]
    # E2B_DEBUG clients send no token: a process of another host user gets envd's 401, the server's own user runs.
    assert fetched == {"own user": "200", "another user": "401"}


def read_envelopes(body: bytes) -> list[tuple[int, dict]]:
    frames, offset = [], 0
    while offset + 5 <= len(body):
        flags, length = body[offset], int.from_bytes(body[offset + 1 : offset + 5], "big")
        frames.append((flags, json.loads(body[offset + 5 : offset + 5 + length])))
        offset += 5 + length
    return frames


def test_keepalives_arrive_at_the_requested_interval_and_the_stream_ends_properly(
    sandbox: Sandbox, endpoint: LocalEndpoint
) -> None:
    request = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 2.2; echo done"]}}).encode()
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox._envd_access_token,
        "Content-Type": "application/connect+json",
        "Keepalive-Ping-Interval": "1",
    }

    response = httpx.post(
        f"{endpoint.sandbox_url}/process.Process/Start",
        content=b"\0" + len(request).to_bytes(4, "big") + request,
        headers=headers,
        timeout=30,
    )

    frames = read_envelopes(response.content)
    kinds = [next(iter(f["event"])) if flags == 0 else "end-stream" for flags, f in frames]
    assert kinds[0] == "start"
    assert kinds.count("keepalive") == 2
    assert kinds[-3:] == ["data", "end", "end-stream"]
    assert frames[-1] == (2, {})


def test_stream_input_feeds_stdin_in_order(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat", background=True, stdin=True)

    sandbox.commands.stream_input(handle.pid, iter([b"one ", b"two ", b"three"]))
    sandbox.commands.close_stdin(handle.pid)

    assert handle.wait().stdout == "one two three"


def test_serve_refuses_a_pool_it_cannot_have_in_one_sentence(tmp_path: Path) -> None:
    from bench.localbox.registry import POOL_MAX

    command = [sys.executable, "-m", "bench.cli", "serve", "--state-dir", str(tmp_path / "state"), "--pool"]
    done = subprocess.run([*command, str(POOL_MAX + 1)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    refusal = f"--pool takes a number of sandboxes from 0 to {POOL_MAX}, not {POOL_MAX + 1}"
    assert done.stderr == f"e2b-bench serve: {refusal}\n"
    assert not (tmp_path / "state").exists()  # refused before anything was made
