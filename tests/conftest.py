"""Fixtures shared by the harness's own tests: one embedded endpoint for the session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.localbox.server import LocalEndpoint, serving


@pytest.fixture(scope="session")
def endpoint() -> Iterator[LocalEndpoint]:
    with serving() as local:
        saved = {k: os.environ.get(k) for k in local.env()}
        os.environ.update(local.env())
        try:
            yield local
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def sandbox(endpoint: LocalEndpoint):
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=120, metadata={"test": "localbox"})
    try:
        yield sbx
    finally:
        sbx.kill()
