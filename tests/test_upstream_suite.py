"""E2B's own SDK tests as the `upstream` suite, against the embedded endpoint with the reference tree in
../shared (bench/upstream/, sandboxes/upstream/).

The bounded run (CI's normal selection) takes a few modules by `--case`; the whole suite is `slow`. Both read
what the run recorded and check it against facts of their own: pytest's collection of the tree, the wire log
(the tests really spoke to the endpoint), docs/suites.md's list of the tests that do not pass here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
from run_cli import REPO, e2b_bench, only_run_dir

from bench.results import read_run
from bench.runners.catalog import available_runners
from bench.runners.envs import ensure_python_env
from bench.runners.manifest import load_manifest
from bench.runners.node import ensure_node_env, find_node, project_of
from bench.upstream.plan import NEEDS, declared, needs_of
from bench.upstream.source import SourceError, js_sdk, js_tests, python_sdk, python_tests, source_root, vitest_titles
from bench.verdict import rerun_command

SUITE, RUNNER = "upstream", "py-upstream"
# A few modules: commands and files against sandboxes (sync and async), a unit-test module, one whose
# integration tests a declaration keeps off the embedded endpoint (template builds; the rest run), and the
# template alias lookup (`Template.exists`, answered 501 before the endpoint had the route).
BOUNDED = (
    "tests/sync/sandbox_sync/commands/test_run.py",
    "tests/async/sandbox_async/files/test_write.py",
    "tests/test_paginator.py",
    "tests/sync/template_sync/test_tags.py",
    "tests/sync/template_sync/test_exists.py",
)
LIST_START, LIST_END = "<!-- upstream-not-passing:start -->", "<!-- upstream-not-passing:end -->"

try:
    SDK: Path | None = python_sdk()
except SourceError:
    SDK = None
needs_tree = pytest.mark.skipif(SDK is None, reason=f"no E2B SDK source tree at {source_root()}")

# The JavaScript half: E2B's js-sdk tests under vitest (sandboxes/upstream/js/).
JS_RUNNER = "js-upstream"
# A few files: commands against sandboxes, unit tests with a `.for` test and a template-literal title
# (one case each for every test they name).
JS_BOUNDED = (
    "tests/sandbox/commands/run.test.ts",
    "tests/utils.test.ts",
    "tests/envd/handleRpcError.test.ts",
)
PLACEHOLDER = re.compile(r"\$\{[^}]*\}|%[sdifjoc#$%]|\$[A-Za-z_][\w.]*|\$\d+")

try:
    JS_SDK: Path | None = js_sdk()
except SourceError:
    JS_SDK = None
needs_js_tree = pytest.mark.skipif(JS_SDK is None, reason=f"no E2B js-sdk source tree at {source_root()}")


def table() -> dict:
    return load_manifest()[SUITE][RUNNER]


def module_tests(module: str) -> list[str]:
    assert SDK is not None
    return [test for test in python_tests(SDK) if test.startswith(f"{module}::")]


def upstream_run(results: Path, *patterns: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    cases = [arg for pattern in patterns for arg in ("--case", f"{SUITE}/{RUNNER}/{pattern}")]
    return e2b_bench("run", SUITE, "--results-dir", str(results), "--no-report", *cases, timeout=timeout)


def not_passing_here() -> dict[str, str]:
    """Every upstream test that does not pass against the embedded endpoint, with why: the `needs` declarations
    of the suite and the local endpoint's declarations of upstream cases (Python's tests, then JavaScript's)."""
    assert SDK is not None
    with (REPO / "expectations" / "local.toml").open("rb") as handle:
        cases = tomllib.load(handle).get("cases", {})
    found: dict[str, str] = {}
    listings = [(RUNNER, python_tests(SDK))] + ([(JS_RUNNER, js_tests(JS_SDK))] if JS_SDK is not None else [])
    for runner, tests in listings:
        found.update(declared(load_manifest()[SUITE][runner], tests))
        prefix = f"{SUITE}/{runner}/"
        for pattern, declaration in cases.items():
            if pattern.startswith(prefix):
                for test in tests:
                    if re.fullmatch(re.escape(pattern[len(prefix) :]).replace(r"\*", ".*"), test):
                        found.setdefault(test, f"{declaration['outcome']}: {declaration['reason']}")
    return found


