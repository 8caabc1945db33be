"""Pinned client environments: one isolated venv per runner, built once and cached."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.paths import DATA_ROOT

REPO_ROOT = DATA_ROOT  # entry scripts and projects are named relative to it
_READY_MARKER = ".e2b-bench-ready"
_INSTALLED = ".e2b-bench-installed.json"  # what the environment holds, with the state it was read in
_INSTALLED_PROBE = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


class RunnerEnvError(Exception):
    """A runner environment could not be built."""


@dataclass(frozen=True)
class RunnerSpec:
    """One client environment: a language, exact package pins and the script that drives it."""

    name: str
    language: str
    pins: Mapping[str, str] = field(hash=False)
    entry: str
    # Manifest table this runner's steps live in, when not its language's (e.g. one per framework).
    family: str | None = None
    # Directory (repo-relative) of a fully pinned environment: `requirements.txt` compiled with
    # `uv pip compile` for Python, `package.json` + `package-lock.json` for Node. Without it, `pins` is installed.
    project: str | None = None
    # `python-sdk`: E2B's SDK source tree's python-sdk is installed too (bench/upstream/source.py finds the tree).
    source: str | None = None

    @property
    def entry_path(self) -> Path:
        return REPO_ROOT / self.entry

    @property
    def lock_path(self) -> Path | None:
        return REPO_ROOT / self.project / "requirements.txt" if self.project else None

    def requirements(self) -> list[str]:
        """What `uv pip install` is given: the lock file when there is one, else the pins."""
        if self.lock_path is not None:
            return ["--requirement", str(self.lock_path)]
        pinned = [f"{package}=={version}" for package, version in sorted(self.pins.items())]
        return pinned + ([str(_source_sdk(self))] if self.source else [])


def _source_sdk(spec: RunnerSpec) -> Path:
    """The source tree's package a `source` runner installs (a SourceError, told as a RunnerEnvError)."""
    from bench.upstream.source import SourceError, python_sdk

    if spec.source != "python-sdk":
        raise RunnerEnvError(f"runner {spec.name}: unknown source {spec.source!r} (python-sdk is the one known)")
    try:
        return python_sdk()
    except SourceError as exc:
        raise RunnerEnvError(str(exc)) from None


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    configured = environ.get("E2B_BENCH_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "e2b-bench"


def env_dir(spec: RunnerSpec, cache_dir: Path) -> Path:
    """`<cache>/runners/<name>-<hash>`: the hash covers the pins, the lock file and the interpreter version."""
    identity = {
        "pins": dict(sorted(spec.pins.items())),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    if spec.lock_path is not None:
        identity["lock"] = hashlib.sha256(spec.lock_path.read_bytes()).hexdigest()
    if spec.source is not None:
        from bench.upstream.source import python_sdk_digest

        sdk = _source_sdk(spec)
        identity["source"] = f"{sdk}:{python_sdk_digest(sdk)}"
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir / "runners" / f"{spec.name}-{digest}"


def find_uv() -> Path:
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return beside
    found = shutil.which("uv")
    if found is None:
        raise RunnerEnvError("uv is not installed: install it in the harness environment (pip install uv)")
    return Path(found)


def ensure_python_env(spec: RunnerSpec, cache_dir: Path | None = None) -> Path:
    """Return the python executable of the spec's venv, building it first if needed."""
    if spec.language != "python":
        raise RunnerEnvError(f"runner {spec.name} is a {spec.language} runner, not a python one")
    directory = env_dir(spec, cache_dir if cache_dir is not None else default_cache_dir())
    python = directory / "bin" / "python"
    if _is_ready(directory, python):
        return python
    directory.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(directory.with_name(directory.name + ".lock")):
        # Another worker may have finished the build while this one waited for the lock.
        if _is_ready(directory, python):
            return python
        _build(spec, directory, python)
    return python


def python_env_ready(spec: RunnerSpec, cache_dir: Path | None = None) -> bool:
    """Whether the spec's venv is built already (else `ensure_python_env` installs it)."""
    directory = env_dir(spec, cache_dir if cache_dir is not None else default_cache_dir())
    return _is_ready(directory, directory / "bin" / "python")


def _is_ready(directory: Path, python: Path) -> bool:
    return (directory / _READY_MARKER).is_file() and python.exists()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock held by a file, so parallel workers do not build the same environment twice."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(spec: RunnerSpec, directory: Path, python: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    uv = str(find_uv())
    _uv(spec, [uv, "venv", "--quiet", "--python", sys.executable, str(directory)])
    # A source tree's package is rebuilt from its files, never taken from uv's cache of an older build.
    fresh = ["--refresh-package", "e2b"] if spec.source else []
    _uv(spec, [uv, "pip", "install", "--quiet", "--python", str(python), *fresh, *spec.requirements()])
    marker = {"runner": spec.name, "pins": dict(spec.pins), "python": sys.version.split()[0]}
    (directory / _READY_MARKER).write_text(json.dumps(marker, sort_keys=True) + "\n")


def _uv(spec: RunnerSpec, argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    completed = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if completed.returncode != 0:
        tail = completed.stderr.strip()[-2000:] or completed.stdout.strip()[-2000:]
        raise RunnerEnvError(
            f"building the {spec.name} environment failed: `{' '.join(argv[1:3])}` exited with "
            f"{completed.returncode}: {tail}"
        )


def installed_versions(python: Path) -> dict[str, str] | None:
    """Every distribution the environment of `python` holds (name -> version); None when its interpreter cannot
    say. Asked once per state of the environment and kept beside it: installing, removing or upgrading a
    package adds or removes an entry of its site-packages directory, which changes the key."""
    directory = python.parent.parent
    key = [f"{p.relative_to(directory)}:{p.stat().st_mtime_ns}" for p in sorted(directory.glob("lib/*/site-packages"))]
    kept = directory / _INSTALLED
    if key:
        try:
            known = json.loads(kept.read_text())
            if known["key"] == key:
                return dict(known["versions"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        done = subprocess.run([str(python), "-I", "-c", _INSTALLED_PROBE], capture_output=True, text=True, check=False)
    except OSError:
        return None
    if done.returncode != 0:
        return None
    versions: dict[str, str] = json.loads(done.stdout)
    if key:
        with contextlib.suppress(OSError):  # a read-only cache is asked again next time
            partial = kept.with_name(f"{kept.name}.{os.getpid()}")
            partial.write_text(json.dumps({"key": key, "versions": versions}, sort_keys=True) + "\n")
            partial.replace(kept)
    return versions
