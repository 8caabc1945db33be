"""Client environments (pinned SDKs) driven as JSON-lines subprocesses."""

from bench.runners.envs import (
    DEFAULT_PYTHON_RUNNER,
    RUNNERS,
    RunnerEnvError,
    RunnerSpec,
    default_cache_dir,
    ensure_python_env,
)
from bench.runners.protocol import RunnerResult, StepResult, run_runner

__all__ = [
    "DEFAULT_PYTHON_RUNNER",
    "RUNNERS",
    "RunnerEnvError",
    "RunnerResult",
    "RunnerSpec",
    "StepResult",
    "default_cache_dir",
    "ensure_python_env",
    "run_runner",
]
