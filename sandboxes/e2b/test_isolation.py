"""Sandbox isolation as any endpoint shows it: one item per step and runner."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("isolation")
def test_isolation(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
