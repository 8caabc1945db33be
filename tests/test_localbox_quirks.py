"""Each fidelity quirk brings back exactly the old difference from E2B it is named after (#13).

The conformance cases that must flag these quirks live with the suites; here each quirk, switched on alone in
an endpoint of its own, shows the old behaviour through the unmodified SDK.
"""

from __future__ import annotations

import datetime
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxException

from bench.localbox.server import LocalEndpoint


def _raises(action: Callable[[], object]) -> str:
    try:
        action()
    except (SandboxException, CommandExitException) as exc:
        return type(exc).__name__
    return "no error"


def dir_mode(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return oct(sbx.files.get_info("/home/user").mode)


def remove_missing(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return _raises(lambda: sbx.files.remove("/home/user/missing"))


def upload_metadata(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    first = sbx.files.write("/home/user/m", "1", metadata={"a": "1"})
    sbx.files.write("/home/user/m", "2")
    return first.metadata, sbx.files.get_info("/home/user/m").metadata


def proc_read(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return sbx.files.read("/proc/sys/kernel/hostname")


def killed_stream(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    handle = sbx.commands.run("sleep 60", background=True)
    Sandbox.kill(sbx.sandbox_id)
    return _raises(handle.wait)


def killed_stream_end(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    """How a raw command stream of a sandbox killed under it ends: its last frame, or the connection cut."""
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""}
    start = json.dumps({"process": {"cmd": "/bin/sleep", "args": ["60"]}}).encode()
    with (
        httpx.Client(base_url=ep.sandbox_url, headers=headers, timeout=60) as envd,
        envd.stream(
            "POST",
            "/process.Process/Start",
            content=b"\0" + struct.pack(">I", len(start)) + start,
            headers={"Content-Type": "application/connect+json"},
        ) as answer,
    ):
        frames = answer.iter_raw()
        next(frames)
        Sandbox.kill(sbx.sandbox_id)
        try:
            last = b"".join(frames)
        except httpx.TransportError:
            return "connection lost"
    error = json.loads(last[5:])["error"]
    return error["code"], error["message"].replace(sbx.sandbox_id, "<id>")


def expired_url(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    sbx.files.write("/home/user/s", "s")
    return httpx.get(sbx.download_url("/home/user/s", use_signature_expiration=-10)).json()["message"]


def old_metrics(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    return len(sbx.get_metrics(start=now - datetime.timedelta(hours=2), end=now - datetime.timedelta(hours=1)))


def filesystem_pause(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    # Until it execs, the background child is a copy of the shell (not yet `sleep`): pause once it is sleep.
    sbx.commands.run("sleep 600 >/dev/null 2>&1 & until pgrep -x sleep >/dev/null; do :; done")
    sbx.pause(mode="filesystem")
    return Sandbox.connect(sbx.sandbox_id).commands.run("pgrep -x sleep | wc -l").stdout


def upload_under_root(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return _raises(lambda: sbx.files.write("/opt/x/y.txt", "y"))


def unknown_route(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return httpx.get(f"{ep.api_url}/volumes", headers={"X-API-KEY": ep.api_key}).status_code


# fidelity: wake on traffic, host masking, watch events
HOST_ECHO = (Path(__file__).parent / "fixtures" / "host_echo.py").read_text()


def paused_envd_request(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    sleeper = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sleeper.pause()
        return _raises(lambda: sleeper.commands.run("true")), sleeper.get_info().state.value
    finally:
        sleeper.kill()


def masked_host(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    masked = Sandbox.create(timeout=60, network={"mask_request_host": "app.internal:${PORT}"})
    try:
        masked.files.write("/tmp/host_echo.py", HOST_ECHO)
        masked.commands.run("python3 /tmp/host_echo.py 8124 >/dev/null 2>&1 &")
        masked.commands.run("for i in $(seq 100); do curl -s -o /dev/null localhost:8124 && exit 0; sleep 0.1; done")
        headers = {"E2b-Sandbox-Id": masked.sandbox_id, "E2b-Sandbox-Port": "8124", "Host": "caller.example"}
        return httpx.get(ep.sandbox_url, headers=headers).json()[0]
    finally:
        masked.kill()


def upload_events(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    handle = sbx.files.watch_dir("/home/user")
    sbx.files.write("/home/user/new.txt", "data")
    sbx.commands.run("mkdir /home/user/marker")
    seen: list[str] = []
    while "CREATE marker" not in seen:
        seen += [f"{e.type.name} {e.name}" for e in handle.get_new_events()]
    handle.stop()
    return seen[: seen.index("CREATE marker")]


# quirk -> (what shows it, what it shows with the quirk on)
OLD_BEHAVIOUR: dict[str, tuple[Callable[[Sandbox, LocalEndpoint], Any], Any]] = {
    "dir_mode_go_bit": (dir_mode, oct(0o20000000755)),
    "remove_missing_404": (remove_missing, "FileNotFoundException"),
    "upload_no_metadata": (upload_metadata, (None, {"a": "1"})),
    "proc_size_zero": (proc_read, ""),
    "kill_stream_clean_end": (killed_stream, "CommandExitException"),
    "kill_stream_unavailable": (
        killed_stream_end,
        ("unavailable", "the connection to sandbox <id> ended before the stream completed"),
    ),
    "signed_url_generic_error": (expired_url, "invalid or missing access token"),
    "metrics_ignore_window": (old_metrics, 1),
    "pause_keeps_memory": (filesystem_pause, "1\n"),
    "files_write_as_user": (upload_under_root, "SandboxException"),
    "unknown_route_404": (unknown_route, 404),
    # fidelity: wake on traffic, host masking, watch events
    "ignore_auto_resume": (paused_envd_request, ("SandboxException", "paused")),
    "ignore_mask_host": (masked_host, "caller.example"),
    "extra_write_event": (upload_events, ["CREATE new.txt", "WRITE new.txt", "CHMOD new.txt", "WRITE new.txt"]),
}


@pytest.mark.parametrize("quirked", sorted(OLD_BEHAVIOUR), indirect=True)
def test_a_fidelity_quirk_brings_back_the_old_behaviour(quirked: LocalEndpoint, request: pytest.FixtureRequest) -> None:
    show, old = OLD_BEHAVIOUR[request.node.callspec.params["quirked"]]
    sbx = Sandbox.create(timeout=60)
    try:
        seen = show(sbx, quirked)
    finally:
        sbx.kill()

    assert seen == old
