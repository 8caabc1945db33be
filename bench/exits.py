"""The exit codes of every `e2b-bench` command, defined once, and SIGTERM handled as Ctrl-C (exit 130)."""

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
    USAGE = 2  # configuration, environment or endpoint unusable: one sentence says what to fix
    NO_CASES = 5  # the selection (-k, -m, suites) matched no case
    INTERRUPTED = 130  # Ctrl-C or SIGTERM: runners stopped, footer `interrupted`, results written


EPILOG = """exit codes:
  0    every case conformant
  1    some case not conformant (or a quirk not detected, a benchmark sample failed)
  2    configuration, environment or endpoint unusable (one sentence says what to fix); nothing ran
  5    the selection matched no case
  130  interrupted (Ctrl-C or SIGTERM): runners and their sandboxes stopped, results written
"""


_RECEIVED: list[int] = []  # signals `interrupt_on_sigterm` turned into KeyboardInterrupt


def signal_received() -> bool:
    """Did a Ctrl-C or SIGTERM arrive (so pytest's `interrupted` is the user's doing)?"""
    return bool(_RECEIVED)


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt, so the run ends `interrupted`); a second SIGTERM or
    Ctrl-C while that clean-up runs exits at once with 130."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if _RECEIVED:
            os._exit(ExitCode.INTERRUPTED)
        _RECEIVED.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
