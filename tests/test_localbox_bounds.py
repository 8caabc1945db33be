"""Nothing one sandbox or one client does grows the embedded endpoint without bound (#44).

The server runs in this process (the session's endpoint), so its memory is this process's resident set: each test
measures the growth while a sandbox or client fills what the server would hold, and compares another client's
latency with its own quiet baseline taken in the same test.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxException
from e2b.sandbox_sync.filesystem.watch_handle import WatchHandle

from bench.localbox import server as localbox_server
from bench.localbox.agent import DATABASE_MAX
from bench.localbox.server import LocalEndpoint
from bench.localbox.watch import PENDING_MAX
from bench.remote.slowness import scaled

GROWTH_MAX = 64 << 20  # what the server may grow by under any one form (#44)


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS in /proc/self/status")


def latencies(call: Callable[[], object], count: int = 15) -> list[float]:
    taken = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        taken.append(time.perf_counter() - start)
    return taken


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + scaled(seconds)
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {scaled(seconds):.0f} s: {what}")
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def frozen_heap() -> None:
    """What this process imported and booted (pytest, the SDKs, the server) kept out of later collections, as
    `serve` keeps its own (LocalServer.run): a full collection of this test process's heap takes 0.3 s of CPU, of
    this process and not of the server, and would be measured as the server's latency."""
    gc.freeze()


@pytest.fixture
def sbx(endpoint: LocalEndpoint) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def succeeds(sbx: Sandbox, script: str) -> bool:
    try:
        sbx.commands.run(script, user="root")
    except CommandExitException:
        return False
    return True


# The process named {name} wrote nothing for half a second: it waits on its full pipe.
STALLED = (
    "pid=$(pgrep -xo {name}) || exit 3; a=$(grep wchar /proc/$pid/io); sleep 0.5; "
    'b=$(grep wchar /proc/$pid/io); [ "$a" = "$b" ]'
)


OUTPUT_MB = 128  # more than GROWTH_MAX: held in the server, it would fail the bound


def test_unread_output_of_a_background_command_waits_in_its_pipe_not_in_the_server(sbx: Sandbox) -> None:
    before = rss()
    handle = sbx.commands.run(
        f"head -c {OUTPUT_MB}M /dev/zero | tr '\\0' y; touch /tmp/written", background=True
    )  # and not waited for: nothing reads its stream
    wait_for(lambda: succeeds(sbx, STALLED.format(name="tr")), 60, "the command's writer waits on its pipe")
    grown = rss() - before
    written = succeeds(sbx, "test -e /tmp/written")

    result = handle.wait()  # reading now: every byte arrives, in order

    assert not written
    assert grown <= GROWTH_MAX, f"the server grew by {grown >> 20} MiB holding unread output"
    assert len(result.stdout) == OUTPUT_MB << 20 and set(result.stdout) == {"y"}


WATCHERS = 5
TOUCHES = 60_000  # two events each (the truncation and the write), alternating names so none is coalesced


def test_unpolled_watchers_hold_a_bounded_backlog_and_a_poll_never_stalls_another_client(
    endpoint: LocalEndpoint, sbx: Sandbox
) -> None:
    other = httpx.Client(base_url=endpoint.api_url, headers={"X-API-Key": endpoint.api_key})
    ask_other = lambda: other.get(f"/sandboxes/{sbx.sandbox_id}").raise_for_status()  # noqa: E731
    quiet = latencies(ask_other)
    sbx.commands.run("mkdir -p /tmp/w")
    handles = [sbx.files.watch_dir("/tmp/w") for _ in range(WATCHERS)]
    before = rss()

    sbx.commands.run(f"for i in $(seq {TOUCHES}); do echo $i > /tmp/w/f$((i % 2)); done", timeout=0)
    grown = rss() - before
    taken: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        polls = pool.submit(lambda: [poll_until_error(handle) for handle in handles])
        while not polls.done():
            taken += latencies(ask_other, 1)
        answers = polls.result()
    for handle in handles:
        handle.stop()
    other.close()

    assert grown <= GROWTH_MAX, f"the server grew by {grown >> 20} MiB holding watch events"
    for sizes, names, error in answers:
        # each poll gets at most what a watcher holds, in order; far more was made than the server and the
        # kernel's queue hold, and the watcher then reports the overflow as envd reports fsnotify's
        assert max(sizes) <= PENDING_MAX and names <= {"f0", "f1"}, (sizes, names)
        assert error.endswith(OVERFLOW) and sum(sizes) < 2 * TOUCHES, (error, sizes)
    assert max(taken) <= max(quiet) + scaled(0.1), (quiet, taken)


