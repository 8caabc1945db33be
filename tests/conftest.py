"""Fixtures shared by the harness's own tests: one embedded endpoint for the session; results several tests only
read, made once per worker (tests/shared_runs.py); tests sharing a module's fixture kept on one test worker
(tests/worker_groups.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from unittest import mock

import pytest
from shared_runs import shared  # noqa: F401  (a fixture of this conftest)
from worker_groups import pytest_collection_modifyitems  # noqa: F401  (a hook of this conftest)

from bench.localbox.server import LocalEndpoint, serving


@pytest.fixture(scope="session")
def endpoint() -> Iterator[LocalEndpoint]:
    with serving() as local, mock.patch.dict(os.environ, local.env()):  # restored as it was after
        yield local


@pytest.fixture
def sandbox(endpoint: LocalEndpoint):
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=120, metadata={"test": "localbox"})
    try:
        yield sbx
    finally:
        sbx.kill()
