"""`e2b-bench bisect`: against an embedded endpoint that lacks the create route later SDK releases use
(`missing_route=POST /v2/sandboxes`, a 404), it names the first `e2b` release that sends it. The oracle is the wire:
the first bad release's run sent `POST /v2/sandboxes` and met the 404, the last good one's never sent it. A small
range of releases keeps it to four runs (each runner environment built once and cached); a --good that fails is
refused before any search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.results import read_run
from tests.run_cli import e2b_bench

QUIRK = "missing_route=POST /v2/sandboxes"
CASE = "quickstart/py-e2b-*/py01_create"
GOOD, BAD = "2.49.1", "2.52.0"


def creates(run_dir: Path) -> list[tuple[str, int]]:
    """The creates the run's runner sent: (path, status)."""
    found = []
    for log in (run_dir / "wire").glob("*.jsonl"):
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            path = "/" + str(entry["url"]).split("://", 1)[1].split("/", 1)[1]
            if entry["method"] == "POST" and path in ("/sandboxes", "/v2/sandboxes"):
                found.append((path, entry["status"]))
    return found


@pytest.fixture(scope="module")
def bisected(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Path]:
    results = tmp_path_factory.mktemp("bisect")
    done = e2b_bench(
        "bisect", "--case", CASE, "--package", "e2b", "--good", GOOD, "--bad", BAD, "--quirk", QUIRK,
        "--results-dir", str(results), timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (directory,) = [p for p in results.iterdir() if p.name.endswith("-bisect-e2b")]
    return done.stdout, json.loads((directory / "bisect.json").read_text()), directory


def test_bisect_names_the_first_release_that_sends_the_route_the_endpoint_lacks(bisected) -> None:
    stdout, document, _ = bisected
    first, last = document["first_bad"], document["last_good"]
    assert f"first bad e2b {first} (last good {last})" in stdout.splitlines()
    tried = {t["version"]: t for t in document["tried"]}
    assert tried[GOOD]["outcome"] == "good" and tried[BAD]["outcome"] == "bad"  # both ends verified
    key = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731
    for version, entry in tried.items():  # every verdict on the right side of the boundary
        assert entry["outcome"] == ("bad" if key(version) >= key(first) else "good"), entry

    bad_run, good_run = Path(tried[first]["run_dir"]), Path(tried[last]["run_dir"])
    assert read_run(bad_run).header["pins"][tried[first]["runner"]]["e2b"] == first
    assert read_run(good_run).header["pins"][tried[last]["runner"]]["e2b"] == last
    assert ("/v2/sandboxes", 404) in creates(bad_run)
    assert creates(good_run) and all(path == "/sandboxes" for path, _ in creates(good_run))
    # the two are neighbours among the registry's releases: no release between them was left untried
    assert key(last) < key(first)
    assert "404: no route POST /v2/sandboxes" in tried[first]["message"]


def test_bisect_prints_both_outcomes_and_a_block_to_paste(bisected) -> None:
    stdout, document, directory = bisected
    lines = stdout.splitlines()
    verdict = lines.index(f"first bad e2b {document['first_bad']} (last good {document['last_good']})")
    assert lines[verdict + 1].strip() == f"last good {document['last_good']}: pass"
    assert lines[verdict + 2].strip().startswith(f"first bad {document['first_bad']}: fail: ")
    block = lines[lines.index("```") + 1 : len(lines) - 1 - lines[::-1].index("```")]
    assert block[0].startswith(f"Regression in e2b {document['first_bad']}: {CASE}")
    assert any(line.startswith("reproduce: e2b-bench run --quirk") for line in block)
    assert f"bisect.json: {directory / 'bisect.json'}" in lines


def test_bisect_refuses_a_good_release_that_fails(tmp_path: Path, bisected) -> None:
    _, document, _ = bisected
    done = e2b_bench(
        "bisect", "--case", CASE, "--package", "e2b", "--good", document["first_bad"], "--bad", BAD,
        "--quirk", QUIRK, "--results-dir", str(tmp_path), timeout=900,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"e2b-bench bisect: --good {document['first_bad']} does not pass: fail")