OVERFLOW = "watcher error: fsnotify: queue or buffer overflow"


def poll_until_error(handle: WatchHandle) -> tuple[list[int], set[str], str]:
    """How many events each poll got, their names, and the error that ended the polls."""
    sizes: list[int] = []
    names: set[str] = set()
    while True:
        try:
            events = handle.get_new_events()
        except SandboxException as exc:
            return sizes, names, str(exc)
        sizes.append(len(events))
        names |= {event.name for event in events}
        if len(sizes) > 2 * TOUCHES // 1000:
            return sizes, names, "no overflow reported"


# A WebSocket server (stdlib) that sends 8 MiB messages as fast as they are taken, counting them in /tmp/sent.
FLOOD = """
import base64, hashlib, socket, struct
listener = socket.create_server(("127.0.0.1", 8125))
conn, _ = listener.accept()
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += conn.recv(4096)
key = next(l.split(b":", 1)[1].strip() for l in head.split(b"\\r\\n") if l.lower().startswith(b"sec-websocket-key"))
accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
conn.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
             b"Sec-WebSocket-Accept: " + accept + b"\\r\\n\\r\\n")
frame = b"\\x82\\x7f" + struct.pack(">Q", 8 << 20) + b"m" * (8 << 20)
sent = 0
while True:
    conn.sendall(frame)
    sent += 1
    open("/tmp/sent", "w").write(str(sent))
"""


def test_a_websocket_client_that_does_not_read_holds_a_few_messages_in_the_server(
    endpoint: LocalEndpoint, sbx: Sandbox
) -> None:
    sbx.files.write("/tmp/flood.py", FLOOD)
    sbx.commands.run("python3 /tmp/flood.py", background=True)
    sbx.commands.run("for i in $(seq 100); do ss -ltn | grep -q :8125 && exit 0; sleep 0.1; done; exit 1")
    before = rss()
    with socket.create_connection(("127.0.0.1", int(endpoint.sandbox_url.rsplit(":", 1)[1]))) as client:
        client.sendall(
            b"GET /flood HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + f"E2b-Sandbox-Id: {sbx.sandbox_id}\r\nE2b-Sandbox-Port: 8125\r\n\r\n".encode()
        )
        assert client.recv(12) == b"HTTP/1.1 101"  # and nothing more is read
        counts: list[str] = []
        wait_for(
            lambda: counts.append(sbx.commands.run("cat /tmp/sent; sleep 1").stdout) or counts[-2:-1] == counts[-1:],
            60,
            "the sandbox's server waits on its socket",
        )
        grown = rss() - before

    assert int(counts[-1]) >= 2
    assert grown <= GROWTH_MAX, f"the server grew by {grown >> 20} MiB relaying to a client that does not read"


