"""The command line: every configuration mistake is one sentence and exit 2; pytest's selection flags
work wherever they are given; `--help` documents flags, exit codes and environment variables."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.results import read_run

RUNNER = "py-e2b-2.63.0"
MODEL = "http://127.0.0.1:9/v1"  # nothing listens on loopback port 9
ENV = {"E2B_API_KEY": "e2b_" + "0" * 40, "E2B_API_URL": "http://127.0.0.1:9", "E2B_SANDBOX_URL": "http://127.0.0.1:9"}

MISTAKES = {
    "unknown endpoint": (["run", "--endpoint", "nowhere"], "unknown endpoint 'nowhere'", "define [endpoints.nowhere]"),
    "unknown runner": (["run", "--runner", "py-e2b-0.0.1"], "unknown runner 'py-e2b-0.0.1'", "e2b-bench runners"),
    "unknown suite": (["run", "quickstrat"], "unknown suite 'quickstrat'", "or a path to a suite module"),
    "unknown profile": (["run", "--profile", "b4os"], "unknown profile 'b4os'", "known: b3os-beta, e2b"),
    "unknown quirk": (["run", "--quirk", "no_such_quirk"], "unknown quirk 'no_such_quirk'", "cwd_override, "),
    "missing expectations": (["run", "--expectations", "absent.toml"], "No such file", "--expectations"),
    "unwritable results dir": (["run", "--results-dir", "/proc/version/x"], "/proc/version/x", "--results-dir"),
    "negative step timeout": (["run", "--step-timeout", "-1"], "--step-timeout must be positive", "not -1"),
    "zero attempts": (["run", "--attempts", "0"], "--attempts must be positive", "not 0"),
    "model name without a model": (["run", "--model", "m"], "--model applies to a real model only", "--model-base-url"),
    "empty model name, no model": (["run", "--model", ""], "--model applies to a real model only", "drop --model"),
    "empty model name": (["run", "--model-base-url", MODEL, "--model", ""], "--model is empty", "name the model"),
    "unset model key variable": (
        ["run", "--model-base-url", MODEL, "--model", "m", "--model-key-env", "E2B_BENCH_TEST_NO_SUCH_KEY"],
        "E2B_BENCH_TEST_NO_SUCH_KEY named by --model-key-env is not set",
        "export it",
    ),
    "unreachable model": (["run", "--model-base-url", MODEL, "--model", "m"], "is unreachable", "check the URL"),
    "profile off the embedded endpoint": (
        ["run", "--endpoint", "env", "--profile", "b3os-beta"],
        "apply only to the embedded endpoint",
        "choose --endpoint local",
    ),
    "bench: unknown runner": (["bench", "--runner", "nope"], "unknown runner 'nope'", "e2b-bench runners"),
    "bench: bad modes": (["bench", "--modes", "sideways"], "--modes takes a comma-separated list", "'sideways'"),
}


@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_a_configuration_mistake_is_one_sentence_with_the_fix_and_exit_2(mistake: str, tmp_path: Path) -> None:
    args, problem, fix = MISTAKES[mistake]
    results = [] if "--results-dir" in args else ["--results-dir", str(tmp_path)]

    done = e2b_bench(*args, *results, env=ENV)

    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"e2b-bench {args[0]}: ")
    assert problem in lines[0] and fix in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.parametrize("order", ["before", "after"])
def test_k_selects_the_same_case_before_or_after_the_suite_name(
    order: str, tmp_path: Path, served: dict[str, str]
) -> None:
    selection = ["-k", "py03", "quickstart"] if order == "before" else ["quickstart", "-k", "py03"]

    done = e2b_bench("run", *selection, "--runner", RUNNER, "--results-dir", str(tmp_path), "--no-report", env=served)

    assert done.returncode == 0, done.stdout[-2000:]
    run = read_run(only_run_dir(tmp_path))
    assert [case.case for case in run.cases if case.suite == "quickstart"] == ["py03_run_nonzero_exit_raises"]


def test_a_selection_that_matches_nothing_says_so_and_exits_5(tmp_path: Path) -> None:
    done = e2b_bench("run", "quickstart", "-k", "no_such_case", "--runner", RUNNER, "--results-dir", str(tmp_path))

    assert done.returncode == 5
    assert "e2b-bench run: no case matched the selection" in done.stderr


def test_help_lists_every_flag_with_its_default_the_exit_codes_and_the_environment() -> None:
    done = e2b_bench("run", "--help")

    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for flag in ("--endpoint", "--runner", "--results-dir", "--step-timeout", "--profile", "--model-base-url",
                 "--model", "--model-key-env", "--attempts", "-k", "-m", "-x"):  # fmt: skip
        assert re.search(rf"(^|\s){re.escape(flag)}[ ,]", text), flag
    assert "(default: 90.0)" in text and "(default: 2)" in text
    assert "130 interrupted by Ctrl-C (SIGINT)" in text and "143 interrupted by SIGTERM" in text
    assert "2 configuration, environment or endpoint" in text
    assert "E2B_BENCH_ENDPOINT" in text and "E2B_API_KEY" in text


def test_help_says_each_default_once_and_none_that_is_not_one() -> None:
    from bench.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        text = " ".join(command.format_help().split())
        for empty in ("(default: None)", "(default: False)", "(default: [])", "(default: ==SUPPRESS==)"):
            assert empty not in text, (name, empty)
        for action in command._actions:
            said = re.findall(
                r"(?<!%\()default", command._get_formatter()._get_help_string(action) or "", re.IGNORECASE
            )
            assert len(said) <= 1, (name, action.option_strings, action.help)
    run_help = " ".join(commands.choices["run"].format_help().split())
    assert "(default: the endpoint's) (default:" not in run_help and "(default: local)" in run_help


def test_every_output_defaults_under_the_results_directory() -> None:
    from bench.cli import build_parser
    from bench.paths import RESULTS_DIR

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        for action in command._actions:
            if isinstance(action.default, Path) and action.dest in ("out", "results_dir"):
                assert action.default.is_relative_to(RESULTS_DIR), (name, action.dest, action.default)
    assert commands.choices["report"].get_default("out") == RESULTS_DIR / "reports"
