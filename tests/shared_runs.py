"""Results several tests only read, made once per test session: a whole `e2b-bench run` costs tens of seconds,
and tests asserting different things on one run need it only once.

A test takes the session fixture `shared` (defined here; tests/conftest.py imports it) and asks
`shared.once(key, make)`: the first call in the session, on whichever test worker, runs `make(directory)` in a
directory of its own and keeps what it returns (pickled beside it); a later call with the same key, on any worker,
gets that: a worker asking while another makes it waits for it (a lock file per key). Tests reading the same key
carry `shares(key)`, which keeps them on one worker (`--dist loadgroup`) where nothing else needs them apart, so
one worker is not left waiting on another. They must not change what they get.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.detection import DETECTED_BY, run_one

T = TypeVar("T")


def shares(key: str) -> pytest.MarkDecorator:
    """The mark of a test that reads the shared result `key`: pytest-xdist runs such tests on one worker."""
    return pytest.mark.xdist_group(f"shared-{_safe(key)}")


class Shared:
    """The session's shared results, each made in its own directory under `root` (common to every worker)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Any] = {}

    def once(self, key: str, make: Callable[[Path], T]) -> T:
        """What `make(directory)` returned the first time `key` was asked for in the session (a failure is not
        kept: each test asking again tries again and fails on its own)."""
        if key not in self.made:
            name = f"{_safe(key)[:60]}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            with (self.root / f"{name}.lock").open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the worker dies
                kept = self.root / f"{name}.pickle"
                if kept.exists():
                    self.made[key] = pickle.loads(kept.read_bytes())
                else:
                    directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
                    self.made[key] = made = make(directory)
                    partial = kept.with_suffix(".partial")
                    partial.write_bytes(pickle.dumps(made))
                    partial.replace(kept)
        return self.made[key]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    """The session's shared results (session-scoped: it groups no test; `shares` does). Under pytest-xdist each
    worker's base directory is inside the session's, which holds them for all."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-results"
    root.mkdir(exist_ok=True)
    return Shared(root)


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


WHOLE_RUN_S = 1800  # a whole default run of one profile, on a loaded host


def profile_key(profile: str) -> str:
    return f"profile {profile} whole"


def whole_run(shared: Shared, profile: str) -> tuple[int, Path, str]:
    """The whole default run of a shipped profile (`e2b-bench run --profile P`, judged by its declarations): its
    exit code, run directory and the end of its output. Tests calling this carry `shares(profile_key(profile))`."""

    def make(directory: Path) -> tuple[int, Path, str]:
        done = e2b_bench("run", "--profile", profile, "--results-dir", str(directory), "--no-report",
                         timeout=WHOLE_RUN_S)  # fmt: skip
        return done.returncode, only_run_dir(directory), done.stdout[-3000:] + done.stderr[-3000:]

    return shared.once(profile_key(profile), make)
