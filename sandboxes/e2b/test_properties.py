"""Property-based cases against the endpoint (seeded, bounded, shrunk): one item per step and runner."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("properties")
def test_properties(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
