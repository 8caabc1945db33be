"""Traffic that reaches a sandbox as E2B's proxy treats it (#28 items 2-4): a paused sandbox created with
autoResume is woken by an envd or port request, which waits and succeeds; without it the request gets E2B's
409 paused answer; `maskRequestHost` is the Host the sandbox's server sees; a watch reports envd's events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxException
from websockets.sync.client import connect as ws_connect

from bench.localbox.server import LocalEndpoint

HOST_ECHO = (Path(__file__).parent / "fixtures" / "host_echo.py").read_text()
PORT_SERVER = (Path(__file__).parent / "fixtures" / "port_server.py").read_text()
PORT = 8124


def serve_host_echo(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/host_echo.py", HOST_ECHO)
    sbx.commands.run(f"python3 /tmp/host_echo.py {PORT} >/dev/null 2>&1 &")
    sbx.commands.run(f"for i in $(seq 100); do curl -s -o /dev/null localhost:{PORT} && exit 0; sleep 0.1; done")


def routed(sbx: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(PORT)}


def detail(endpoint: LocalEndpoint, sbx: Sandbox) -> dict:
    return httpx.get(f"{endpoint.api_url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": endpoint.api_key}).json()


def end_at(endpoint: LocalEndpoint, sbx: Sandbox) -> float:
    return datetime.fromisoformat(detail(endpoint, sbx)["endAt"].replace("Z", "+00:00")).timestamp()


@pytest.fixture
def sleeper(endpoint: LocalEndpoint) -> Iterator[Sandbox]:
    """A sandbox with autoResume, serving HOST_ECHO, paused."""
    sbx = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        serve_host_echo(sbx)
        assert sbx.pause() is True
        yield sbx
    finally:
        sbx.kill()


def test_an_envd_request_wakes_a_paused_sandbox_with_auto_resume_and_restarts_its_timeout(
    sleeper: Sandbox, endpoint: LocalEndpoint
) -> None:
    before = end_at(endpoint, sleeper)
    time.sleep(1.1)  # endAt has millisecond precision: a restarted timeout must end measurably later

    result = sleeper.commands.run("echo awake")

    assert result.stdout == "awake\n"
    assert detail(endpoint, sleeper)["state"] == "running"
    assert end_at(endpoint, sleeper) > before + 1
    assert sleeper.is_running()


def test_a_port_request_wakes_it_and_reaches_the_server_that_ran_before_the_pause(
    sleeper: Sandbox, endpoint: LocalEndpoint
) -> None:
    answer = httpx.get(endpoint.sandbox_url, headers=routed(sleeper), timeout=60)

    assert answer.status_code == 200
    assert detail(endpoint, sleeper)["state"] == "running"


def test_requests_arriving_together_share_one_wake(sleeper: Sandbox, endpoint: LocalEndpoint) -> None:
    async def together() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await asyncio.gather(
                *(client.get(endpoint.sandbox_url, headers=routed(sleeper)) for _ in range(4))
            )
        return [a.status_code for a in answers]

    statuses = asyncio.run(together())

    assert statuses == [200] * 4
    assert sleeper.commands.run("pgrep -fc host_echo.py").stdout.strip() == "1"  # the same server, thawed once


def test_without_auto_resume_traffic_gets_e2bs_paused_answer_and_the_sandbox_stays_paused(
    endpoint: LocalEndpoint,
) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        serve_host_echo(sbx)
        sbx.pause()
        port = httpx.get(endpoint.sandbox_url, headers=routed(sbx), timeout=60)
        with pytest.raises(SandboxException) as envd_error:
            sbx.commands.run("echo awake")
        running = sbx.is_running()
        state = detail(endpoint, sbx)["state"]
    finally:
        sbx.kill()

    assert (port.status_code, port.json()) == (
        409,
        {"sandboxId": sbx.sandbox_id, "message": "The sandbox is paused", "code": 409, "canAutoResume": False},
    )
    assert "paused" in str(envd_error.value).lower()
    assert running is False  # /health answers 502, as E2B's own tests expect of a paused sandbox
    assert state == "paused"


def test_mask_request_host_is_the_host_the_sandboxs_server_sees(endpoint: LocalEndpoint) -> None:
    masked = Sandbox.create(timeout=60, network={"mask_request_host": "app.internal:${PORT}"})
    try:
        serve_host_echo(masked)
        seen = httpx.get(endpoint.sandbox_url, headers={**routed(masked), "Host": "caller.example"}).json()
        reported = detail(endpoint, masked).get("network")
    finally:
        masked.kill()

    assert seen == [f"app.internal:{PORT}", "caller.example"]
    assert reported == {"maskRequestHost": "app.internal:${PORT}"}


def test_a_masked_websocket_upgrade_reaches_the_server_with_the_mask_as_its_host(endpoint: LocalEndpoint) -> None:
    masked = Sandbox.create(timeout=60, network={"mask_request_host": "app.internal:${PORT}"})
    try:
        masked.files.write("/tmp/port_server.py", PORT_SERVER)
        masked.commands.run(f"python3 /tmp/port_server.py {PORT} >/dev/null 2>&1 &")
        masked.commands.run(f"for i in $(seq 100); do curl -s -o /dev/null localhost:{PORT} && exit 0; sleep 0.1; done")
        url = endpoint.sandbox_url.replace("http://", "ws://") + "/ws"
        with ws_connect(url, additional_headers=routed(masked)) as ws:
            ws.send("host?")
            seen = ws.recv(timeout=30)
    finally:
        masked.kill()

    assert seen == f"app.internal:{PORT}"


def test_without_a_mask_the_server_sees_the_callers_host(sandbox: Sandbox, endpoint: LocalEndpoint) -> None:
    serve_host_echo(sandbox)

    seen = httpx.get(endpoint.sandbox_url, headers={**routed(sandbox), "Host": "caller.example"}).json()

    assert seen == ["caller.example", None]


@pytest.mark.parametrize("mask", ["bad host", "ex\u00e4mple.com", "host:port:1", ""])
def test_a_mask_that_is_no_host_is_refused_with_e2bs_message(endpoint: LocalEndpoint, mask: str) -> None:
    body = {"templateID": "base", "network": {"maskRequestHost": mask}}

    answer = httpx.post(f"{endpoint.api_url}/v2/sandboxes", json=body, headers={"X-API-Key": endpoint.api_key})

    assert (answer.status_code, answer.json()["message"]) == (400, f"mask request host is not valid: {mask}")


def watched(sbx: Sandbox, directory: str, action: Callable[[], object]) -> list[tuple[str, str]]:
    """The events a recursive watch of `directory` reports for `action`, up to a marker made after it."""
    handle = sbx.files.watch_dir(directory, recursive=True)
    action()
    sbx.commands.run(f"mkdir {directory}/marker")
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 60
    while ("CREATE", "marker") not in seen and time.monotonic() < deadline:
        seen += [(e.type.name, e.name) for e in handle.get_new_events()]
    handle.stop()
    return seen[: seen.index(("CREATE", "marker"))]


def test_an_upload_of_a_new_file_gives_envds_three_events(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p /home/user/w")

    seen = watched(sandbox, "/home/user/w", lambda: sandbox.files.write("/home/user/w/new.txt", "data"))

    assert seen == [("CREATE", "new.txt"), ("CHMOD", "new.txt"), ("WRITE", "new.txt")]


def test_an_upload_over_a_file_gives_chmod_then_writes_only(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/w/old.txt", "old contents")

    seen = watched(sandbox, "/home/user/w", lambda: sandbox.files.write("/home/user/w/old.txt", "new"))

    assert seen[0] == ("CHMOD", "old.txt")
    assert set(seen[1:]) == {("WRITE", "old.txt")}  # the truncation's and the data's (one if the kernel merged them)
    assert sandbox.files.read("/home/user/w/old.txt") == "new"


def test_an_upload_through_a_dangling_link_creates_its_target(sandbox: Sandbox) -> None:
    sandbox.commands.run("ln -s /home/user/target.txt /home/user/link.txt")

    sandbox.files.write("/home/user/link.txt", "through")

    assert sandbox.commands.run("cat /home/user/target.txt").stdout == "through"


def test_removing_the_watched_directory_ends_with_remove_dot_and_the_stream_stays_open(
    endpoint: LocalEndpoint,
) -> None:
    async def scenario() -> tuple[list[tuple[str, str]], bool]:
        sbx = await AsyncSandbox.create(timeout=60)
        try:
            await sbx.commands.run("mkdir -p /home/user/gone/sub && touch /home/user/gone/sub/f")
            events: list[tuple[str, str]] = []
            exits: list[object] = []
            handle = await sbx.files.watch_dir(
                "/home/user/gone",
                on_event=lambda e: events.append((e.type.name, e.name)),
                on_exit=exits.append,
                recursive=True,
            )
            await sbx.files.remove("/home/user/gone")
            deadline = time.monotonic() + 60
            while ("REMOVE", ".") not in events and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # anything after REMOVE '.' would be a difference from envd
            open_after = not exits
            await handle.stop()
            return events, open_after
        finally:
            await sbx.kill()

    events, open_after = asyncio.run(scenario())

    assert events[-1] == ("REMOVE", ".")
    assert set(events) == {("REMOVE", "sub/f"), ("REMOVE", "sub"), ("REMOVE", ".")}
    assert open_after
