"""Runners as data: each runner.toml folder is discovered, named by its pins, and chosen by default when newest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.runners.catalog import default_runners
from bench.runners.discovery import discover, specs_of
from bench.runners.envs import RunnerEnvError, RunnerSpec


def test_every_runner_folder_of_the_checkout_is_discovered_sdk_runners_newest_first_then_by_name() -> None:
    assert [spec.name for spec in discover()] == [
        "py-e2b-2.63.0",
        "py-e2b-2.45.1",
        "py-e2b-2.31.0",
        "js-e2b-2.51.0",
        "js-e2b-2.50.0",
        "adk-2.13.0",
        "ag2-1.2.1",
        "agno-3.1.10",
        "crewai-1.15.30",
        "deepagents-0.6.12",
        "openai-agents-0.24.0",
        "py-code-interpreter-2.11.5",
        "py-upstream",
        "pydantic-ai-harness-0.62.0",
        "smolagents-1.26.0",
        "js-code-interpreter-2.8.0",
        "js-upstream",
        "mastra-0.8.0",
        "tanstack-ai-0.58.0",
    ]


def test_the_default_is_the_newest_sdk_pin_of_each_language_and_every_framework() -> None:
    assert [runner.name for runner in default_runners()] == [
        "py-e2b-2.63.0",
        "js-e2b-2.51.0",
        "adk-2.13.0",
        "ag2-1.2.1",
        "agno-3.1.10",
        "crewai-1.15.30",
        "deepagents-0.6.12",
        "openai-agents-0.24.0",
        "py-code-interpreter-2.11.5",
        "py-upstream",
        "pydantic-ai-harness-0.62.0",
        "smolagents-1.26.0",
        "js-code-interpreter-2.8.0",
        "js-upstream",
        "mastra-0.8.0",
        "tanstack-ai-0.58.0",
    ]


def test_a_new_framework_folder_is_one_runner_toml_beside_its_lock(tmp_path: Path) -> None:
    folder = tmp_path / "frameworks" / "smolagents"
    folder.mkdir(parents=True)
    (folder / "requirements.txt").write_text("smolagents==1.9.0\n    # via -r requirements.in\ne2b==2.63.0\n")
    (folder / "runner.toml").write_text(
        'language = "python"\nentry = "runner.py"\nprefix = "smolagents"\nfamily = "smolagents"\n'
        'project = true\npinned = ["smolagents", "e2b"]\n'
    )

    assert specs_of(folder / "runner.toml", root=tmp_path) == [
        RunnerSpec(
            name="smolagents-1.9.0",
            language="python",
            pins={"smolagents": "1.9.0", "e2b": "2.63.0"},
            entry="frameworks/smolagents/runner.py",
            family="smolagents",
            project="frameworks/smolagents",
        )
    ]


def test_a_list_of_pin_sets_is_one_runner_each_sharing_an_entry_script_of_another_folder(tmp_path: Path) -> None:
    folder = tmp_path / "sandboxes" / "e2b" / "go"
    folder.mkdir(parents=True)
    (folder / "runner.toml").write_text(
        'language = "python"\nentry = "../python/runner.py"\nprefix = "py-e2b"\n'
        'pins = [{e2b = "2.1.0"}, {e2b = "2.0.0"}]\n'
    )

    specs = specs_of(folder / "runner.toml", root=tmp_path)

    assert [(spec.name, dict(spec.pins), spec.entry, spec.project) for spec in specs] == [
        ("py-e2b-2.1.0", {"e2b": "2.1.0"}, "sandboxes/e2b/python/runner.py", None),
        ("py-e2b-2.0.0", {"e2b": "2.0.0"}, "sandboxes/e2b/python/runner.py", None),
    ]


def test_a_node_project_that_does_not_pin_exactly_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "package.json").write_text(json.dumps({"dependencies": {"e2b": "^2.51.0"}}))
    (tmp_path / "runner.toml").write_text(
        'language = "js"\nentry = "r.mjs"\nprefix = "js-e2b"\nproject = true\npinned = ["e2b"]\n'
    )

    with pytest.raises(RunnerEnvError, match="does not pin e2b to an exact version"):
        specs_of(tmp_path / "runner.toml", root=tmp_path)
