"""A wheel built from the checkout works on its own: installed into a fresh venv and run outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from run_cli import REPO, only_run_dir

from bench.results import read_run

RUNNER = "py-e2b-2.63.0"
NOT_SOURCES = (".git", ".venv", ".tox", "build", "dist", "*.egg-info", "results", "out", "node_modules", "__pycache__")
KEPT_ENV = ("PATH", "HOME", "LANG", "TMPDIR", "E2B_BENCH_CACHE", "PIP_FIND_LINKS", "SSL_CERT_FILE")


def uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else str(shutil.which("uv"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a fresh venv holding the wheel (and its dependencies), nothing of the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    # built from a copy of the sources, so the build leaves nothing in the checkout
    shutil.copytree(REPO, root / "src", ignore=shutil.ignore_patterns(*NOT_SOURCES))
    build = [uv(), "build", "--wheel", "--out-dir", str(root / "dist"), str(root / "src")]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    (wheel,) = (root / "dist").glob("e2b_bench-*.whl")
    subprocess.run([uv(), "venv", "--quiet", "--python", sys.executable, str(root / "venv")], check=True, timeout=120)
    install = [uv(), "pip", "install", "--quiet", "--python", str(root / "venv" / "bin" / "python"), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=900)
    return root / "venv" / "bin"


def in_venv(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: os.environ[key] for key in KEPT_ENV if key in os.environ}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_the_installed_package_reads_its_data_from_the_wheel_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    probe = "import bench.paths as p, json; print(json.dumps([str(p.DATA_ROOT), p.FROM_CHECKOUT, str(p.RESULTS_DIR)]))"

    done = in_venv(installed, "python", "-c", probe, cwd=tmp_path)

    data_root, from_checkout, results = json.loads(done.stdout)
    assert Path(data_root) == installed.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / (
        "site-packages/bench/_data"
    )
    assert (from_checkout, Path(results)) == (False, tmp_path / "results")
    assert (Path(data_root) / "sandboxes" / "e2b" / "manifest.toml").is_file()


def test_runners_lists_every_runner_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    done = in_venv(installed, "e2b-bench", "runners", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()]
    assert {RUNNER, "js-e2b-2.51.0", "js-e2b-2.50.0", "ag2-1.2.1", "tanstack-ai-0.58.0"} <= set(names)


def test_a_one_suite_run_from_the_installed_package_passes_and_writes_its_report(
    installed: Path, tmp_path: Path
) -> None:
    done = in_venv(installed, "e2b-bench", "run", "quickstart", "--runner", RUNNER, cwd=tmp_path)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = read_run(only_run_dir(tmp_path / "results"))
    quickstart = [case for case in run.cases if case.suite == "quickstart"]
    assert [(case.runner, case.outcome) for case in quickstart] == [(RUNNER, "pass")] * 11
    assert run.footer is not None and run.footer["status"] == "completed"
    assert (run.path / "report.html").stat().st_size > 0 and (run.path / "junit.xml").is_file()
