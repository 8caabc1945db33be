"""Every runner the harness knows, whatever its language, behind one small interface."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from .discovery import discover
from .envs import RunnerEnvError, RunnerSpec, ensure_python_env, installed_versions, python_env_ready
from .manifest import load_manifest

# Which manifest table a language's steps live in.
MANIFEST_TABLES = {"python": "python", "js": "ts"}
# Environment a runner always gets (besides the endpoint variables): nothing of the host's secrets.
# E2B_VALIDATE_API_KEY: the older Python SDKs' switch for their key format check (see bench/endpoints.py).
PASSED_THROUGH = (
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "E2B_BENCH_CACHE",
    "E2B_VALIDATE_API_KEY",
)  # fmt: skip


@dataclass(frozen=True)
class Runner:
    spec: RunnerSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pins(self) -> Mapping[str, str]:
        return self.spec.pins

    @property
    def language(self) -> str:
        return self.spec.language

    def table(self, suite: str) -> str | None:
        """The manifest table holding this runner's steps of `suite` (None: it has none)."""
        tables = _manifest().get(suite, {})
        # A family runner (a framework) has only its family's table; SDK runners have their language's.
        name = self.spec.family or MANIFEST_TABLES.get(self.spec.language)
        return name if name in tables else None

    def has_suite(self, suite: str) -> bool:
        return self.table(suite) is not None

    def for_suite(self, suite: str) -> RunnerSpec:
        """The spec with the entry script of `suite` (each suite table names its own)."""
        table = self.table(suite)
        entry = _manifest()[suite][table].get("entry") if table else None
        return dataclasses.replace(self.spec, entry=entry) if entry else self.spec

    def prepare(self) -> Path:
        """Build (or reuse) the pinned environment; returns the interpreter that runs the entry script."""
        if self.language == "python":
            return ensure_python_env(self.spec)
        from .node import ensure_node_runner

        return ensure_node_runner(self.spec)

    def is_prepared(self) -> bool:
        """Whether the pinned environment is built already (else `prepare` installs it: the slow first run)."""
        if self.language == "python":
            return python_env_ready(self.spec)
        from .node import node_env_ready, project_of

        return node_env_ready(project_of(self.spec))

    def resolved_versions(self, executable: Path) -> dict[str, str]:
        """Every package the prepared environment really holds (for the run header), not only the pins."""
        if self.language == "python":
            installed = installed_versions(executable)
            if installed is None:  # an interpreter that cannot run here is the runner's start to report
                return dict(self.pins)
            found = installed
        else:
            from .node import env_dir as node_env_dir
            from .node import project_of

            lock = json.loads((node_env_dir(project_of(self.spec)) / "package-lock.json").read_text())
            found = {
                path.removeprefix("node_modules/"): entry["version"]
                for path, entry in lock.get("packages", {}).items()
                if path.startswith("node_modules/") and "version" in entry
            }
            try:
                found["node"] = subprocess.run(
                    [str(executable), "--version"], capture_output=True, text=True, check=False
                ).stdout.strip()
            except OSError:
                found["node"] = "cannot be executed"
        return {**dict(sorted(found.items())), **self.pins}

    def environment(self, endpoint_env: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH}
        env.update(endpoint_env)
        if self.language == "js":
            from .node import env_dir as node_env_dir
            from .node import project_of, runner_env

            env = runner_env(node_env_dir(project_of(self.spec)), env)
        return env


def prepare_all(runners: list[Runner], progress: Callable[[str], None]) -> dict[str, Path | str]:
    """Build (or reuse) every runner's environment at once: runner name -> the executable of its entry, or
    why the environment could not be built. Environments not built yet are named to `progress` first, and
    each again when it is done (a first run installs them all: minutes, not seconds)."""
    cold = [runner.name for runner in runners if not runner.is_prepared()]
    if cold:
        progress(f"building {len(cold)} runner environment(s), cached for later runs: {', '.join(cold)}")
    started = time.monotonic()

    def prepare(runner: Runner) -> Path | str:
        try:
            return runner.prepare()
        except RunnerEnvError as exc:
            return f"runner environment {runner.name} could not be built: {exc}"

    with ThreadPoolExecutor(max_workers=max(len(runners), 1), thread_name_prefix="prepare") as pool:
        futures = {pool.submit(prepare, runner): runner.name for runner in runners}
        for future in as_completed(futures):
            if futures[future] in cold:
                done = "ready" if isinstance(future.result(), Path) else "FAILED"
                progress(f"{futures[future]} {done} after {time.monotonic() - started:.0f} s")
        prepared = {name: future.result() for future, name in futures.items()}
    return {runner.name: prepared[runner.name] for runner in runners}


def _manifest() -> dict:
    return load_manifest()


def available_runners() -> dict[str, Runner]:
    return {spec.name: Runner(spec) for spec in discover()}


def default_runners() -> list[Runner]:
    """One runner per language (the newest SDK pin of each) and one per framework family."""
    chosen: dict[tuple[str, str | None], Runner] = {}
    for runner in available_runners().values():
        chosen.setdefault((runner.language, runner.spec.family), runner)
    return list(chosen.values())
