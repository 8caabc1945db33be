"""What the upstream runner's task says: where the source is, which tests this endpoint cannot serve.

A suite table's `[[<suite>.<table>.needs]]` entries declare, by upstream test id or fnmatch pattern, what
some tests need beyond an E2B endpoint's API (`need`: `internet`, the public internet from the sandbox or the
test; `template-build`, E2B's template build service; `volumes`, E2B's volume service), with the reason. An
endpoint the harness serves itself has none of them: those tests are reported `skip` (reason `needs`), shown
with the declaration's reason; against any other endpoint they run like the rest.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.upstream.source import python_sdk

NEEDS = {
    "internet": "needs the public internet",
    "template-build": "needs E2B's template build service",
    "volumes": "needs E2B's volume service",
}
WORKERS = 2  # pytest-xdist workers of the upstream run: its tests wait on the endpoint more than on the CPU


class NeedsError(Exception):
    """A `needs` entry of the suite's manifest table is malformed."""


@dataclass(frozen=True)
class Need:
    tests: tuple[str, ...]  # upstream test ids or fnmatch patterns over them
    need: str
    reason: str

    def covers(self, test: str) -> bool:
        return any(test == pattern or fnmatch.fnmatchcase(test, pattern) for pattern in self.tests)

    @property
    def why(self) -> str:
        return f"{NEEDS[self.need]}: {self.reason}"


def needs_of(table: Mapping[str, Any]) -> list[Need]:
    """The table's `needs` entries, checked."""
    found = []
    for index, raw in enumerate(table.get("needs", ())):
        tests, need, reason = raw.get("tests"), raw.get("need"), raw.get("reason")
        if need not in NEEDS or not reason or not isinstance(tests, list) or not tests:
            raise NeedsError(
                f"needs entry {index + 1}: give `tests` (a list of ids or patterns), `need` (one of "
                f"{', '.join(NEEDS)}) and a `reason`"
            )
        found.append(Need(tuple(str(test) for test in tests), str(need), str(reason)))
    return found


def declared(table: Mapping[str, Any], tests: Iterable[str]) -> dict[str, str]:
    """Each of `tests` a `needs` entry covers (the first that does), with why it cannot run here."""
    needs = needs_of(table)
    found = {}
    for test in tests:
        need = next((need for need in needs if need.covers(test)), None)
        if need is not None:
            found[test] = need.why
    return found


def task_options(table: Mapping[str, Any], steps: Iterable[str], embedded: bool) -> dict[str, Any]:
    """The runner's `options.upstream`: the source's python-sdk, the tests this endpoint cannot serve (an
    endpoint the harness serves: every declared one), and how many pytest workers run the rest."""
    return {
        "upstream": {
            "python_sdk": str(python_sdk()),
            "declared": declared(table, steps) if embedded else {},
            "workers": WORKERS,
        }
    }
