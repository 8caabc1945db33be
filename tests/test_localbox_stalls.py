"""No sandbox can stall the server (#25 item 3): downloads of anything but a regular file are refused as envd
refuses them, a regular file is sent as big as it was when opened, other clients are answered while a
download streams, uploads whose clients hold their bodies open stop no other upload, and SIGTERM stops
`e2b-bench serve` whatever a download is doing."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time

import httpx
import pytest
from e2b import InvalidArgumentException, Sandbox
from test_localbox_serve import start_serve

from bench.localbox.files import BODY_THREADS
from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import scaled

BIG_MIB = 64
MAKE_SPECIALS = (
    "ln -s /dev/zero ~/zero-link; mkfifo ~/fifo; ln -s ~/fifo ~/fifo-link; "
    "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"/home/user/sock\")'"
)


def envd_headers(sandbox: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}


@pytest.mark.parametrize(
    "path", ["/dev/zero", "/dev/urandom", "/dev/null", "~/zero-link", "~/fifo", "~/fifo-link", "~/sock"]
)
def test_a_download_of_anything_but_a_regular_file_is_refused_as_envd_refuses_it(
    sandbox: Sandbox, endpoint: LocalEndpoint, path: str
) -> None:
    sandbox.commands.run(MAKE_SPECIALS)
    full = path.replace("~", "/home/user")

    with pytest.raises(InvalidArgumentException) as refused:
        sandbox.files.read(full)
    raw = httpx.get(f"{endpoint.sandbox_url}/files", params={"path": full}, headers=envd_headers(sandbox))

    assert f"path '{full}' is not a regular file" in str(refused.value)
    assert (raw.status_code, raw.json()) == (400, {"code": 400, "message": f"path '{full}' is not a regular file"})
    assert sandbox.commands.run(f"test -e {full} -o -L {full} && echo kept").stdout == "kept\n"


def test_a_file_a_sandbox_keeps_appending_to_is_sent_as_big_as_it_was_when_opened(sandbox: Sandbox) -> None:
    sandbox.commands.run(
        "nohup sh -c 'while :; do head -c 65536 /dev/zero >> ~/grow; sleep 0.01; done' >/dev/null 2>&1 &"
        " echo $! > ~/appender; while [ $(stat -c %s ~/grow 2>/dev/null || echo 0) -lt 1048576 ]; do sleep 0.05; done"
    )
    before = int(sandbox.commands.run("stat -c %s ~/grow").stdout)

    content = sandbox.files.read("/home/user/grow", format="bytes")
    after = int(sandbox.commands.run("stat -c %s ~/grow").stdout)
    appending = sandbox.commands.run("kill -0 $(cat ~/appender) && echo appending").stdout

    assert before <= len(content) <= after
    assert content == bytes(len(content))
    assert appending == "appending\n"  # the download ended on its own while the file still grew


def test_other_clients_are_answered_while_a_download_streams(sandbox: Sandbox, endpoint: LocalEndpoint) -> None:
    sandbox.commands.run(f"head -c {BIG_MIB}M /dev/urandom > ~/big")
    with (
        httpx.Client(timeout=60) as downloader,
        downloader.stream(
            "GET", f"{endpoint.sandbox_url}/files", params={"path": "/home/user/big"}, headers=envd_headers(sandbox)
        ) as download,
    ):
        chunks = download.iter_raw(1 << 16)
        first = next(chunks)  # then the download waits on this client, which reads no further for now
        ping = httpx.get(f"{endpoint.api_url}/v2/sandboxes", headers={"X-API-Key": endpoint.api_key}, timeout=60)
        rest = sum(len(chunk) for chunk in chunks)

    assert ping.status_code == 200 and sandbox.sandbox_id in {s["sandboxID"] for s in ping.json()}
    assert len(first) + rest == BIG_MIB << 20  # the first download was still under way when the ping was answered


def test_uploads_whose_clients_hold_every_body_thread_stop_no_other_upload(
    sandbox: Sandbox, endpoint: LocalEndpoint
) -> None:
    host, port = endpoint.sandbox_url.removeprefix("http://").split(":")
    head = (
        f"POST /files?path=/home/user/held/{{}}.bin&username=user HTTP/1.1\r\nHost: {host}\r\n"
        f"E2b-Sandbox-Id: {sandbox.sandbox_id}\r\nX-Access-Token: {sandbox._envd_access_token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {1 << 20}\r\n\r\n"
    )
    sandbox.commands.run("mkdir ~/held")
    held = [socket.create_connection((host, int(port))) for _ in range(BODY_THREADS)]
    try:
        for index, connection in enumerate(held):  # each body begun, and the rest never: a thread waits on each
            connection.sendall(head.format(index).encode() + b"x" * 1000)
        deadline = time.monotonic() + scaled(60)
        while sandbox.commands.run("ls ~/held | wc -l").stdout.strip() != str(BODY_THREADS):
            assert time.monotonic() < deadline, "the held uploads' files were never opened"
            time.sleep(0.05)
        data = os.urandom(3 << 20)

        sandbox.files.write("/home/user/free.bin", data, request_timeout=scaled(60))

        assert sandbox.commands.run("sha256sum < ~/free.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()
    finally:
        for connection in held:
            connection.close()


def test_sigterm_stops_serve_while_a_client_holds_a_download_and_another_asks_for_dev_zero() -> None:
    process, exports = start_serve()
    held: list[int] = []
    refused: list[int] = []
    try:
        sandbox = Sandbox.create(
            timeout=120,
            api_key=exports["E2B_API_KEY"],
            api_url=exports["E2B_API_URL"],
            sandbox_url=exports["E2B_SANDBOX_URL"],
        )
        sandbox.commands.run(f"head -c {BIG_MIB}M /dev/zero > ~/big; ln -s /dev/zero ~/zero")
        url, headers = f"{exports['E2B_SANDBOX_URL']}/files", envd_headers(sandbox)
        streaming = threading.Event()

        def hold() -> None:
            with (
                httpx.Client(timeout=120) as client,
                client.stream("GET", url, params={"path": "/home/user/big"}, headers=headers) as download,
            ):
                held.append(len(next(download.iter_raw(1 << 16))))
                streaming.set()
                threading.Event().wait(600)  # never reads on: the server's send waits on this client until it goes

        threading.Thread(target=hold, daemon=True).start()
        assert streaming.wait(120)
        refused.append(httpx.get(url, params={"path": "/home/user/zero"}, headers=headers, timeout=60).status_code)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)  # a server stalled by a download never stops (it used to, on /dev/zero)

    assert held and refused == [400]
    assert process.returncode == 0


def test_a_signed_url_to_a_device_is_refused_the_same_way(sandbox: Sandbox) -> None:
    sandbox.commands.run("ln -s /dev/zero ~/zero-link")

    answer = httpx.get(sandbox.download_url("/home/user/zero-link", use_signature_expiration=60), timeout=60)

    assert (answer.status_code, answer.json()["message"]) == (400, "path '/home/user/zero-link' is not a regular file")
