"""Any released version as a runner: `--runner BASE@VERSION` (the package that names BASE at VERSION, e.g.
`adk@2.12.0`, `py-e2b@2.46.0`) or `--runner BASE@PACKAGE==VERSION` (another of its packages, e.g.
`adk-2.13.0@e2b==2.40.0`). BASE is a runner's name or its name without the version (`adk`, `py-e2b`).

The new runner is the base's spec with that one pin changed: a runner of `pins` gets the pin; a Python project
runner gets its lock with the package's line replaced, and a Node one its package.json with the dependency
replaced and a lock made for it (`npm install --package-lock-only`), each written under
`<cache>/versioned/<name>/` and built and cached as any runner. `released_versions` lists what the registry
has, through the ordinary clients (`pip index versions`, `npm view`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .envs import REPO_ROOT, RunnerEnvError, RunnerSpec, default_cache_dir, file_lock

SEPARATOR = "@"
RELEASE = re.compile(r"^\d+(\.\d+)*$")  # a final release: no pre-release, dev or local part
LIST_TIMEOUT_S = 120


def base_name(name: str) -> str:
    """A runner's name without its version (`py-e2b-2.63.0` -> `py-e2b`)."""
    head, _, tail = name.rpartition("-")
    return head if head and tail[:1].isdigit() else name


def find_base(base: str, known: Mapping[str, RunnerSpec]) -> RunnerSpec | None:
    """The runner BASE names: itself, else the first (the newest) whose name without its version is BASE."""
    if base in known:
        return known[base]
    return next((spec for spec in known.values() if base_name(spec.name) == base), None)


def versioned(name: str, known: Mapping[str, RunnerSpec]) -> RunnerSpec:
    """The spec `BASE@VERSION` or `BASE@PACKAGE==VERSION` names (RunnerEnvError: no such base or package)."""
    base, _, wanted = name.partition(SEPARATOR)
    package, pinned, version = wanted.partition("==")
    spec = find_base(base, known)
    if spec is None:
        raise RunnerEnvError(f"runner {name!r}: no runner is named {base!r} (see `e2b-bench runners`)")
    if not pinned:
        package, version = next(iter(spec.pins)), wanted
    if not version or not re.fullmatch(r"[\w.+!-]+", version):
        raise RunnerEnvError(f"runner {name!r}: give a version, e.g. {base}@1.2.3 or {base}@PACKAGE==1.2.3")
    naming = package == next(iter(spec.pins))
    new_name = f"{base_name(spec.name)}-{version}" if naming else f"{spec.name}+{package}-{version}"
    pins = {**spec.pins, package: version} if package in spec.pins or spec.project is None else dict(spec.pins)
    if spec.project is None:
        return dataclasses.replace(spec, name=new_name, pins=pins)
    project = _derived_project(spec, new_name, package, version)
    return dataclasses.replace(spec, name=new_name, pins={**pins, package: version}, project=str(project))


def _derived_project(spec: RunnerSpec, name: str, package: str, version: str) -> Path:
    source = REPO_ROOT / str(spec.project)
    target = default_cache_dir() / "versioned" / name
    target.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if spec.language == "python":
            lock = (source / "requirements.txt").read_text()
            line = re.compile(rf"^{re.escape(package)}(\[[^\]]*\])?==[^\s;#]+", re.IGNORECASE | re.MULTILINE)
            found = line.search(lock)
            if found is None:
                lock = lock.rstrip("\n") + f"\n{package}=={version}\n"
            else:
                lock = line.sub(f"{package}{found.group(1) or ''}=={version}", lock)
            _write(target / "requirements.txt", lock)
            return target
        manifest = json.loads((source / "package.json").read_text())
        manifest.setdefault("dependencies", {})[package] = version
        text = json.dumps(manifest, indent=2) + "\n"
        if _write(target / "package.json", text) or not (target / "package-lock.json").is_file():
            npm = shutil.which("npm")
            if npm is None:
                raise RunnerEnvError("npm is not installed: it is needed to lock a Node runner at another version")
            done = subprocess.run(
                [npm, "install", "--package-lock-only", "--no-audit", "--no-fund"],
                cwd=target, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise RunnerEnvError(f"{package}@{version} cannot be locked for {spec.name}: {done.stderr[-600:]}")
    return target


def _write(path: Path, text: str) -> bool:
    """Write `text` unless the file holds it already; whether it changed."""
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def released_versions(package: str, language: str) -> list[str]:
    """The final releases of `package` the registry lists, oldest first (RunnerEnvError: it could not say)."""
    if language == "python":
        argv = [sys.executable, "-m", "pip", "index", "versions", package]
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            pip = shutil.which("pip3") or shutil.which("pip")
            if pip is None:
                raise RunnerEnvError("pip is needed to list a Python package's releases")
            argv = [pip, "index", "versions", package]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False)
        listed = re.search(r"Available versions:\s*(.+)", done.stdout)
        if done.returncode != 0 or listed is None:
            raise RunnerEnvError(f"the registry lists no releases of {package}: {done.stderr.strip()[-300:]}")
        versions = [v.strip() for v in listed.group(1).split(",")]
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise RunnerEnvError("npm is needed to list a Node package's releases")
        done = subprocess.run([npm, "view", package, "versions", "--json"], capture_output=True, text=True,
                              timeout=LIST_TIMEOUT_S, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RunnerEnvError(f"the registry lists no releases of {package}: {done.stderr.strip()[-300:]}")
        parsed = json.loads(done.stdout or "[]")
        versions = parsed if isinstance(parsed, list) else [parsed]
    return sorted((v for v in versions if RELEASE.match(str(v))), key=version_key)
