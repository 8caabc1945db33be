"""Sharded runs: the partition (property-tested), `run --shard K/N` end to end, and `merge` of the shards."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from run_cli import e2b_bench, only_run_dir

from bench.redaction import Redactor
from bench.results import CaseRecord, RunDir, case_id, make_header, read_run
from bench.shards import Shard, ShardError, merge, partition, selection_digest

# --- the partition -------------------------------------------------------------------------------

group_names = st.sampled_from([f"suite{s}/runner{r}" for s in range(4) for r in range(6)])
case_groups = st.lists(group_names, min_size=0, max_size=120)


@given(case_groups, st.integers(min_value=1, max_value=9))
def test_every_case_is_in_exactly_one_shard_and_a_group_never_spans_two(groups: list[str], total: int) -> None:
    owners = partition(groups, total)

    assert len(owners) == len(groups)
    assert all(1 <= owner <= total for owner in owners)
    for group in set(groups):
        assert len({owner for owner, g in zip(owners, groups, strict=True) if g == group}) == 1


@given(case_groups, st.integers(min_value=1, max_value=9), st.randoms(use_true_random=False))
def test_the_partition_depends_on_the_cases_not_their_order(groups: list[str], total: int, rng: random.Random) -> None:
    shuffled = list(range(len(groups)))
    rng.shuffle(shuffled)

    owners = partition(groups, total)
    owners_shuffled = partition([groups[i] for i in shuffled], total)

    assert [owners_shuffled[shuffled.index(i)] for i in range(len(groups))] == owners


@given(case_groups, st.integers(min_value=1, max_value=9))
def test_shards_differ_in_size_by_at_most_the_largest_group(groups: list[str], total: int) -> None:
    owners = partition(groups, total)

    sizes = [owners.count(shard) for shard in range(1, total + 1)]
    largest = max((groups.count(g) for g in set(groups)), default=0)
    assert max(sizes) - min(sizes) <= largest


def test_groups_are_dealt_largest_first_to_the_emptiest_shard() -> None:
    groups = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"]

    assert partition(groups, 2) == [1] * 5 + [2] * 3 + [2] * 3 + [1]


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "a/b", "2", "1/2/3"])
def test_a_shard_spec_that_is_not_k_of_n_is_refused(text: str) -> None:
    with pytest.raises(ShardError, match="--shard"):
        Shard.parse(text)


# --- merge ---------------------------------------------------------------------------------------


def endpoint_info(name: str) -> dict[str, str | None]:
    return {"name": name, "kind": "local", "api_url": "http://127.0.0.1:1", "sandbox_url": "", "key_env": None}


def make_shard(
    root: Path, index: int, total: int, cases: list[str], selection: list[str], finish: bool = True, endpoint="local"
) -> Path:
    """A shard's run directory as `run --shard` writes it, with every case passing."""
    argv = ["e2b-bench", "run", "--shard", f"{index}/{total}"]
    header = make_header(endpoint_info(endpoint), {"py-e2b-2.63.0": {"e2b": "2.63.0"}}, argv)
    header["shard"] = {
        "index": index,
        "total": total,
        "cases": len(cases),
        "selection": selection_digest(selection),
        "selected": len(selection),
    }
    run = RunDir.create(root, "quickstart", endpoint, header, Redactor())
    for identifier in cases:
        suite, runner, case = identifier.split("/")
        run.record(CaseRecord(identifier, suite, runner, case, "pass", "pass", True, 1.0))
    run.record(CaseRecord(case_id("housekeeping", "harness", "leak_check"), "housekeeping", "harness", "leak_check",
                          "pass", "pass", True, 1.0, details={"survivors": []}))  # fmt: skip
    if finish:
        run.finish("completed", 0)
    return run.path


SELECTION = [f"quickstart/{runner}/step{i}" for runner in ("py", "js", "go") for i in range(3)]
SHARDS = {1: SELECTION[:3], 2: SELECTION[3:6], 3: SELECTION[6:]}


def merged_cases(path: Path) -> dict[str, CaseRecord]:
    return {case.id: case for case in read_run(path).cases}


