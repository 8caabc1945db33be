"""Framework runners: one pinned environment per agent framework, under `frameworks/<name>/`.

A Python framework pins its whole environment in `requirements.txt` (compiled from `requirements.in`
with `uv pip compile`), a Node one in `package.json` + `package-lock.json`. The runner's pins (the
run header shows them next to everything the environment resolved) are read from those files, so
the lock is the single source of the versions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .envs import REPO_ROOT, RunnerEnvError, RunnerSpec

FRAMEWORKS_DIR = "frameworks"
_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(?P<version>[^\s;#]+)", re.MULTILINE)


def lock_pins(project: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """The exact versions `project` pins for `packages` (requirements.txt, else package.json)."""
    lock = project / "requirements.txt"
    if lock.is_file():
        found = {_normal(m["name"]): m["version"] for m in _PINNED.finditer(lock.read_text())}
    else:
        manifest = json.loads((project / "package.json").read_text())
        found = dict(manifest.get("dependencies", {}))
    missing = [p for p in packages if _normal(p) not in found and p not in found]
    if missing:
        raise RunnerEnvError(f"{project} does not pin {', '.join(missing)} exactly")
    return {p: found.get(_normal(p), found.get(p, "")) for p in packages}


def _normal(name: str) -> str:
    return name if name.startswith("@") else re.sub(r"[-_.]+", "-", name).lower()


def _framework(name: str, language: str, entry: str, packages: tuple[str, ...]) -> RunnerSpec:
    project = f"{FRAMEWORKS_DIR}/{name}"
    pins = lock_pins(REPO_ROOT / project, packages)
    return RunnerSpec(
        name=f"{name}-{pins[packages[0]]}",
        language=language,
        pins=pins,
        entry=f"{project}/{entry}",
        family=name,
        project=project,
    )


# One line per framework: the first package's version names the runner.
FRAMEWORK_RUNNER_SPECS: tuple[RunnerSpec, ...] = (
    _framework("ag2", "python", "runner.py", ("ag2", "openai", "e2b")),
    _framework("adk", "python", "runner.py", ("google-adk", "litellm", "e2b")),
    _framework("pydantic-ai-harness", "python", "runner.py", ("pydantic-ai-harness", "pydantic-ai-slim", "e2b")),
    _framework(
        "tanstack-ai", "js", "runner.mjs", ("@tanstack/ai", "@tanstack/ai-openai", "@tanstack/ai-sandbox", "e2b")
    ),
)  # fmt: skip
