"""What the upstream runner's task says: where the source is, which tests this endpoint cannot serve.

A suite table's `[[<suite>.<table>.needs]]` entries declare, by upstream test id or fnmatch pattern, what
some tests need beyond an E2B endpoint's API (`need`, one of `NEEDS`), with the reason. An endpoint the
harness serves itself has none of them, and no endpoint has `sdk-defaults` (every runner reaches its endpoint
through the run's wire proxy, named by `E2B_SANDBOX_URL`): the tests a need keeps off the endpoint are
reported `skip` (reason `needs`), shown with the declaration's reason; the others run.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.upstream.source import js_sdk, python_sdk

NEEDS = {  # need -> (what it says, whether any endpoint the harness runs against can meet it)
    "internet": ("needs the public internet", True),
    "sandbox-hosts": ("needs a sandbox's public host names (<port>-<id>.<domain>: wildcard DNS and TLS)", True),
    "template-build": ("needs E2B's template build service", True),
    "volumes": ("needs E2B's volume service", True),
    "sdk-defaults": ("checks the SDK's default URLs, which E2B_SANDBOX_URL (the run's wire proxy) overrides", False),
    "browser": ("runs in a browser (vitest's browser mode, Playwright's Chromium): the JS runner is Node only", False),
    "runtime": ("runs in another JS runtime (Cloudflare workers, Deno, Bun): the JS runner is Node only", False),
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
        return f"{NEEDS[self.need][0]}: {self.reason}"

    def unmet(self, embedded: bool) -> bool:
        """Whether the endpoint cannot meet this need: one the harness serves meets none."""
        return embedded or not NEEDS[self.need][1]


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


def declared(table: Mapping[str, Any], tests: Iterable[str], embedded: bool = True) -> dict[str, str]:
    """Each of `tests` a `needs` entry the endpoint cannot meet covers (the first that does), with why it
    cannot run there."""
    needs = [need for need in needs_of(table) if need.unmet(embedded)]
    found = {}
    for test in tests:
        need = next((need for need in needs if need.covers(test)), None)
        if need is not None:
            found[test] = need.why
    return found


def task_options(table: Mapping[str, Any], steps: Iterable[str], embedded: bool) -> dict[str, Any]:
    """The runner's `options.upstream`: the source's package its tests are in (`python_sdk` for pytest's
    runner, `js_sdk` for vitest's), the tests this endpoint cannot serve, and how many workers run the rest."""
    js = table.get("steps_from") == "upstream-js"
    package = {"js_sdk": str(js_sdk())} if js else {"python_sdk": str(python_sdk())}
    return {"upstream": {**package, "declared": declared(table, steps, embedded), "workers": WORKERS}}