def page_list() -> str:
    """docs/suites.md's list as it should read: one line per test, grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for test, why in not_passing_here().items():
        by_reason.setdefault(why, []).append(test)
    lines = []
    for why, tests in by_reason.items():
        lines.append(f"- {why} ({len(tests)}):")
        lines += [f"  - `{test}`" for test in tests]
    return "\n".join(lines)


@needs_tree
def test_the_listing_is_what_pytest_collects() -> None:
    """Each upstream test the suite lists is one pytest collects from the tree, and none is missed (pytest in the
    runner's own environment, parameters folded into their function)."""
    assert SDK is not None
    python = ensure_python_env(available_runners()[RUNNER].spec)
    done = subprocess.run(
        [str(python), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=SDK,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    collected = list(dict.fromkeys(line.split("[", 1)[0] for line in done.stdout.splitlines() if "::" in line))

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert python_tests(SDK) == collected


@needs_tree
def test_every_needs_entry_covers_some_test_and_names_a_known_need() -> None:
    assert SDK is not None
    tests = python_tests(SDK)
    for need in needs_of(table()):
        assert need.need in NEEDS
        for pattern in need.tests:
            assert any(need.covers(test) and (test == pattern or "*" in pattern) for test in tests), pattern


@needs_tree
def test_the_docs_list_each_test_that_does_not_pass_here_with_its_reason() -> None:
    text = (REPO / "docs" / "suites.md").read_text("utf-8")
    start, end = text.index(LIST_START) + len(LIST_START), text.index(LIST_END)

    assert text[start:end].strip() == page_list()


@needs_tree
def test_a_missing_tree_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    done = e2b_bench("run", SUITE, "--upstream-source", str(tmp_path / "nowhere"), "--results-dir", str(tmp_path))

    assert done.returncode == 2, done.stdout + done.stderr
    assert "no E2B SDK source tree at" in done.stderr and "--upstream-source" in done.stderr
    assert not any(tmp_path.iterdir())


@needs_tree
def test_bounded_run_records_each_upstream_test_of_the_modules_as_a_case(tmp_path: Path) -> None:
    assert SDK is not None
    started = time.time()
    done = upstream_run(tmp_path, *(f"{module}::*" for module in BOUNDED))
    written = [p for m in BOUNDED for p in (SDK / m).parent.glob("__pycache__/*.pyc") if p.stat().st_mtime >= started]
    run = read_run(only_run_dir(tmp_path))
    cases = {case.case: case for case in run.cases if case.suite == SUITE}
    wanted = [test for module in BOUNDED for test in module_tests(module)]
    skipped = declared(table(), wanted)
    wire = [json.loads(line) for line in (run.path / "wire" / f"{RUNNER}.jsonl").read_text().splitlines()]
    junit = (run.path / "junit.xml").read_text()

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(cases) == sorted(wanted)
    assert skipped and set(skipped) == {t for t in wanted if "::TestTagsIntegration::" in t}
    for test, why in skipped.items():  # declared, shown with the reason, never run
        assert (cases[test].outcome, cases[test].conformant, cases[test].error) == ("skip", True, why)
    assert all(cases[t].outcome == "pass" and cases[t].conformant for t in wanted if t not in skipped)
    # the sandbox tests reached the endpoint through the run's wire proxy: one create per sandbox test at least
    creates = [line for line in wire if line["method"] == "POST" and line["url"].split("?")[0].endswith("/sandboxes")]
    assert len(creates) >= len(module_tests(BOUNDED[0])) + len(module_tests(BOUNDED[1]))
    assert all(f'name="{test}"' in junit or test in junit for test in wanted)
    one = cases[wanted[0]]
    assert rerun_command(run, one).endswith(f"--case {SUITE}/{RUNNER}/{wanted[0]}")
    assert written == []  # nothing written into the source tree, by pytest or its xdist workers


@pytest.mark.slow  # a run of its own (about 90 s); the bounded run checks the line itself
@needs_tree
def test_rerun_line_selects_exactly_that_upstream_test(tmp_path: Path) -> None:
    test = module_tests(BOUNDED[0])[1]
    # as the re-run line has it: no suite named, the case id alone
    done = e2b_bench("run", "--results-dir", str(tmp_path), "--case", f"{SUITE}/{RUNNER}/{test}", timeout=900)
    run = read_run(only_run_dir(tmp_path))

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [(case.case, case.outcome) for case in run.cases if case.suite == SUITE] == [(test, "pass")]
    assert run.cases[0].details["upstream"] == test


@pytest.mark.slow
@needs_tree
def test_whole_suite_against_the_embedded_endpoint(tmp_path: Path) -> None:
    """Every upstream test is a case; none fails but those declared (docs/suites.md's list)."""
    assert SDK is not None
    done = upstream_run(tmp_path, "*", timeout=3600)
    run = read_run(only_run_dir(tmp_path))
    cases = {case.case: case for case in run.cases if case.suite == SUITE}
    off = not_passing_here()

    assert sorted(cases) == sorted(python_tests(SDK))
    assert [t for t, case in cases.items() if not case.conformant] == [], done.stdout[-3000:]
    assert {t for t, case in cases.items() if case.outcome != "pass" and case.outcome != "skip"} <= set(off)
    assert done.returncode == 0


def js_file_tests(file: str) -> list[str]:
    assert JS_SDK is not None
    return [test for test in js_tests(JS_SDK) if test.split(" > ", 1)[0] == file]


def names(step: str) -> re.Pattern[str]:
    """What a listed step names, as vitest reports a test's name (`describe > title`): placeholders match anything."""
    title = step.split(" > ", 1)[1]
    parts, last = [], 0
    for found in PLACEHOLDER.finditer(title):
        parts += [re.escape(title[last : found.start()]), "%" if found[0] == "%%" else ".*?"]
        last = found.end()
    return re.compile("".join([*parts, re.escape(title[last:])]), re.DOTALL)


def test_js_titles_are_read_from_the_syntax() -> None:
    source = """
    // test('commented out', () => {})
    import { test, describe } from 'vitest'
    describe('outer', () => {
      sandboxTest.override({ sandboxOpts: {} })
      test.skipIf(isDebug)("a \\"quoted\\" title", async () => { const s = 'test("not a test")' })
      describe.each([1, 2])('inner %s', (n) => {
        it(`runs ${n}`, () => {})
      })
      beforeEach(() => {})
    })
    test.for(['a', 'b'])('after %s', () => {})
    /* test('in a comment', () => {}) */
    """

    assert vitest_titles(source) == [
        ("outer", 'a "quoted" title'),
        ("outer", "inner %s", "runs ${n}"),
        ("after %s",),
    ]


@needs_js_tree
def test_js_listing_is_what_vitest_collects() -> None:
    """Each test vitest collects from the bounded files (and one with `.for` titles, a newline in one) is named
    by exactly one listed step, and every listed step names one at least (vitest `list` in the runner's own
    environment with the project's configuration)."""
    assert JS_SDK is not None
    spec = available_runners()[JS_RUNNER].spec
    packages = ensure_node_env(project_of(spec)) / "node_modules"
    files = [*JS_BOUNDED, "tests/sandbox/networkTransform.test.ts"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "NODE_PATH": str(packages)}
    with tempfile.TemporaryDirectory() as scratch:
        listing = Path(scratch) / "list.json"
        done = subprocess.run(
            [str(find_node()), str(packages / "vitest" / "vitest.mjs"), "list", f"--json={listing}",
             "--config", str(REPO / "sandboxes" / "upstream" / "js" / "vitest.config.mjs"), *files],
            cwd=JS_SDK,
            env={**env, "E2B_BENCH_UPSTREAM_JS_SDK": str(JS_SDK), "E2B_BENCH_VITE_CACHE": f"{scratch}/vite"},
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        collected = json.loads(listing.read_text()) if listing.is_file() else []

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for file in files:
        steps = js_file_tests(file)
        reported = [entry["name"] for entry in collected if Path(entry["file"]) == JS_SDK / file]
        assert steps and reported, file
        for name in reported:
            assert len([step for step in steps if names(step).fullmatch(name)]) == 1, (file, name)
        for step in steps:
            assert any(names(step).fullmatch(name) for name in reported), step


@needs_js_tree
def test_js_needs_entries_cover_some_test() -> None:
    assert JS_SDK is not None
    tests = js_tests(JS_SDK)
    for need in needs_of(load_manifest()[SUITE][JS_RUNNER]):
        for pattern in need.tests:
            assert any(need.covers(test) for test in tests), pattern


@needs_js_tree
def test_js_bounded_run_records_each_vitest_test_of_the_files_as_a_case(tmp_path: Path) -> None:
    assert JS_SDK is not None
    before = sorted(p.relative_to(JS_SDK) for p in JS_SDK.rglob("*"))
    cases_args = [arg for file in JS_BOUNDED for arg in ("--case", f"{SUITE}/{JS_RUNNER}/{file} > *")]
    args = ("--runner", JS_RUNNER, "--results-dir", str(tmp_path), "--no-report", *cases_args)
    done = e2b_bench("run", SUITE, *args, timeout=1800)
    run = read_run(only_run_dir(tmp_path))
    cases = {case.case: case for case in run.cases if case.suite == SUITE}
    wanted = [test for file in JS_BOUNDED for test in js_file_tests(file)]
    wire = [json.loads(line) for line in (run.path / "wire" / f"{JS_RUNNER}.jsonl").read_text().splitlines()]

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(cases) == sorted(wanted)
    assert all(cases[t].outcome == "pass" and cases[t].conformant for t in wanted), [
        (t, cases[t].outcome, cases[t].error) for t in wanted if cases[t].outcome != "pass"
    ]
    templated = next(t for t in wanted if "${runtime}" in t)  # one case for each test its title names
    assert len(cases[templated].details["items"]) >= 2
    assert all(outcome == "pass" for outcome in cases[templated].details["items"].values())
    creates = [line for line in wire if line["method"] == "POST" and line["url"].split("?")[0].endswith("/sandboxes")]
    assert len(creates) >= len(js_file_tests(JS_BOUNDED[0])) // 2  # the sandbox tests reached the endpoint
    assert shlex.split(rerun_command(run, cases[wanted[0]]))[-2:] == ["--case", f"{SUITE}/{JS_RUNNER}/{wanted[0]}"]
    assert sorted(p.relative_to(JS_SDK) for p in JS_SDK.rglob("*")) == before  # nothing written into the tree


@pytest.mark.slow
@needs_js_tree
def test_js_rerun_line_selects_exactly_that_vitest_test(tmp_path: Path) -> None:
    test = js_file_tests(JS_BOUNDED[2])[1]
    done = e2b_bench("run", "--results-dir", str(tmp_path), "--case", f"{SUITE}/{JS_RUNNER}/{test}", timeout=900)
    run = read_run(only_run_dir(tmp_path))

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [(case.case, case.outcome) for case in run.cases if case.suite == SUITE] == [(test, "pass")]
    assert run.cases[0].details["upstream"] == test


@pytest.mark.slow
@needs_js_tree
def test_whole_js_suite_against_the_embedded_endpoint(tmp_path: Path) -> None:
    """Every vitest test is a case; none fails but those declared (docs/suites.md's list)."""
    assert JS_SDK is not None
    done = e2b_bench(
        "run", SUITE, "--runner", JS_RUNNER, "--results-dir", str(tmp_path), "--case", f"{SUITE}/{JS_RUNNER}/*",
        timeout=3600,
    )  # fmt: skip
    run = read_run(only_run_dir(tmp_path))
    cases = {case.case: case for case in run.cases if case.suite == SUITE}

    assert sorted(cases) == sorted(js_tests(JS_SDK))
    assert [(t, case.error) for t, case in cases.items() if not case.conformant] == [], done.stdout[-3000:]
    assert done.returncode == 0
