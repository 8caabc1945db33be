"""E2B's own SDK tests as a suite: one item per upstream test function of the source tree
(bench/upstream/source.py), run unmodified by the upstream runner."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("upstream")
def test_upstream(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
