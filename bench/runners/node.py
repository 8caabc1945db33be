"""Pinned Node client environments: one `npm ci` per lockfile, built once and cached.

A Node runner's folder (its runner.toml says `project = true`) holds `package.json` +
`package-lock.json`; its exact `e2b` pin names the runner (`js-e2b-<version>`). The SDK projects share
one entry script per suite; the harness points it at the project's installed packages with
`NODE_PATH` (see `runner_env`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.runners.envs import REPO_ROOT, RunnerEnvError, RunnerSpec, default_cache_dir, file_lock

MIN_NODE_MAJOR = 20
NODE_VERSION_TIMEOUT_S = 30

PROJECT_FILES = ("package.json", "package-lock.json")
_READY_MARKER = ".e2b-bench-ready"


def __getattr__(name: str) -> Any:
    """`NODE_RUNNERS` (name -> spec) and `PROJECT_DIRS` (name -> project folder) of the Node SDK runners,
    discovered on first use."""
    from .discovery import discover

    sdk = [spec for spec in discover() if spec.language == "js" and spec.family is None]
    if name == "NODE_RUNNERS":
        return {spec.name: spec for spec in sdk}
    if name == "PROJECT_DIRS":
        return {spec.name: project_of(spec) for spec in sdk}
    raise AttributeError(name)


def find_node(environ: Mapping[str, str] = os.environ) -> Path:
    """`E2B_BENCH_NODE`, else `node` on PATH, once it has answered `--version` with 20 or newer."""
    given = environ.get("E2B_BENCH_NODE")
    configured = given or shutil.which("node")
    if not configured:
        raise RunnerEnvError("node is not installed: install Node.js 20 or newer, or set E2B_BENCH_NODE")
    which = f"E2B_BENCH_NODE={given}" if given else f"node on PATH ({configured})"
    try:
        answer = subprocess.run(
            [configured, "--version"], capture_output=True, text=True, timeout=NODE_VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise RunnerEnvError(f"{which} cannot be run ({reason}): point E2B_BENCH_NODE at Node.js 20 or newer") from None
    said = (answer.stdout.strip().splitlines() or [""])[0][:60]
    found = re.fullmatch(r"v(\d+)\.\S*", said)
    if answer.returncode != 0 or found is None:
        raise RunnerEnvError(f"{which} is not Node.js (`--version` said {said!r}): "
                             "point E2B_BENCH_NODE at Node.js 20 or newer")  # fmt: skip
    if int(found[1]) < MIN_NODE_MAJOR:
        raise RunnerEnvError(f"{which} is Node.js {said}: the runners need 20 or newer")
    return Path(configured)


def project_of(spec: RunnerSpec) -> Path:
    """The Node project directory that pins `spec`."""
    if spec.project is None:
        raise RunnerEnvError(f"runner {spec.name} has no Node project (`project = true` in its runner.toml)")
    return REPO_ROOT / spec.project


def env_dir(project_dir: Path, cache_dir: Path | None = None) -> Path:
    """`<cache>/node/<project>-<hash>`: the hash covers package.json and the lockfile."""
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    digest = hashlib.sha256()
    for name in PROJECT_FILES:
        path = project_dir / name
        if not path.is_file():
            raise RunnerEnvError(f"{path} is missing: a Node runner project needs {' and '.join(PROJECT_FILES)}")
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return cache_dir / "node" / f"{project_dir.name}-{digest.hexdigest()[:12]}"


def ensure_node_env(project_dir: Path, cache_dir: Path | None = None) -> Path:
    """Return the cached copy of `project_dir` with its `node_modules` installed, building it first if needed."""
    directory = env_dir(project_dir, cache_dir)
    if _is_ready(directory):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(directory.with_name(directory.name + ".lock")):
        # Another worker may have finished the build while this one waited for the lock.
        if not _is_ready(directory):
            _build(project_dir, directory)
    return directory


def ensure_node_runner(spec: RunnerSpec, cache_dir: Path | None = None) -> Path:
    """Build (or reuse) the environment of a registered Node runner; returns the `node` that runs its entry.

    The runner process then needs `runner_env(env_dir(project_of(spec)), ...)` as its environment.
    """
    ensure_node_env(project_of(spec), cache_dir)
    return find_node()


def runner_env(env_directory: Path, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The process environment of a Node runner: `base` plus `NODE_PATH` naming the pinned packages."""
    return {**base, "NODE_PATH": str(env_directory / "node_modules")}


def node_env_ready(project_dir: Path, cache_dir: Path | None = None) -> bool:
    """Whether the project's `node_modules` is built already (else `ensure_node_env` installs it)."""
    return _is_ready(env_dir(project_dir, cache_dir))


def _is_ready(directory: Path) -> bool:
    return (directory / _READY_MARKER).is_file() and (directory / "node_modules").is_dir()


def _build(project_dir: Path, directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for name in PROJECT_FILES:
        shutil.copy2(project_dir / name, directory / name)
    npm = shutil.which("npm")
    if npm is None:
        raise RunnerEnvError("npm is not installed: it is needed once per lockfile to build a Node runner")
    argv = [npm, "ci", "--no-audit", "--no-fund"]
    completed = subprocess.run(argv, cwd=directory, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        reason = _npm_reason(completed.stderr) or completed.stdout.strip()[-2000:]
        raise RunnerEnvError(
            f"building the Node environment of {project_dir} failed: `npm ci` exited with {completed.returncode}: "
            f"{reason}"
        )
    marker = {"project": str(project_dir), "files": list(PROJECT_FILES)}
    (directory / _READY_MARKER).write_text(json.dumps(marker, sort_keys=True) + "\n")


def _npm_reason(stderr: str) -> str:
    """The tail of npm's error output, without the usage text it prints after a usage error."""
    lines = [line for line in stderr.splitlines() if line.strip() not in {"", "npm error", "npm ERR!"}]
    usage = next((i for i, line in enumerate(lines) if line.endswith(" Usage:")), None)
    if usage is not None:
        lines = lines[:usage]
    return "\n".join(lines)[-2000:]
