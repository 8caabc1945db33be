"""The `load` subcommand's options, apart from the load run itself (bench/load.py): every CLI start builds the
whole parser, and importing the run would load the embedded endpoint's sandbox code and the soak's census."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOCAL_USERS, LOCAL_DURATION_S = 5, 30.0
# --soak: 200 agents for ten minutes, each session started at a fixed pace (all users together) rather than
# back to back, so that what grows is what leaks, not the backlog.
SOAK_USERS, SOAK_DURATION_S, SOAK_RATE = 200, 600.0, 2.0
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def add_load_parser(commands: Any, handler: Callable[[argparse.Namespace, list[str]], int]) -> None:
    """The `load` subcommand of the CLI, run by `handler` (the CLI's, which imports the load run when called)."""
    load = commands.add_parser(
        "load",
        help="simulated agents on Locust against an endpoint: load.json (latency, RPS, failures, leaks) and a report",
        description="Locust users that act like agents through the unmodified Python SDK: create, commands with "
        "streamed output, files verified by hash, sometimes pause/connect, kill. Off the embedded endpoint "
        "--users and --duration are required.",
    )
    load.add_argument("--endpoint", default=os.environ.get("E2B_BENCH_ENDPOINT", "local"))
    load.add_argument("--users", type=int, default=None, help=f"concurrent agents (default {LOCAL_USERS} locally)")
    load.add_argument("--spawn-rate", type=float, default=None, help="users started per second (default: all in 1 s)")
    load.add_argument("--duration", type=float, default=None, help=f"seconds (default {LOCAL_DURATION_S:g} locally)")
    load.add_argument(
        "--soak",
        action="store_true",
        help=f"sessions at a fixed rate (default {SOAK_USERS} users, {SOAK_DURATION_S:g} s, {SOAK_RATE:g} sessions/s); "
        "the sandbox count must return to its start",
    )
    load.add_argument("--rate", type=float, default=None, help="soak: agent sessions per second (all users)")
    load.add_argument("--idle-seconds", type=float, default=5.0, help="idle phase before the load (0: none)")
    load.add_argument("--pause-share", type=float, default=0.2, help="share of sessions that pause and connect")
    load.add_argument("--file-kib", type=int, default=64, help="size of each session's verified file")
    load.add_argument("--stop-timeout", type=float, default=60.0, help="seconds users get to finish their session")
    load.add_argument("--master", action="store_true", help="Locust master: the users run on workers")
    load.add_argument("--worker", action="store_true", help="Locust worker of a master (--master-host/--master-port)")
    load.add_argument("--expect-workers", type=int, default=0, help="master: workers to wait for")
    load.add_argument("--local-workers", type=int, default=0, help="master: start this many workers on loopback")
    load.add_argument("--master-host", default="127.0.0.1")
    load.add_argument("--master-port", type=int, default=5557)
    load.add_argument("--master-bind-host", default="127.0.0.1")
    load.add_argument("--master-bind-port", type=int, default=0, help="0 picks a free port")
    load.add_argument("--profile", default="e2b", help="quirk profile of the embedded endpoint")
    load.add_argument("--quirk", action="append", default=[], help="NAME[=VALUE] quirk of the embedded endpoint")
    load.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    load.add_argument("--no-report", action="store_true")
    load.set_defaults(handler=handler)
