"""Documented behaviours of the SDKs, each checked by its result and through a second path: one item per
step and runner (inventory: sandboxes/e2b/behaviours.toml)."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("behaviours")
def test_behaviours(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
