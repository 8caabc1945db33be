"""`e2b-bench range`: one run per release of a package against the endpoint, as the validated range an endpoint
publishes. Against an endpoint that lacks the create route later `e2b` releases use, the releases that pass are
exactly those whose runs never sent it, and the cause spans the releases that did (three releases, one case)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.run_cli import e2b_bench
from tests.test_bisect import QUIRK, creates


def test_range_tells_which_releases_pass_and_the_span_of_each_cause(tmp_path: Path) -> None:
    done = e2b_bench(
        "range", "--package", "e2b", "--from", "2.50.0", "--to", "2.52.0", "--case", "quickstart/*/py01_create",
        "--quirk", QUIRK, "--results-dir", str(tmp_path), timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (directory,) = [p for p in tmp_path.iterdir() if p.name.endswith("-range-e2b")]
    document = json.loads((directory / "range.json").read_text())
    releases = document["releases"]
    assert [row["version"] for row in releases] == ["2.50.0", "2.51.0", "2.52.0"]  # each minor's newest patch
    sent = {row["version"]: {path for path, _ in creates(Path(row["run_dir"]))} for row in releases}
    for row in releases:
        assert row["cases"] == 1
        assert row["status"] == ("fail" if "/v2/sandboxes" in sent[row["version"]] else "pass"), (row, sent)
    failing = [row["version"] for row in releases if row["status"] == "fail"]
    assert failing and len(failing) < len(releases)
    (span,) = document["causes"]
    assert (span["first"], span["last"], span["releases"]) == (failing[0], failing[-1], len(failing))
    assert "no route POST" in span["signature"]

    table = (directory / "range.md").read_text()
    passing = [row["version"] for row in releases if row["status"] == "pass"]
    assert f"Compatible: {', '.join(passing)}." in table
    assert f"| {failing[0]} | fail | 1 | 1 |" in table
    assert table.strip() in done.stdout
