"""Where E2B's SDK source tree is, and which tests it holds.

A tree has E2B's repository layout: `packages/python-sdk` (its `tests/` and `pytest.ini`) and
`packages/js-sdk`. Its tests are listed from the source's syntax, so listing needs no environment: the
`test*` functions of `test_*.py` / `*_test.py` modules and of their `Test*` classes, as pytest collects
them (a parametrized function is one test), and the vitest tests of the js-sdk's `*.test.ts(x)` files, as
`<file> > <describe> > ... > <title>` (a `.each`/`.for` test, or one whose title is a template literal, is
one test: its title keeps the placeholders, which the JS runner matches each reported name against).
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from bench.paths import UPSTREAM_SOURCE

SOURCE_ENV = "E2B_BENCH_UPSTREAM_SOURCE"
PYTHON_SDK = Path("packages") / "python-sdk"
JS_SDK = Path("packages") / "js-sdk"
JS_SEPARATOR = " > "  # between a vitest test's file, describe blocks and title, as vitest names it


class SourceError(Exception):
    """The E2B SDK source tree is missing or not laid out as E2B's repository."""


def source_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The tree to use: `E2B_BENCH_UPSTREAM_SOURCE` when set, else the reference copy beside the checkout."""
    configured = environ.get(SOURCE_ENV)
    return Path(configured).expanduser().resolve() if configured else UPSTREAM_SOURCE.resolve()


def _package(root: Path | None, package: Path, manifest: str) -> Path:
    """The tree's `package` folder, checked to hold `tests/` and its `manifest` file."""
    root = root if root is not None else source_root()
    sdk = root / package
    if not (sdk / "tests").is_dir() or not (sdk / manifest).is_file():
        raise SourceError(
            f"no E2B SDK source tree at {root} (it needs {package}/tests and {manifest}): give the path of "
            f"a checkout of E2B's repository with --upstream-source PATH or {SOURCE_ENV}"
        )
    return sdk


def python_sdk(root: Path | None = None) -> Path:
    """The tree's `packages/python-sdk`, checked to hold `tests/` and a `pyproject.toml`."""
    return _package(root, PYTHON_SDK, "pyproject.toml")


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


def js_sdk(root: Path | None = None) -> Path:
    """The tree's `packages/js-sdk`, checked to hold `tests/` and a `package.json`."""
    return _package(root, JS_SDK, "package.json")


def js_sdk_version(sdk: Path) -> str:
    import json

    return str(json.loads((sdk / "package.json").read_text())["version"])


def js_tests(sdk: Path) -> list[str]:
    """Every vitest test of the js-sdk's `tests/` as `<file> > <describe> > ... > <title>`, files by path,
    tests in source order."""
    return list(_js_tests(sdk.resolve()))


@cache
def _js_tests(sdk: Path) -> tuple[str, ...]:
    tests: list[str] = []
    for module in sorted((sdk / "tests").rglob("*.test.ts*"), key=lambda path: path.relative_to(sdk).as_posix()):
        if module.suffix in {".ts", ".tsx"} and "node_modules" not in module.parts:
            relative = module.relative_to(sdk).as_posix()
            names = vitest_titles(module.read_text(encoding="utf-8"))
            tests += [JS_SEPARATOR.join((relative, *name)) for name in dict.fromkeys(names)]
    return tuple(tests)


# A test or suite call: `test(`, `it.skipIf(x)(`, `sandboxTest.for([...])(`, `describe.each(...)(`: a name,
# then modifiers (`.skip`, `.skipIf(...)`, ...), then the call whose first argument is the title.
_CALLEE = re.compile(r"(?<![\w.$])(describe|suite|test|it|sandboxTest)\b")
_MODIFIER = re.compile(r"\s*\.\s*([A-Za-z_$][\w$]*)")
_NOT_TESTS = {"override", "extend", "scoped", "beforeEach", "afterEach", "beforeAll", "afterAll"}


def vitest_titles(text: str) -> list[tuple[str, ...]]:
    """The tests of one vitest file, each as its describe titles and its own title, from the syntax: calls of
    `describe`/`suite` nest, calls of `test`/`it`/`sandboxTest` are tests (modifiers allowed; `.override`,
    `.extend` and hooks are not). A template literal's `${...}` is kept as written."""
    code, strings = _blank_literals(text)
    found: list[tuple[str, ...]] = []
    suites: list[tuple[str, int]] = []  # open describe blocks: title, offset where its call ends
    for match in _CALLEE.finditer(code):
        while suites and match.start() > suites[-1][1]:
            suites.pop()
        position, modifiers = match.end(), []
        while (modifier := _MODIFIER.match(code, position)) is not None:
            modifiers.append(modifier[1])
            position = modifier.end()
            if code[position : position + 1] == "(" and modifier[1] in {"skipIf", "runIf", "each", "for"}:
                position = _closing(code, position) + 1
        if _NOT_TESTS.intersection(modifiers):
            continue
        opening = len(code[position:]) - len(code[position:].lstrip())
        position += opening
        if code[position : position + 1] != "(":
            continue
        title_at = position + 1 + (len(code[position + 1 :]) - len(code[position + 1 :].lstrip()))
        title = strings.get(title_at)
        if title is None:
            continue
        names = (*(name for name, _ in suites), title)
        if match[1] in {"describe", "suite"}:
            suites.append((title, _closing(code, position)))
        else:
            found.append(names)
    return found


def _blank_literals(text: str) -> tuple[str, dict[int, str]]:
    """`text` with comments and string contents blanked out (offsets kept), and each string literal's
    value by its opening offset."""
    out = list(text)
    strings: dict[int, str] = {}
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if text.startswith("//", index):
            end = text.find("\n", index)
            end = length if end < 0 else end
            out[index:end] = " " * (end - index)
            index = end
        elif text.startswith("/*", index):
            end = text.find("*/", index + 2)
            end = length if end < 0 else end + 2
            out[index:end] = [c if c == "\n" else " " for c in text[index:end]]
            index = end
        elif char in "'\"`":
            end, value = _literal_end(text, index)
            strings[index] = value
            out[index + 1 : end - 1] = [c if c == "\n" else " " for c in text[index + 1 : end - 1]]
            index = end
        else:
            index += 1
    return "".join(out), strings


def _literal_end(text: str, start: int) -> tuple[int, str]:
    """Where the string literal opening at `start` ends (after its closing quote), and its value (a
    template literal's `${...}` as written)."""
    quote, index, value = text[start], start + 1, []
    while index < len(text):
        char = text[index]
        if char == "\\":
            escaped = text[index + 1 : index + 2]
            value.append({"n": "\n", "t": "\t"}.get(escaped, escaped))
            index += 2
            continue
        if char == quote:
            return index + 1, "".join(value)
        if quote == "`" and text.startswith("${", index):
            depth, end = 0, index + 1
            while end < len(text):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    break
                end += 1
            value.append(text[index : end + 1])
            index = end + 1
            continue
        value.append(char)
        index += 1
    return len(text), "".join(value)


def _closing(code: str, opening: int) -> int:
    """The offset of the bracket closing the one at `opening` (literals and comments already blanked)."""
    depth = 0
    for index in range(opening, len(code)):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(code[index], 0)
        if depth == 0:
            return index
    return len(code)
