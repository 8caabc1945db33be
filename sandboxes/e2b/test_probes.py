"""envd probes, refusal cases and token rules: one item per step and runner."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("probes")
def test_probes(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)


@pytest.mark.suite("refusals")
def test_refusals(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)


@pytest.mark.suite("tokens")
def test_tokens(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
