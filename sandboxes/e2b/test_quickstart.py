"""The quickstart suites: one item per step and runner (Python 11 steps, TypeScript 23 steps)."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("quickstart")
def test_quickstart(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
