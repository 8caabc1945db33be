"""The agent computer contract: one item per step (a)-(i) of the `[computer.ts]` table, driven from Node through
our adapter of the contract (sandboxes/e2b/ts/agent_computer.mjs)."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("computer")
def test_computer(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
