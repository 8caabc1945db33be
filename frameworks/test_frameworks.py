"""The framework suite: one item per framework runner and step (the proof task and symptom probes)."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("frameworks")
def test_frameworks(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
