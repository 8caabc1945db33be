"""Results several tests only read, made once per test worker: a whole `e2b-bench run` costs tens of seconds,
and tests asserting different things on one run need it only once.

A test takes the session fixture `shared` (defined here; tests/conftest.py imports it) and asks
`shared.once(key, make)`: the first call on a worker runs `make(directory)` in a directory of its own and
keeps what it returns; later calls with the same key get that. Tests reading the same key carry
`shares(key)`, which keeps them on one worker (`--dist loadgroup`), so the result is made once per test
session. They must not change what they get.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bench.detection import DETECTED_BY, run_one

T = TypeVar("T")


def shares(key: str) -> pytest.MarkDecorator:
    """The mark of a test that reads the shared result `key`: pytest-xdist runs such tests on one worker."""
    return pytest.mark.xdist_group(f"shared-{_safe(key)}")


class Shared:
    """This worker's shared results, each made in its own directory under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Any] = {}

    def once(self, key: str, make: Callable[[Path], T]) -> T:
        """What `make(directory)` returned the first time `key` was asked for (a failure is not kept: each test
        asking again tries again and fails on its own)."""
        if key not in self.made:
            directory = Path(tempfile.mkdtemp(prefix=f"{_safe(key)[:60]}-", dir=self.root))
            self.made[key] = make(directory)
        return self.made[key]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    """This worker's shared results (session-scoped: it groups no test; `shares` does)."""
    return Shared(tmp_path_factory.mktemp("shared"))


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", key)


def quirk_key(quirk: str) -> str:
    return f"quirk {quirk}"


def quirk_run(shared: Shared, quirk: str) -> Path:
    """The run of just the cases that flag `quirk`, with the quirk on (`bench.detection.run_one`): the proof of
    its detection and the causes it gives read the same run. Tests calling this carry `shares(quirk_key(quirk))`."""
    return shared.once(quirk_key(quirk), lambda directory: run_one(directory, quirk, only=DETECTED_BY[quirk]))


def quirk_params(quirks: Iterable[str]) -> list[Any]:
    """`quirks` as the parameters of a test that reads each one's `quirk_run`, marked to share it."""
    return [pytest.param(quirk, marks=shares(quirk_key(quirk))) for quirk in quirks]
