"""The code-interpreter suite: one item per step and runner (Python `e2b-code-interpreter`, npm
`@e2b/code-interpreter`; the same step ids in both languages)."""

from __future__ import annotations

import pytest

from bench.plugin import BenchSession, check_case


@pytest.mark.suite("code-interpreter")
def test_code_interpreter(case: tuple, bench_session: BenchSession) -> None:
    check_case(bench_session, case)
