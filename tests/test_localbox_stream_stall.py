"""`stream_stall[=N]`: the N-th command stream of the server's life (bare: every one) gives its output and
then never its end; the connection stays open until the client leaves. Others are untouched."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import Sandbox, TimeoutException

from bench.localbox.quirks import QuirkError, build
from bench.localbox.server import LocalEndpoint, LocalServer, in_thread

CLIENT_WAIT_S = 5  # how long the client waits for the end it never gets


@pytest.fixture
def stalling_second(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalEndpoint]:
    with in_thread(LocalServer(quirks=build("e2b", ["stream_stall=2"]), pool_size=0)) as local:
        for key, value in local.env().items():
            monkeypatch.setenv(key, value)
        yield local


def test_the_second_command_stream_gives_its_output_and_never_ends_and_the_third_ends(
    stalling_second: LocalEndpoint,
) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        first = sbx.commands.run("echo one")
        seen: list[str] = []
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            sbx.commands.run("echo two", on_stdout=seen.append, timeout=CLIENT_WAIT_S)
        waited = time.monotonic() - started
        third = sbx.commands.run("echo three")
    finally:
        sbx.kill()

    assert (first.stdout, seen, third.stdout) == ("one\n", ["two\n"], "three\n")
    assert waited >= CLIENT_WAIT_S  # held open until the client gave up, not closed by the server


def test_stream_stall_takes_a_count_or_none_for_every_stream() -> None:
    assert [build("e2b", [item]).stream_stall for item in ("stream_stall", "stream_stall=3")] == [0, 3]
    with pytest.raises(QuirkError, match="quirk stream_stall takes a whole number"):
        build("e2b", ["stream_stall=soon"])
