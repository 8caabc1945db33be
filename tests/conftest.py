"""Fixtures shared by the harness's own tests: one embedded endpoint for the session (runs that do not judge the
embedded default are pointed at it: `served`); results several tests only read, made once per worker
(tests/shared_runs.py); tests sharing a module's fixture kept on one test worker (tests/worker_groups.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from shared_runs import shared  # noqa: F401  (a fixture of this conftest)
from worker_groups import pytest_collection_modifyitems  # noqa: F401  (a hook of this conftest)

from bench.localbox.server import LocalEndpoint, serving

# Property tests judge what the code does, never how fast: hypothesis's default 200 ms deadline per example and its
# too-slow health check fail a test on a busy host (test_redaction failed once so under load), whatever it checks.
settings.register_profile("e2b-bench", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("e2b-bench")

# What CI runs (.ci/run); `--slow` adds the slow-marked tests (the whole upstream suite among them).
CI_SELECTION = "not slow and not bench"
SLOW_SELECTION = "not bench"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("e2b-bench").addoption(
        "--slow",
        action="store_true",
        help=f"run CI's selection ({CI_SELECTION!r}) plus the slow-marked tests: -m {SLOW_SELECTION!r}",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("slow", False):
        # no test path and no -m: the whole suite is what CI runs (a path given runs whatever it holds)
        if not config.option.markexpr and config.args_source == pytest.Config.ArgsSource.TESTPATHS:
            config.option.markexpr = CI_SELECTION
        return
    if config.option.markexpr:
        raise pytest.UsageError("--slow is a selection of its own (-m 'not bench'): give it or -m, not both")
    config.option.markexpr = SLOW_SELECTION


@pytest.fixture(scope="session")
def endpoint() -> Iterator[LocalEndpoint]:
    with serving() as local, mock.patch.dict(os.environ, local.env()):  # restored as it was after
        yield local


@pytest.fixture(scope="session")
def served(endpoint: LocalEndpoint) -> dict[str, str]:
    """The environment of an `e2b-bench` command pointed at this worker's embedded endpoint as a user points it at
    a remote one (`--endpoint env`): for runs that judge the SDKs, frameworks or the harness, not the embedded
    default a run would serve itself (its profile, quirks, start or stop), it saves booting an endpoint per run."""
    return {**endpoint.env(), "E2B_BENCH_ENDPOINT": "env"}


@pytest.fixture
def quirked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalEndpoint]:
    """An embedded endpoint of its own with the quirks `request.param` (one `NAME[=VALUE]`, or a list of them;
    `indirect=True`), the SDK pointed at it."""
    from bench.localbox.quirks import build
    from bench.localbox.server import LocalServer, in_thread

    quirks = [request.param] if isinstance(request.param, str) else list(request.param)
    with in_thread(LocalServer(quirks=build("e2b", quirks), pool_size=0)) as local:
        for key, value in local.env().items():
            monkeypatch.setenv(key, value)
        yield local


@pytest.fixture
def sandbox(endpoint: LocalEndpoint):
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=120, metadata={"test": "localbox"})
    try:
        yield sbx
    finally:
        sbx.kill()