def test_merge_joins_every_shard_into_one_run_with_one_junit(tmp_path: Path) -> None:
    shards = [make_shard(tmp_path / "in", i, 3, cases, SELECTION) for i, cases in SHARDS.items()]

    result = merge(shards, tmp_path / "out", report=False)

    cases = merged_cases(result.path)
    assert result.exit_code == 0 and result.problems == []
    assert set(cases) == {
        *SELECTION,
        "housekeeping/harness/leak_check",
        *(f"shards/harness/shard_{i}_of_3" for i in (1, 2, 3)),
    }
    assert all(case.conformant for case in cases.values())
    run = read_run(result.path)
    assert run.footer is not None and run.footer["status"] == "completed"
    assert run.header["shard"]["merged"] == [read_run(path).run_id for path in shards]
    junit = (result.path / "junit.xml").read_text()
    assert junit.count("<testcase ") == len(cases)


def test_merge_says_which_shard_is_missing_and_fails(tmp_path: Path) -> None:
    shards = [make_shard(tmp_path / "in", i, 3, SHARDS[i], SELECTION) for i in (1, 3)]

    result = merge(shards, tmp_path / "out", report=False)

    assert result.exit_code == 1
    assert result.problems == ["missing shard 2/3: no run directory of it was given"]
    missing = merged_cases(result.path)["shards/harness/shard_2_of_3"]
    assert (missing.outcome, missing.conformant) == ("error", False)
    # The shards given all finished: the run is complete and fails on the missing shard's case, not interrupted.
    assert read_run(result.path).footer["status"] == "completed"  # type: ignore[index]


def test_merge_flags_a_shard_cut_short(tmp_path: Path) -> None:
    shards = [
        make_shard(tmp_path / "in", 1, 3, SHARDS[1], SELECTION),
        make_shard(tmp_path / "in", 2, 3, SHARDS[2], SELECTION, finish=False),
        make_shard(tmp_path / "in", 3, 3, SHARDS[3], SELECTION),
    ]
    run_json = shards[0] / "run.json"  # shard 1 finished, but with a case less than it planned
    document = json.loads(run_json.read_text())
    document["header"]["shard"]["cases"] = 4
    run_json.write_text(json.dumps(document))

    result = merge(shards, tmp_path / "out", report=False)

    assert result.exit_code == 1
    assert result.problems == [
        "shard 1/3 is truncated: 3 of 4 cases recorded (completed)",
        "shard 2/3 is truncated: run.json has no footer (3 of 3 cases)",
    ]


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        ({"selection": SELECTION[:-1]}, "selection"),
        ({"endpoint": "staging"}, "endpoint"),
        ({"total": 4}, "total"),
    ],
)
def test_merge_refuses_shards_of_different_runs_and_writes_nothing(tmp_path: Path, change: dict, differs: str) -> None:
    first = make_shard(tmp_path / "in", 1, 3, SHARDS[1], SELECTION)
    options = {"selection": SELECTION, "endpoint": "local", "total": 3, **change}
    total, selection, endpoint = options["total"], options["selection"], options["endpoint"]
    other = make_shard(tmp_path / "in", 2, total, SHARDS[2], selection, endpoint=endpoint)

    with pytest.raises(ShardError, match=f"not a shard of the same run .* differ in {differs}"):
        merge([first, other], tmp_path / "out", report=False)
    assert not (tmp_path / "out").exists()


def test_merge_refuses_the_same_shard_twice_and_a_run_that_is_no_shard(tmp_path: Path) -> None:
    one = make_shard(tmp_path / "a", 1, 2, SHARDS[1], SELECTION)
    again = make_shard(tmp_path / "b", 1, 2, SHARDS[1], SELECTION)
    with pytest.raises(ShardError, match="shard 1/2 given twice"):
        merge([one, again], tmp_path / "out", report=False)
    header = make_header(endpoint_info("local"), {}, [])
    plain = RunDir.create(tmp_path / "c", "quickstart", "local", header, Redactor())
    plain.finish("completed", 0)
    with pytest.raises(ShardError, match="not a shard"):
        merge([one, plain.path], tmp_path / "out", report=False)


