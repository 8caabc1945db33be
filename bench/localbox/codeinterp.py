"""The `code-interpreter-v1` template's start command: the code interpreter server on port 49999.

As E2B's template start command, it runs at every boot of such a sandbox (create, a create from its
snapshot, a cold-boot resume), and the boot is ready once the server listens. The server's source
(codeinterp_server.py) goes in on the process's stdin: nothing is added to the sandbox's files.

A sandbox prepared ahead of its create (warm.py) is started `warm`: without the sandbox's env vars, which no
create has given yet, and ready only once the default kernel is, so its first cell waits for nothing. Its stdin
stays open; the create hands the env vars over (`hand_over`), as E2B's server reads them from envd once a
sandbox resumed from the template's snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..remote.slowness import scaled
from .agentlink import AgentError
from .box import Box, ProcessRecord

TEMPLATE_ID = "code-interpreter-v1"
PORT = 49999
SERVER_SOURCE = Path(__file__).with_name("codeinterp_server.py")
READY_TIMEOUT_S = 30.0  # on a quiet host; scaled by the host's slowness
KERNEL_START_S = 60.0  # how long the server waits for a kernel on a quiet host; scaled, passed on its command line
HAND_OVER_S = 10.0  # a warm server sets the sandbox's env vars within this on a quiet host; scaled
# The source's length, a newline, the source: stdin stays open after it for the endpoint's commands.
LOADER = (
    "import sys; _n = int(sys.stdin.buffer.readline()); "
    "exec(compile(sys.stdin.buffer.read(_n), 'e2b-bench-code-interpreter', 'exec'))"
)
START_TAG = "start_cmd"
KERNEL_START_FLAG = "--kernel-start-s="  # the server's one argument (it cannot measure the host itself)


@dataclass
class Started:
    """A server started warm: its process, whose stdin takes the create's env vars."""

    box: Box
    record: ProcessRecord


async def start_server(box: Box, env_vars: dict[str, str]) -> None:
    """Start the server as the sandbox's `user` with the sandbox's env vars and return once it listens;
    AgentError if it does not."""
    record = await _start(box, env_vars, until=(b"ready",), close_input=True)
    del record


async def start_warm(box: Box) -> Started:
    """Start the server without env vars and return once its default kernel is ready too (`hand_over` gives it
    the sandbox's env vars when a create takes the sandbox); AgentError if it does not."""
    return Started(box, await _start(box, {}, until=(b"ready", b"kernel"), close_input=False))


async def hand_over(started: Started, env_vars: dict[str, str]) -> None:
    """Give a warm server the env vars of the create that took its sandbox; return once they are set."""
    box, record = started.box, started.record
    events = record.subscribe()
    bound = scaled(HAND_OVER_S)
    try:
        if env_vars:
            line = json.dumps({"envs": env_vars}).encode() + b"\n"
            await box.write_input(record, line, pty=False)
            await asyncio.wait_for(_lines(events, (b"envs",)), bound)
        await box.close_input(record)
    except TimeoutError as exc:
        raise AgentError(f"the code interpreter did not take the sandbox's env vars within {bound:.0f}s") from exc
    finally:
        record.unsubscribe(events)


async def _start(box: Box, env_vars: dict[str, str], until: tuple[bytes, ...], close_input: bool) -> ProcessRecord:
    record = await box.spawn(
        cmd="/usr/bin/python3",
        args=["-I", "-c", LOADER, f"{KERNEL_START_FLAG}{scaled(KERNEL_START_S):g}"],
        envs=env_vars,
        cwd="/home/user",
        user="user",
        tag=START_TAG,
        stdin=True,
        pty=None,
    )
    events = record.subscribe()
    ready_s = scaled(READY_TIMEOUT_S) + (scaled(KERNEL_START_S) if b"kernel" in until else 0.0)
    try:
        source = SERVER_SOURCE.read_bytes()
        await box.write_input(record, b"%d\n" % len(source) + source, pty=False)
        if close_input:
            await box.close_input(record)
        await asyncio.wait_for(_lines(events, until), ready_s)
    except TimeoutError as exc:
        with contextlib.suppress(AgentError):
            await box.signal(record.pid, 9)
        raise AgentError(f"the code interpreter did not start listening within {ready_s:.0f}s") from exc
    finally:
        record.unsubscribe(events)
    return record


async def _lines(events: asyncio.Queue, wanted: tuple[bytes, ...]) -> None:
    """Wait until the server printed each of `wanted` as a line of its own (in any order)."""
    output = b""
    errors = b""
    while True:
        event = await events.get()
        if event[0] != "data":
            raise AgentError(f"the code interpreter exited: {errors.decode(errors='replace')[-2000:]}")
        if event[1] == "stderr":
            errors = (errors + event[2])[-4000:]
            continue
        output += event[2]
        lines = output.split(b"\n")[:-1]
        if all(w in lines for w in wanted):
            return


START_COMMANDS = {TEMPLATE_ID: start_server}  # template id -> what every boot of its sandboxes starts
WARM_STARTS = {TEMPLATE_ID: start_warm}  # template id -> its start command for a sandbox prepared ahead
