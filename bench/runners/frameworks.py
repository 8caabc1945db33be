"""Pins read from a runner's own project folder (framework runners, Node SDK runners).

A Python project pins its whole environment in `requirements.txt` (compiled from `requirements.in`
with `uv pip compile`), a Node one in `package.json` + `package-lock.json`. The runner's pins (the
run header shows them next to everything the environment resolved) are read from those files, so
the lock is the single source of the versions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .envs import RunnerEnvError

_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(?P<version>[^\s;#]+)", re.MULTILINE)


def lock_pins(project: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """The exact versions `project` pins for `packages` (requirements.txt, else package.json)."""
    lock = project / "requirements.txt"
    if lock.is_file():
        found = {_normal(m["name"]): m["version"] for m in _PINNED.finditer(lock.read_text())}
    else:
        manifest = json.loads((project / "package.json").read_text())
        found = dict(manifest.get("dependencies", {}))
    pins = {p: found.get(_normal(p), found.get(p, "")) for p in packages}
    loose = [p for p, version in pins.items() if not version[:1].isdigit()]
    if loose:
        raise RunnerEnvError(f"{project} does not pin {', '.join(loose)} to an exact version")
    return pins


def _normal(name: str) -> str:
    return name if name.startswith("@") else re.sub(r"[-_.]+", "-", name).lower()
