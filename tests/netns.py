"""A test host for sandboxes to reach: a listener in a network namespace of the test's own."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

TEST_NET = ("198.51.100.1", "198.51.100.2")  # TEST-NET-2: documentation addresses, routed here to our namespace
# One test host at a time on this machine: two (xdist workers, two checkouts) would both route TEST_NET.
LOCK = os.path.join(tempfile.gettempdir(), "e2b-bench-test-net.lock")
SERVE = textwrap.dedent("""
    import socket, sys
    print("in its namespace", flush=True)
    sys.stdin.readline()  # the namespace's interface is configured
    s = socket.create_server((sys.argv[1], 0))
    print(s.getsockname()[1], flush=True)
    while True:
        s.accept()[0].close()
""")


@contextmanager
def listener_in_own_netns() -> Iterator[str]:
    """host:port of a listener in a network namespace of this test's own, joined to the host by a veth pair
    (the namespace, and both ends of the pair, go when the listener ends)."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield from _listener()


def _listener() -> Iterator[str]:
    name = f"e2bb{os.getpid()}"
    listener = subprocess.Popen(
        ["unshare", "--net", "--", sys.executable, "-c", SERVE, TEST_NET[1]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    inside = ["nsenter", "-t", str(listener.pid), "-n", "ip"]
    steps = [
        ["ip", "link", "add", f"{name}h", "type", "veth", "peer", "name", f"{name}n", "netns", str(listener.pid)],
        ["ip", "addr", "add", f"{TEST_NET[0]}/30", "dev", f"{name}h"],
        ["ip", "link", "set", f"{name}h", "up"],
        [*inside, "addr", "add", f"{TEST_NET[1]}/30", "dev", f"{name}n"],
        [*inside, "link", "set", f"{name}n", "up"],
    ]
    try:
        assert listener.stdin is not None and listener.stdout is not None
        assert listener.stdout.readline() == "in its namespace\n"  # unshare has run: the pid's netns is new
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        listener.stdin.write("configured\n")
        listener.stdin.flush()
        yield f"{TEST_NET[1]}:{listener.stdout.readline().strip()}"
    finally:
        listener.kill()
        listener.wait()
        subprocess.run(["ip", "link", "del", f"{name}h"], check=False, capture_output=True)
