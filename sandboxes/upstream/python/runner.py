"""The upstream runner: E2B's own Python SDK tests, unmodified, run by pytest inside this runner's
environment (the tests' own dependencies and the source's `e2b`), one step per upstream test function.

The task's `options.upstream` names the source (`python_sdk`: its `packages/python-sdk`), the tests this
endpoint cannot serve (`declared`: step -> why; reported `skip` with reason `needs`, never run) and the
pytest workers. pytest runs in this process from the source's directory with its own `pytest.ini` and
conftest; a small plugin turns its reports into step events as each test function ends (all of its
parameter sets). Nothing is written into the source tree (no cache, no bytecode).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2b" / "python"))
from runkit import Protocol, Skip, excerpt, one_line, read_task

LONGREPR_CHARS = 4000


def function_of(nodeid: str) -> str:
    """`tests/x.py::test_y[a-b]` -> `tests/x.py::test_y`: the step a parametrized item belongs to."""
    return nodeid.split("[", 1)[0]


class Reporter:
    """A pytest plugin: each upstream test function's items, judged together once the last one ends."""

    def __init__(self, protocol: Protocol, wanted: list[str]) -> None:
        self.protocol = protocol
        self.wanted = set(wanted)
        self.expected: dict[str, int] = {}  # step -> how many items pytest collected for it
        self.items: dict[str, dict[str, str]] = defaultdict(dict)  # step -> item id -> outcome
        self.failures: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # step -> (item, message, text)
        self.skipped: dict[str, str] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        self.reported: set[str] = set()

    # --- how many items each function has: collected here, or by each xdist worker ---------------------------
    def pytest_collection_finish(self, session: Any) -> None:
        self._count(item.nodeid for item in session.items)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.expected:  # every worker collects the same items
            self._count(ids)

    def _count(self, nodeids: Any) -> None:
        for nodeid in nodeids:
            step = function_of(nodeid)
            self.expected[step] = self.expected.get(step, 0) + 1

    # --- each phase's report -----------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report: Any) -> None:
        step = function_of(report.nodeid)
        if step not in self.wanted or step in self.reported:
            return
        self.seconds[step] += report.duration
        item = report.nodeid.removeprefix(step) or step
        if report.failed:
            self.items[step][item] = "fail"
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1:]
            where = "" if report.when == "call" else f"in {report.when}: "
            self.failures[step].append((item, where + one_line(str(message)), str(report.longreprtext)))
        elif report.skipped and report.when != "teardown":
            xfail = hasattr(report, "wasxfail")
            self.items[step].setdefault(item, "pass" if xfail else "skip")
            if not xfail and isinstance(report.longrepr, tuple):
                self.skipped[step] = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.when == "call":
            self.items[step].setdefault(item, "pass")
        if report.when == "teardown" and len(self.items[step]) >= self.expected.get(step, 1):
            self.send(step)

    def send(self, step: str) -> None:
        self.reported.add(step)
        outcomes = self.items[step]
        details: dict[str, Any] = {"upstream": step}
        if len(outcomes) > 1 or step not in outcomes:
            details["items"] = dict(outcomes)
        duration = round(self.seconds[step] * 1000, 3)
        if self.failures[step]:
            first = self.failures[step][0]
            details["longrepr"] = excerpt("\n\n".join(text for _, _, text in self.failures[step]), LONGREPR_CHARS)
            error = (
                first[1]
                if len(outcomes) == 1
                else f"{len(self.failures[step])} of {len(outcomes)} failed; {first[0]}: {first[1]}"
            )
            self.protocol.step(step, "fail", duration, error, details)
        elif outcomes and all(outcome == "skip" for outcome in outcomes.values()):
            reason = self.skipped.get(step, "skipped")
            self.protocol.step(step, "skip", duration, None, details, Skip(f"upstream skips it: {reason}", "upstream"))
        else:
            self.protocol.step(step, "pass", duration, None, details)


def main() -> int:
    protocol = Protocol()
    signal.signal(signal.SIGTERM, _interrupt)  # pytest unwinds: the tests' finalizers kill their sandboxes
    task = read_task(protocol)
    options = task.get("options") or {}
    upstream = options.get("upstream") or {}
    sdk = Path(upstream["python_sdk"])
    import pytest

    protocol.hello(task["runner"], {"pytest": pytest.__version__, "e2b": _version("e2b")})
    steps: list[str] = list(task.get("steps") or ())
    declared: dict[str, str] = dict(upstream.get("declared") or {})
    for step in steps:
        if step in declared:
            protocol.step(step, "skip", 0.0, None, {"upstream": step}, Skip(declared[step], "needs"))
    wanted = [step for step in steps if step not in declared]
    reporter = Reporter(protocol, wanted)
    started = time.monotonic()
    code = 0
    if wanted:
        os.chdir(sdk)
        sys.dont_write_bytecode = True
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # and in the xdist workers: nothing written into the tree
        workers = int(upstream.get("workers") or 0)
        args = ["-q", "--no-header", "-p", "no:cacheprovider", "-o", "console_output_style=classic", "-rN"]
        args += ["-n", str(workers)] if workers > 1 else ["-p", "no:xdist"]
        code = int(pytest.main([*args, *wanted], plugins=[reporter]))
    elapsed = round(time.monotonic() - started, 1)
    for step in wanted:
        if step not in reporter.reported:
            why = "pytest did not collect it" if step not in reporter.expected else "pytest reported no end for it"
            protocol.step(step, "error", 0.0, f"{why} (pytest exit code {code}; see the runner's stderr)", {})
    protocol.footer(True, cleanup={}, pytest_exit_code=code, seconds=elapsed)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
