"""The exit codes of every `e2b-bench` command, defined once, and SIGTERM handled as Ctrl-C (a run ended by
SIGTERM exits 143, by Ctrl-C 130: 128 + the signal, as a shell reports a process that signal ended)."""

from __future__ import annotations

import contextlib
import enum
import os
import signal
from collections.abc import Iterator
from types import FrameType


class ExitCode(enum.IntEnum):
    OK = 0  # every case conformant (or the command did what it was asked)
    NONCONFORMANT = 1  # some case is not conformant, or the run could not finish its work
    USAGE = 2  # configuration, environment or endpoint unusable (or only transient): one sentence says which
    HARNESS = 3  # the harness's own environment failed (Node, a runner that cannot be built, no disk room)
    NO_CASES = 5  # the selection (-k, -m, suites) matched no case
    INTERRUPTED = 130  # Ctrl-C (SIGINT): runners stopped, footer `interrupted`, results written
    TERMINATED = 143  # SIGTERM (`timeout`, a CI cancel): the same as Ctrl-C


EPILOG = """exit codes:
  0    every case conformant
  1    some case not conformant (or a quirk not detected, a benchmark sample failed)
  2    configuration, environment or endpoint unusable (one sentence says what to fix); nothing ran.
       Also a run whose every non-conformant case failed only by a 429/502/503 of the endpoint and could not
       be run again (a case that fails again on its re-run is a deviation: 1)
  3    the harness's own environment failed: Node.js missing or too old, E2B_BENCH_NODE wrong, a runner
       environment that could not be built (the other runners' cases are recorded), or a results directory
       with less than 64 MB free (nothing ran)
  5    the selection matched no case
  130  interrupted by Ctrl-C (SIGINT): runners and their sandboxes stopped, results written; a signal
       after the last case lets the results be written as the run ended, then exits 130
  143  interrupted by SIGTERM (`timeout`, a CI cancel): the same as 130
"""


_RECEIVED: list[int] = []  # signals `interrupt_on_sigterm` caught (the first one counts; a second exits)
_WRITING: list[bool] = []  # non-empty once `defer_interrupts` was called: results are being written
_DEFERRED: list[int] = []  # a first signal that arrived while they were


def signal_received() -> bool:
    """Did a Ctrl-C or SIGTERM arrive (so pytest's `interrupted` is the user's doing)?"""
    return bool(_RECEIVED)


def interrupted_code() -> ExitCode:
    """The exit code of an interrupted command: 143 when the first signal was SIGTERM, else 130 (Ctrl-C, or a
    KeyboardInterrupt raised before any handler was installed)."""
    return ExitCode.TERMINATED if _RECEIVED[:1] == [signal.SIGTERM] else ExitCode.INTERRUPTED


def defer_interrupts() -> None:
    """From here on the command writes its results: a first Ctrl-C or SIGTERM no longer cuts that short (a
    footer without its report, a report without `latest.json`) but is kept, and `main` exits 130 (143 for SIGTERM)
    once the results are written. A second signal still exits at once."""
    _WRITING.append(True)


def interrupt_deferred() -> bool:
    """Did a first signal arrive after `defer_interrupts` (so the command must still end with 130)?"""
    return bool(_DEFERRED)


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt, so the run ends `interrupted`); a second SIGTERM or
    Ctrl-C while that clean-up runs exits at once (130, or 143 when the first signal was SIGTERM). Once results
    are being written (`defer_interrupts`), the first signal lets them finish."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if _RECEIVED:
            os._exit(interrupted_code())
        _RECEIVED.append(signum)
        if _WRITING:
            _DEFERRED.append(signum)
            # os.write, not print: a handler may run in the middle of another write to stderr
            os.write(2, b"e2b-bench: interrupted while writing the results: finishing them first, then exit %d "
                        b"(signal again to exit at once)\n" % interrupted_code())  # fmt: skip
            return
        raise KeyboardInterrupt

    for state in (_RECEIVED, _WRITING, _DEFERRED):
        state.clear()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        _WRITING.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