def huge_request(endpoint: LocalEndpoint, head: bytes, size: int) -> bytes:
    """Send `head` followed by `size` bytes of filler (in a thread: the server may stop reading); what came back
    before the server closed."""
    port = int(endpoint.api_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(scaled(30))

        def send() -> None:
            with contextlib.suppress(OSError):
                conn.sendall(head)
                for _ in range(size // len(FILLER)):
                    conn.sendall(FILLER)

        with ThreadPoolExecutor(1) as pool:
            sending = pool.submit(send)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
                if answer and not answer.startswith(b"HTTP/1.1 "):
                    break
            conn.shutdown(socket.SHUT_RDWR)
            sending.result()
    return answer


FILLER = b"a" * (1 << 16)
HUGE = 50 << 20


@pytest.mark.parametrize(
    ("form", "head", "status"),
    [
        ("url", b"GET /sandboxes?x=", 414),
        ("header", b"GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-Big: ", 431),
    ],
)
def test_a_huge_url_or_header_is_refused_at_once_and_never_stalls_another_client(
    endpoint: LocalEndpoint, form: str, head: bytes, status: int
) -> None:
    other = httpx.Client(base_url=endpoint.api_url, headers={"X-API-Key": endpoint.api_key})
    ask_other = lambda: other.get("/sandboxes").raise_for_status()  # noqa: E731
    quiet = latencies(ask_other)

    taken: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        huge = pool.submit(huge_request, endpoint, head, HUGE)
        while not huge.done():
            taken += latencies(ask_other, 1)
        answer = huge.result()
    other.close()

    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b"connection: close" in answer.lower() and answer.endswith(b'bytes"}')
    assert max(taken) <= max(quiet) + scaled(0.1), (quiet, taken)


def test_a_request_without_a_valid_key_is_answered_and_its_huge_body_not_read(
    endpoint: LocalEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the header timeout out of the way (it would close the connection too, later): the close is the answer's
    monkeypatch.setattr(localbox_server, "HEADER_TIMEOUT_S", 3600.0)
    head = f"POST /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: wrong\r\nContent-Length: {HUGE}\r\n\r\n".encode()

    # 1 MiB of its 50 MiB sent: the server closes the connection (recv ends) rather than wait for the rest
    answer = huge_request(endpoint, head, 1 << 20)

    assert answer.startswith(b"HTTP/1.1 401 ") and b"Invalid API key" in answer


@pytest.mark.parametrize(
    ("replacement", "refusal"),
    [
        ("mkfifo /etc/passwd", "not a regular file"),
        ("truncate -s 3G /etc/passwd", f"larger than {DATABASE_MAX} bytes"),
    ],
)
def test_a_fifo_or_huge_file_at_etc_passwd_is_refused_by_pid_1_not_waited_on(
    sbx: Sandbox, replacement: str, refusal: str
) -> None:
    sbx.commands.run(f"mv /etc/passwd /etc/passwd.real && {replacement} && chmod 644 /etc/passwd", user="root")

    with pytest.raises(SandboxException, match=refusal):
        sbx.commands.run("true", timeout=scaled(30))
    with pytest.raises(SandboxException, match=refusal):
        sbx.files.write("/tmp/x", "x")


def test_a_snapshot_of_a_tree_deeper_than_any_path_is_refused_naming_the_limit(sbx: Sandbox) -> None:
    deep = "import os\nos.chdir('/tmp')\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
    sbx.files.write("/tmp/deep.py", deep)  # 6,000 bytes of path below /tmp
    sbx.commands.run("python3 /tmp/deep.py")

    with pytest.raises(SandboxException, match=r"^400: a snapshot copies paths of up to 4095 bytes \(PATH_MAX\)"):
        sbx.create_snapshot()
    assert sbx.commands.run("echo still here").stdout == "still here\n"  # thawed, answering


def test_a_watch_stream_whose_client_does_not_read_holds_a_bounded_backlog(
    endpoint: LocalEndpoint, sbx: Sandbox
) -> None:
    sbx.commands.run("mkdir -p /tmp/w")
    body = b'{"path": "/tmp/w"}'
    port = int(endpoint.sandbox_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as stream:
        stream.sendall(
            b"POST /filesystem.Filesystem/WatchDir HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n"
            + f"E2b-Sandbox-Id: {sbx.sandbox_id}\r\nX-Access-Token: {sbx._envd_access_token}\r\n".encode()
            + f"Content-Length: {5 + len(body)}\r\n\r\n".encode()
            + b"\0"
            + len(body).to_bytes(4, "big")
            + body
        )
        assert stream.recv(12) == b"HTTP/1.1 200"  # and nothing more is read
        before = rss()
        # 1.2 million events: held by the server, they would be 160 MiB
        sbx.commands.run(f"for i in $(seq {10 * TOUCHES}); do echo $i > /tmp/w/f$((i % 2)); done", timeout=0)
        grown = rss() - before

    assert grown <= GROWTH_MAX, f"the server grew by {grown >> 20} MiB holding a stream's events"
