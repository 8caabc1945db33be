"""Built-in templates: `base`, a minimal Debian root like E2B's own, and `code-interpreter-v1`, the same root
plus a Jupyter kernel stack and the usual data libraries. Each is built once, when first needed, and cached.

Built with mmdebstrap from the host's configured Debian sources, so they hold no host files: no home
directories, checkouts, credentials or server state can be seen from a sandbox.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Bump when the recipe changes: a new directory is built and the old one is left for `clean`.
TEMPLATE_REVISION = "3"
PACKAGES = [
    "bash", "coreutils", "sudo", "curl", "ca-certificates", "python3", "procps", "iproute2",
    "less", "file", "passwd", "util-linux", "findutils", "grep", "sed", "gzip", "tar",
    "python-is-python3", "git", "attr",  # as E2B's base: `python`, git and the xattr tools
]  # fmt: skip
CUSTOMIZE = [
    'chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash user',
    "echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > \"$1/etc/sudoers.d/user\"",
    'chmod 0440 "$1/etc/sudoers.d/user"',
    'mkdir -p "$1/workspace" && chown 1000:1000 "$1/workspace"',
    'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*',
    'mkdir -p "$1/proc" "$1/dev" "$1/sys" "$1/tmp" && chmod 1777 "$1/tmp"',
    # Every command is a login shell, and Debian's /etc/profile forks `id -u` to choose PATH: half the cost
    # of `bash -l -c true` here. bash knows its uid; sh and dash still ask `id`. PATH comes out the same.
    'sed -i \'s/"$(id -u)"/"${EUID:-$(id -u)}"/\' "$1/etc/profile"',
    # root's ~/.profile runs `mesg n`, which only acts on a terminal: without one, no fork and exec for it.
    "sed -i 's/^mesg n/[ ! -t 0 ] || mesg n/' \"$1/root/.profile\"",
]
CODE_INTERPRETER_PACKAGES = [
    "python3-ipykernel", "python3-jupyter-client", "python3-numpy", "python3-pandas", "python3-matplotlib",
    "python3-pil",
]  # fmt: skip
CODE_INTERPRETER_CUSTOMIZE = [
    # Plots render to images without a display, as in E2B's template.
    "echo 'backend: Agg' > \"$1/etc/matplotlibrc\"",
]


@dataclass(frozen=True)
class Recipe:
    """How one built-in template's root is made."""

    name: str
    revision: str
    packages: tuple[str, ...]
    customize: tuple[str, ...]


RECIPES = {
    "base": Recipe("base", TEMPLATE_REVISION, tuple(PACKAGES), tuple(CUSTOMIZE)),
    "code-interpreter-v1": Recipe(
        "code-interpreter-v1",
        f"{TEMPLATE_REVISION}.1",
        (*PACKAGES, *CODE_INTERPRETER_PACKAGES),
        (*CUSTOMIZE, *CODE_INTERPRETER_CUSTOMIZE),
    ),
}


class TemplateError(Exception):
    """A built-in template could not be built."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("E2B_BENCH_CACHE", Path.home() / ".cache" / "e2b-bench"))


def debian_suite() -> str:
    fields = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    codename = fields.get("VERSION_CODENAME", "").strip('"')
    if fields.get("ID", "").strip('"') == "debian" and codename:
        return codename
    return "bookworm"


def _recipe(name: str) -> Recipe:
    recipe = RECIPES.get(name)
    if recipe is None:
        raise TemplateError(f"there is no built-in template '{name}' (known: {', '.join(RECIPES)})")
    return recipe


def _template_dir(recipe: Recipe, cache_dir: Path | None) -> Path:
    return (cache_dir or default_cache_dir()) / "templates" / f"{recipe.name}-r{recipe.revision}"


def template_built(name: str, cache_dir: Path | None = None) -> bool:
    """Whether the built-in template `name` is in the cache (no build needed)."""
    return (_template_dir(_recipe(name), cache_dir) / "ready").exists()


def ensure_template(cache_dir: Path | None = None, name: str = "base") -> Path:
    """Return the template's root directory, building it first if needed (blocks: minutes when cold)."""
    recipe = _recipe(name)
    base = _template_dir(recipe, cache_dir)
    rootfs = base / "rootfs"
    ready = base / "ready"
    if ready.exists():
        return rootfs
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return rootfs
        _build(recipe, base, rootfs)
        ready.write_text("ok\n")
    return rootfs


def _build(recipe: Recipe, base: Path, rootfs: Path) -> None:
    tool = shutil.which("mmdebstrap")
    if tool is None:
        raise TemplateError(
            "building the sandbox template needs mmdebstrap (Debian package 'mmdebstrap'): "
            "install it with 'apt-get install -y mmdebstrap'"
        )
    partial = base / "rootfs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(rootfs, ignore_errors=True)
    command = [
        tool, "--variant=minbase", "--quiet", f"--include={','.join(recipe.packages)}",
        *(f"--customize-hook={hook}" for hook in recipe.customize),
        debian_suite(), str(partial),
    ]  # fmt: skip
    mirror = os.environ.get("E2B_BENCH_DEBIAN_MIRROR")
    if mirror:
        command.append(mirror)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TemplateError(f"mmdebstrap failed ({result.returncode}) for '{recipe.name}': {result.stderr[-2000:]}")
    partial.rename(rootfs)
