"""Client environments (pinned SDKs) driven as JSON-lines subprocesses."""

from typing import Any

from bench.runners.envs import RunnerEnvError, RunnerSpec, default_cache_dir, ensure_python_env
from bench.runners.protocol import RunnerResult, StepResult, run_runner

__all__ = [
    "RUNNERS",
    "RunnerEnvError",
    "RunnerResult",
    "RunnerSpec",
    "StepResult",
    "default_cache_dir",
    "ensure_python_env",
    "run_runner",
]


def __getattr__(name: str) -> Any:
    """`RUNNERS`: the Python SDK runners by name, discovered on first use (runner.toml files)."""
    if name != "RUNNERS":
        raise AttributeError(name)
    from bench.runners.discovery import discover

    return {spec.name: spec for spec in discover() if spec.language == "python" and spec.family is None}
