"""The exit codes of every `e2b-bench` command, defined once."""

from __future__ import annotations

import enum


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
