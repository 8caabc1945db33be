"""Where E2B's SDK source tree is, and which tests it holds.

A tree has E2B's repository layout: `packages/python-sdk` (its `tests/` and `pytest.ini`) and
`packages/js-sdk`. Its tests are listed from the source's syntax (the `test*` functions of `test_*.py` /
`*_test.py` modules and of their `Test*` classes, as pytest collects them), so listing needs no
environment; a parametrized function is one test.
"""

from __future__ import annotations

import ast
import hashlib
import os
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from bench.paths import UPSTREAM_SOURCE

SOURCE_ENV = "E2B_BENCH_UPSTREAM_SOURCE"
PYTHON_SDK = Path("packages") / "python-sdk"


class SourceError(Exception):
    """The E2B SDK source tree is missing or not laid out as E2B's repository."""


def source_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The tree to use: `E2B_BENCH_UPSTREAM_SOURCE` when set, else the reference copy beside the checkout."""
    configured = environ.get(SOURCE_ENV)
    return Path(configured).expanduser().resolve() if configured else UPSTREAM_SOURCE.resolve()


def python_sdk(root: Path | None = None) -> Path:
    """The tree's `packages/python-sdk`, checked to hold `tests/` and a `pyproject.toml`."""
    root = root if root is not None else source_root()
    sdk = root / PYTHON_SDK
    if not (sdk / "tests").is_dir() or not (sdk / "pyproject.toml").is_file():
        raise SourceError(
            f"no E2B SDK source tree at {root} (it needs {PYTHON_SDK}/tests and pyproject.toml): give the path of "
            f"a checkout of E2B's repository with --upstream-source PATH or {SOURCE_ENV}"
        )
    return sdk


def python_sdk_version(sdk: Path) -> str:
    with (sdk / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def python_sdk_digest(sdk: Path) -> str:
    """What the installed copy of the source depends on: its project file and every file of its package
    (name, size, modification time), so an edited source gets a fresh environment."""
    digest = hashlib.sha256((sdk / "pyproject.toml").read_bytes())
    for path in sorted((sdk / "e2b").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            stat = path.stat()
            digest.update(f"{path.relative_to(sdk)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def python_tests(sdk: Path) -> list[str]:
    """Every upstream test as its pytest node id without parameters (`tests/x/test_y.py::test_z`), in the
    order pytest collects them (directories and files by name, tests in source order)."""
    return list(_python_tests(sdk.resolve()))


@cache
def _python_tests(sdk: Path) -> tuple[str, ...]:
    tests: list[str] = []
    for module in _modules(sdk / "tests"):
        relative = module.relative_to(sdk).as_posix()
        tree = ast.parse(module.read_bytes(), filename=str(module))
        tests += [f"{relative}::{name}" for name in _test_names(tree.body)]
    return tuple(tests)


def _modules(directory: Path) -> list[Path]:
    """Test modules as pytest visits them: a directory's entries by name, files and directories alike."""
    found: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda path: path.name):
        if entry.is_dir() and not entry.name.startswith((".", "__")):
            found += _modules(entry)
        elif entry.is_file() and entry.suffix == ".py" and _is_test_module(entry.name):
            found.append(entry)
    return found


def _is_test_module(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py")


def _test_names(body: list[ast.stmt], prefix: str = "") -> list[str]:
    names: dict[str, None] = {}  # a name defined twice is one test (the last definition), kept in first place
    for node in body:
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test")
            and not _fixture(node)
        ):
            names[prefix + node.name] = None
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test") and not _has_init(node):
            names.update(dict.fromkeys(_test_names(node.body, f"{prefix}{node.name}::")))
    return list(names)


def _fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function decorated as a fixture (`@pytest.fixture`, `@fixture(...)`) is not a test."""
    return any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)


def _has_init(node: ast.ClassDef) -> bool:
    return any(isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in node.body)
