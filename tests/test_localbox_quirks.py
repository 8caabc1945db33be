"""Each fidelity quirk brings back exactly the old difference from E2B it is named after (#13).

The conformance cases that must flag these quirks live with the suites; here each quirk, switched on alone in
an endpoint of its own, shows the old behaviour through the unmodified SDK.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxException

from bench.localbox.quirks import build
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread


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


def expired_url(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    sbx.files.write("/home/user/s", "s")
    return httpx.get(sbx.download_url("/home/user/s", use_signature_expiration=-10)).json()["message"]


def old_metrics(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    return len(sbx.get_metrics(start=now - datetime.timedelta(hours=2), end=now - datetime.timedelta(hours=1)))


def filesystem_pause(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    sbx.commands.run("sleep 600 >/dev/null 2>&1 &")
    sbx.pause(mode="filesystem")
    return Sandbox.connect(sbx.sandbox_id).commands.run("pgrep -x sleep | wc -l").stdout


def upload_under_root(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return _raises(lambda: sbx.files.write("/opt/x/y.txt", "y"))


def unknown_route(sbx: Sandbox, ep: LocalEndpoint) -> Any:
    return httpx.get(f"{ep.api_url}/volumes", headers={"X-API-KEY": ep.api_key}).status_code


# quirk -> (what shows it, what it shows with the quirk on)
OLD_BEHAVIOUR: dict[str, tuple[Callable[[Sandbox, LocalEndpoint], Any], Any]] = {
    "dir_mode_go_bit": (dir_mode, oct(0o20000000755)),
    "remove_missing_404": (remove_missing, "FileNotFoundException"),
    "upload_no_metadata": (upload_metadata, (None, {"a": "1"})),
    "proc_size_zero": (proc_read, ""),
    "kill_stream_clean_end": (killed_stream, "CommandExitException"),
    "signed_url_generic_error": (expired_url, "invalid or missing access token"),
    "metrics_ignore_window": (old_metrics, 1),
    "pause_keeps_memory": (filesystem_pause, "1\n"),
    "files_write_as_user": (upload_under_root, "SandboxException"),
    "unknown_route_404": (unknown_route, 404),
}


@pytest.fixture
def quirked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalEndpoint]:
    server = LocalServer(quirks=build("e2b", [request.param]), pool_size=0)
    with in_thread(server) as local:
        for key, value in local.env().items():
            monkeypatch.setenv(key, value)
        yield local


@pytest.mark.parametrize("quirked", sorted(OLD_BEHAVIOUR), indirect=True)
def test_a_fidelity_quirk_brings_back_the_old_behaviour(quirked: LocalEndpoint, request: pytest.FixtureRequest) -> None:
    show, old = OLD_BEHAVIOUR[request.node.callspec.params["quirked"]]
    sbx = Sandbox.create(timeout=60)
    try:
        seen = show(sbx, quirked)
    finally:
        sbx.kill()

    assert seen == old
