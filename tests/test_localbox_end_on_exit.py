"""The `end_on_exit` quirk (b3os-beta): a command ends soon after its process exits, and what its leftovers
print after that end is lost. "Soon" is when the sandbox has gone quiet, not a fixed time, so what gets
through does not depend on how loaded the host is: a leftover still running gets its output delivered, one
that waits first does not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

from bench.localbox.quirks import build
from bench.localbox.server import LocalServer, in_thread

# Half a second to a second of shell arithmetic on this host (longer than the fixed 0.25 s the quirk once
# waited), many times that when it is loaded: either way the leftover never waits, so its output comes through.
BUSY = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo done $i"


@pytest.fixture(scope="module")
def sbx() -> Iterator[Sandbox]:
    server = LocalServer(quirks=build("e2b", ["end_on_exit", "session_leader"]), pool_size=0)
    with in_thread(server) as local:
        sandbox = Sandbox.create(
            timeout=300, api_key=local.api_key, api_url=local.api_url, sandbox_url=local.sandbox_url
        )
        try:
            yield sandbox
        finally:
            sandbox.kill()


def test_a_leftover_that_keeps_running_is_waited_for(sbx: Sandbox) -> None:
    # `setsid` in a session leader forks and returns at once: the command's process exits before its child.
    done = sbx.commands.run(f"setsid sh -c '{BUSY}'", timeout=120)

    assert (done.exit_code, done.stdout) == (0, "done 300000\n")


def test_what_a_leftover_prints_after_waiting_is_lost(sbx: Sandbox) -> None:
    done = sbx.commands.run("setsid sh -c 'sleep 1; echo ran > /tmp/leftover; echo late'", timeout=120)

    assert (done.exit_code, done.stdout) == (0, "")
    # The leftover was not stopped by the end: it went on after its output stopped being read.
    wait = "for i in $(seq 600); do [ -s /tmp/leftover ] && break; sleep 0.1; done; cat /tmp/leftover"
    assert sbx.commands.run(wait, timeout=120).stdout == "ran\n"


def test_a_leftover_that_sleeps_long_does_not_hold_the_command(sbx: Sandbox) -> None:
    # Ending at the leftover's exit would take 600 s; the SDK's own timeout would then fail this run.
    done = sbx.commands.run("setsid sleep 600", timeout=20)

    assert (done.exit_code, done.stdout) == (0, "")
    assert sbx.commands.run("pgrep -x sleep | wc -l").stdout == "1\n"
