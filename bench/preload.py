"""`e2b-bench` in a process forked from one that has imported the harness already.

`detect` makes one whole `run` per quirk (81 of them), and each spent about 1 s of CPU importing pytest, the
plugin, the embedded endpoint and envd's stubs before its first case: as much CPU as the run itself on a few
cases. Here a `multiprocessing` fork server imports `PRELOAD` once, in a process of its own holding one thread,
and each command is a fork of it. The fork takes the caller's environment and working directory (as they are at
the call, or as given) and argument vector, writes its standard output and error to files of the caller's, and
exits with `bench.cli.main`'s code: the same code as `python -m bench.cli`, without an interpreter's start and
the imports. The self-tests run their commands this way too (tests/run_cli.py).

The fork server starts on the first call (its imports then, once per calling process) and ends with the caller.
A command is signalled as a child process is (SIGTERM stops a run like Ctrl-C: it kills its sandboxes and writes
its footer); the terminal's Ctrl-C reaches it as it reaches the caller, both being in the caller's process group,
and `stop_all` tells every command under way to stop, for a caller that was interrupted itself.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# What `bench.cli run` imports before its first case; the suites' own modules are left to pytest (it rewrites
# their asserts as it imports them).
ENTRY = "bench.cli"  # `python -m bench.cli`: its main(argv) is what a forked run calls
PRELOAD = (
    ENTRY,
    "pytest",
    "bench.plugin",
    "bench.conformance",
    "bench.selection",
    "bench.shards",
    "bench.upstream.source",
    "bench.triage.console",
    "bench.triage.causes",
    "bench.lifecycle",
    "bench.wire",
    "bench.junit",
    "bench.localbox.server",
)
OUTPUT_TAIL = 1500  # characters of a run's output kept for its error message

_context_lock = threading.Lock()
_live_lock = threading.Lock()
_live: set[multiprocessing.process.BaseProcess] = set()
_context: multiprocessing.context.ForkServerContext | None = None


@dataclass(frozen=True)
class Finished:
    """A forked command that ended: its exit code (negative: the signal that ended it) and what it wrote."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Both streams, standard output first (a message's tail: the end of `stderr`)."""
        return self.stdout + self.stderr


class StillRunning(TimeoutError):
    """The command had not ended within its time: it was stopped (SIGTERM, as on Ctrl-C) and this is how it ended."""

    def __init__(self, timeout_s: float, stopped: Finished) -> None:
        super().__init__(f"not ended after {timeout_s:g} s; stopped, it exited with {stopped.returncode}")
        self.stopped = stopped


def run_forked(
    argv: Sequence[str],
    timeout_s: float,
    grace_s: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: Path | None = None,
) -> Finished:
    """`e2b-bench <argv>` forked from the preloaded fork server, in `env` (default: this process's environment
    now) and `cwd` (default: this process's); its exit code and output once it ends.

    Past `timeout_s` the command gets SIGTERM, `grace_s` to end, then SIGKILL, and `StillRunning` is raised with
    how it ended. Interrupted meanwhile (Ctrl-C, an exception in this thread), it is stopped the same way and the
    exception goes on. `stdout`: a file to write its standard output to as it comes, and to keep (else a
    temporary one, as for its standard error)."""
    streams = [stdout if stdout is not None else _temporary(), _temporary()]
    streams[0].write_bytes(b"")
    environ = dict(os.environ if env is None else env)
    try:
        process = _fork_server().Process(
            target=_run,
            args=(list(argv), environ, str(cwd or os.getcwd()), [str(path) for path in streams]),
            name="e2b-bench",
        )
        with _running(process):
            try:
                process.join(timeout_s)
                timed_out = process.exitcode is None
                if timed_out:
                    _stop(process, grace_s)
            except BaseException:
                _stop(process, grace_s)
                raise
        out, err = (path.read_text(errors="replace") for path in streams)
        finished = Finished(int(process.exitcode or 0), out, err)
        process.close()
        if timed_out:
            raise StillRunning(timeout_s, finished)
        return finished
    finally:
        for path in streams if stdout is None else streams[1:]:
            path.unlink(missing_ok=True)


def stop_all() -> int:
    """Tell every forked run under way to stop (SIGTERM: each kills its sandboxes and writes its footer, and its
    `run_forked` returns once it has); how many were told. For a caller interrupted while other threads wait on runs."""
    with _live_lock:
        live = [process for process in _live if process.exitcode is None]
    for process in live:
        process.terminate()
    return len(live)


@contextlib.contextmanager
def _running(process: multiprocessing.process.BaseProcess) -> Iterator[None]:
    """`process` started, and known to `stop_all` until it has ended."""
    with _live_lock:
        process.start()
        _live.add(process)
    try:
        yield
    finally:
        with _live_lock:
            _live.discard(process)


def _temporary() -> Path:
    fd, name = tempfile.mkstemp(prefix="e2b-bench-run-", suffix=".log")
    os.close(fd)
    return Path(name)


def _stop(process: multiprocessing.process.BaseProcess, grace_s: float) -> None:
    """SIGTERM (the run stops as on Ctrl-C), then SIGKILL if it has not ended after `grace_s`."""
    process.terminate()
    process.join(grace_s)
    if process.exitcode is None:
        process.kill()
        process.join()


def _fork_server() -> multiprocessing.context.ForkServerContext:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(list(PRELOAD))
            _context = context
        return _context


def _run(argv: list[str], environ: dict[str, str], cwd: str, streams: list[str]) -> None:
    """In the fork: become the caller's `python -m bench.cli <argv>` and exit with its code."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    for target, path in enumerate(streams, start=1):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    # By name, as the fork server preloads it: a run is a process the caller starts, not a module it imports
    # (`bench.cli` imports `detect`, whose runs come here).
    cli = importlib.import_module(ENTRY)
    sys.argv = [str(cli.__file__), *argv]
    code = cli.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(int(code))
