"""The `code-interpreter-v1` template's start command: the code interpreter server on port 49999.

As E2B's template start command, it runs at every boot of such a sandbox (create, a create from its
snapshot, a cold-boot resume), and the boot is ready once the server listens. The server's source
(codeinterp_server.py) goes in on the process's stdin: nothing is added to the sandbox's files.

A sandbox prepared ahead of its create (warm.py) is started `warm`: without the sandbox's env vars, which no
create has given yet, and ready only once the default kernel is, so its first cell waits for nothing (or, taken by
a create while still being prepared, once the server listens, as a create that starts it). Its stdin stays open;
the create hands the env vars over (`hand_over`), as E2B's server reads them from envd once a sandbox resumed
from the template's snapshot.
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
READY_TIMEOUT_S = 90.0  # on a quiet host, with room; scaled by the host's slowness
KERNEL_START_S = 150.0  # how long the server waits for a kernel on a quiet host; scaled, passed on its command line
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


class Output:
    """The server's output lines while the endpoint listens to them (it prints `ready`, `kernel`, `envs`)."""

    def __init__(self, record: ProcessRecord) -> None:
        self.record = record
        self.queue = record.subscribe()
        self.lines: set[bytes] = set()
        self._partial = b""
        self._errors = b""

    async def wait_for(self, line: bytes) -> None:
        """Until the server printed `line` as a line of its own; AgentError if it exits first."""
        while line not in self.lines:
            event = await self.queue.get()
            if event[0] != "data":
                raise AgentError(f"the code interpreter exited: {self._errors.decode(errors='replace')[-2000:]}")
            if event[1] == "stderr":
                self._errors = (self._errors + event[2])[-4000:]
                continue
            *complete, self._partial = (self._partial + event[2]).split(b"\n")
            self.lines.update(complete)

    def close(self) -> None:
        self.record.unsubscribe(self.queue)


async def start_server(box: Box, env_vars: dict[str, str]) -> None:
    """Start the server as the sandbox's `user` with the sandbox's env vars and return once it listens;
    AgentError if it does not."""
    (await _start(box, env_vars, close_input=True)).close()


async def start_warm(box: Box, taken: asyncio.Event) -> Started:
    """Start the server without env vars and return once its default kernel is ready too, or once it listens if
    `taken` is set (a create waits for it); `hand_over` gives it the sandbox's env vars. AgentError if it does not
    start."""
    output = await _start(box, {}, close_input=False)
    kernel = asyncio.ensure_future(output.wait_for(b"kernel"))
    create = asyncio.ensure_future(taken.wait())
    bound = scaled(KERNEL_START_S)
    try:
        await asyncio.wait([kernel, create], timeout=bound, return_when=asyncio.FIRST_COMPLETED)
        if kernel.done():
            kernel.result()  # the server exited: AgentError
        elif not create.done():
            raise AgentError(f"the code interpreter's kernel was not ready within {bound:.0f}s")
    finally:
        output.close()
        for task in (kernel, create):
            task.cancel()
    return Started(box, output.record)


async def hand_over(started: Started, env_vars: dict[str, str]) -> None:
    """Give a warm server the env vars of the create that took its sandbox; return once it has them (its kernels
    get them before their next cell)."""
    box, record = started.box, started.record
    output = Output(record)
    bound = scaled(HAND_OVER_S)
    try:
        if env_vars:
            line = json.dumps({"envs": env_vars}).encode() + b"\n"
            await box.write_input(record, line, pty=False)
            await asyncio.wait_for(output.wait_for(b"envs"), bound)
        await box.close_input(record)
    except TimeoutError as exc:
        raise AgentError(f"the code interpreter did not take the sandbox's env vars within {bound:.0f}s") from exc
    finally:
        output.close()


async def _start(box: Box, env_vars: dict[str, str], close_input: bool) -> Output:
    """Spawn the server and return once it listens, its output still listened to."""
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
    output = Output(record)
    ready_s = scaled(READY_TIMEOUT_S)
    try:
        source = SERVER_SOURCE.read_bytes()
        await box.write_input(record, b"%d\n" % len(source) + source, pty=False)
        if close_input:
            await box.close_input(record)
        await asyncio.wait_for(output.wait_for(b"ready"), ready_s)
    except BaseException as exc:
        output.close()
        if isinstance(exc, TimeoutError):
            with contextlib.suppress(AgentError):
                await box.signal(record.pid, 9)
            raise AgentError(f"the code interpreter did not start listening within {ready_s:.0f}s") from exc
        raise
    return output


START_COMMANDS = {TEMPLATE_ID: start_server}  # template id -> what every boot of its sandboxes starts
WARM_STARTS = {TEMPLATE_ID: start_warm}  # template id -> its start command for a sandbox prepared ahead
