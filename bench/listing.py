"""`e2b-bench run --list`: the run as it would be, without running it.

The selection goes through the run's own code path (the CLI's checks, the plugin's collection: suites, runners,
`--case`, `-k`/`-m`, `--shard`, the endpoint, its profile, quirks and declarations file), so a selector that
matches nothing exits 5 exactly as the run would. Instead of starting the endpoint and the runners, the selected
case ids are printed one a line. An endpoint the harness does not embed is also preflighted (the key, every
URL the SDKs will use, one small sandbox created and killed), so `--list` checks a setup before a long run.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from .exits import ExitCode

if TYPE_CHECKING:
    import pytest

    from .conformance import BenchSession

LIST_HELP = (
    "print the selected case ids (one a line) and exit, running nothing: 0, or 5 when nothing matches; against an "
    "endpoint other than the embedded one, its preflight runs too (exit 2 when it fails)"
)


def listed(session: BenchSession, items: list[pytest.Item], out: TextIO = sys.stdout) -> tuple[int, str]:
    """Print the cases `items` select (in run order), then one line on stderr saying how the listing ends;
    returns (exit code, that line)."""
    code, message = _listed(session, items, out)
    print(message, file=sys.stderr)
    return code, message


def _listed(session: BenchSession, items: list[pytest.Item], out: TextIO) -> tuple[int, str]:
    from .results import case_id

    ids = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("case") if callspec else None
        if isinstance(case, tuple):
            suite, runner, step = case
            ids.append(case_id(suite, runner.name, step))
    for one in ids:
        print(one, file=out)
    out.flush()
    if not session.endpoint.provider.embedded:
        session.lifecycle.serve()
        if not session.lifecycle.preflight(session.python_sdks()):
            return ExitCode.USAGE, f"e2b-bench: endpoint unusable: {session.lifecycle.preflight_error}"
        return ExitCode.OK, f"e2b-bench: {_cases(ids)}; endpoint {session.endpoint.name} passed its preflight"
    return ExitCode.OK, f"e2b-bench: {_cases(ids)}"


def _cases(ids: list[str]) -> str:
    return f"{len(ids)} case{'' if len(ids) == 1 else 's'} selected, none run (--list)"
