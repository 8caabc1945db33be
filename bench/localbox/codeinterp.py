"""The `code-interpreter-v1` template's start command: the code interpreter server on port 49999.

As E2B's template start command, it runs at every boot of such a sandbox (create, a create from its
snapshot, a cold-boot resume), and the boot is ready once the server listens. The server's source
(codeinterp_server.py) goes in on the process's stdin: nothing is added to the sandbox's files.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from ..remote.slowness import scaled
from .agentlink import AgentError
from .box import Box

TEMPLATE_ID = "code-interpreter-v1"
PORT = 49999
SERVER_SOURCE = Path(__file__).with_name("codeinterp_server.py")
READY_TIMEOUT_S = 30.0  # on a quiet host; scaled by the host's slowness
KERNEL_START_S = 60.0  # how long the server waits for a kernel on a quiet host; scaled, passed on its command line
LOADER = "import sys; exec(compile(sys.stdin.read(), 'e2b-bench-code-interpreter', 'exec'))"
START_TAG = "start_cmd"
KERNEL_START_FLAG = "--kernel-start-s="  # the server's one argument (it cannot measure the host itself)


async def start_server(box: Box, env_vars: dict[str, str]) -> None:
    """Start the server as the sandbox's `user` and return once it listens; AgentError if it does not."""
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
    ready_s = scaled(READY_TIMEOUT_S)
    try:
        await box.write_input(record, SERVER_SOURCE.read_bytes(), pty=False)
        await box.close_input(record)
        await asyncio.wait_for(_ready(events), ready_s)
    except TimeoutError as exc:
        with contextlib.suppress(AgentError):
            await box.signal(record.pid, 9)
        raise AgentError(f"the code interpreter did not start listening within {ready_s:.0f}s") from exc
    finally:
        record.unsubscribe(events)


async def _ready(events: asyncio.Queue) -> None:
    output = b""
    errors = b""
    while True:
        event = await events.get()
        if event[0] != "data":
            raise AgentError(f"the code interpreter exited at start: {errors.decode(errors='replace')[-2000:]}")
        if event[1] == "stderr":
            errors = (errors + event[2])[-4000:]
            continue
        output += event[2]
        if b"ready\n" in output:
            return


START_COMMANDS = {TEMPLATE_ID: start_server}  # template id -> what every boot of its sandboxes starts
