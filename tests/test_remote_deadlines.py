"""Deadlines that wait on the host follow its measured slowness, the code interpreter's in-sandbox ones too."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b_code_interpreter import Sandbox

from bench.localbox.codeinterp import KERNEL_START_S
from bench.localbox.server import LocalEndpoint
from bench.localbox.template import ensure_template
from bench.remote import slowness

# Every process's command line in the sandbox, one per line (a second path to what the server was started with).
COMMAND_LINES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


@pytest.fixture
def host_four_times_slower(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(slowness.SLOWNESS_ENV, "4")
    slowness.slowness.cache_clear()
    yield
    slowness.slowness.cache_clear()  # the next reader measures again, with the variable restored


@pytest.mark.usefixtures("host_four_times_slower")
def test_the_code_interpreters_kernel_start_deadline_is_scaled_by_the_hosts_slowness(
    endpoint: LocalEndpoint,
) -> None:
    ensure_template(name="code-interpreter-v1")
    # None kept warm (started earlier, at another slowness): this create starts its own server, now.
    none_warm = {"warm": {"code-interpreter-v1": 0}, "within_s": 600}
    emptied = httpx.post(f"{endpoint.api_url}/e2b-bench/pool", json=none_warm, headers={"X-API-KEY": endpoint.api_key},
                         timeout=None)  # fmt: skip
    assert emptied.status_code == 200 and emptied.json()["settled"], emptied.text
    sbx = Sandbox.create(timeout=120)
    try:
        lines = sbx.commands.run(COMMAND_LINES).stdout.splitlines()
        assert sbx.run_code("1 + 1").text == "2"  # the server that was given the deadline answers
    finally:
        sbx.kill()

    (server,) = [line for line in lines if "e2b-bench-code-interpreter" in line]
    assert server.split()[-1] == f"--kernel-start-s={4 * KERNEL_START_S:g}"  # a quiet host's, times 4