# --- end to end ----------------------------------------------------------------------------------

SELECTED = "py01 or py02 or ts01 or ts02"


def test_two_shards_of_a_run_hold_its_cases_once_each_and_merge_into_one_report(
    tmp_path: Path, served: dict[str, str]
) -> None:
    shard_dirs = []
    for index in (1, 2):
        results = tmp_path / f"shard-{index}"
        done = e2b_bench(
            *("run", "sandboxes/e2b/test_quickstart.py", "--shard", f"{index}/2", "--results-dir", str(results)),
            *("--no-report", "-k", SELECTED),
            env=served,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        shard_dirs.append(only_run_dir(results))

    runs = [read_run(path) for path in shard_dirs]
    runners = [{c.runner for c in run.cases if c.suite == "quickstart"} for run in runs]
    assert sorted(map(sorted, runners)) == [["js-e2b-2.51.0"], ["py-e2b-2.63.0"]]  # one runner per shard
    ids = [c.id for run in runs for c in run.cases if c.suite == "quickstart"]
    assert len(ids) == len(set(ids)) == runs[0].header["shard"]["selected"] == 4
    assert [run.header["shard"]["index"] for run in runs] == [1, 2]

    done = e2b_bench("merge", *map(str, shard_dirs), "--results-dir", str(tmp_path / "merged"))

    assert done.returncode == 0, done.stderr
    merged = read_run(only_run_dir(tmp_path / "merged"))
    assert {c.id for c in merged.cases if c.suite == "quickstart"} == set(ids)
    assert (merged.path / "report.html").is_file() and (merged.path / "junit.xml").is_file()
    assert sorted(p.name for p in (merged.path / "wire").iterdir()) == ["js-e2b-2.51.0.jsonl", "py-e2b-2.63.0.jsonl"]


def test_a_shard_dealt_no_case_records_an_empty_valid_shard_and_the_merge_is_green(
    tmp_path: Path, served: dict[str, str]
) -> None:
    # one runner's cases over two shards: shard 2 gets none (whole runners go to one shard), as the sharded recipe
    # narrowed to one suite gets whenever it has more shards than runners
    case = "quickstart/py-e2b-2.63.0/py01_create"
    shard_dirs, verdicts = [], []
    for index in (1, 2):
        results = tmp_path / f"shard-{index}"
        done = e2b_bench("run", "--case", case, "--shard", f"{index}/2", "--results-dir", str(results), env=served)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        shard_dirs.append(only_run_dir(results))
        verdicts.append(done.stdout.strip().splitlines()[-1])

    empty = read_run(shard_dirs[1])
    assert empty.header["shard"] == {**empty.header["shard"], "index": 2, "total": 2, "cases": 0, "selected": 1}
    assert (empty.status, empty.footer["exit_code"], empty.cases) == ("completed", 0, [])
    assert verdicts[1].startswith("CONFORMANT: 0 cases: shard 2/2 was dealt none of the 1 selected")
    assert verdicts[0].startswith("CONFORMANT: 2 cases; gate passed")  # the case and the leak check

    done = e2b_bench("merge", *map(str, shard_dirs), "--results-dir", str(tmp_path / "merged"))

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    merged = read_run(only_run_dir(tmp_path / "merged"))
    assert {c.id: c.outcome for c in merged.cases if c.suite in ("quickstart", "shards")} == {
        case: "pass",
        "shards/harness/shard_1_of_2": "pass",
        "shards/harness/shard_2_of_2": "pass",
    }


def test_a_shard_spec_that_is_not_k_of_n_ends_the_run_with_a_usage_error(tmp_path: Path) -> None:
    done = e2b_bench("run", "sandboxes/e2b/test_quickstart.py", "--shard", "3/2", "--results-dir", str(tmp_path))

    assert done.returncode == 2  # a configuration mistake: one sentence, nothing ran
    assert done.stderr.startswith("e2b-bench run: --shard 3/2: K must be between 1 and N")
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
