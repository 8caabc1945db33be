"""`e2b-bench bench`: statistics, bench.json, the count and wall-clock bounds, the report's charts."""

from __future__ import annotations

import io
import json
import re
import shutil
import statistics
import time
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from run_cli import e2b_bench, only_run_dir

from bench.benchdoc import BENCH_JSON, ms, pool_text
from bench.benchmark import (
    CELL_TEMPLATE,
    BenchOptions,
    _floor_target,
    _verdict,
    comparison_text,
    plan,
    read_bench,
    run_bench,
    select_runners,
    target_text,
)
from bench.housekeeping import tagged_sandboxes
from bench.localbox.registry import POOL_MAX
from bench.localbox.server import LocalEndpoint
from bench.remote.slowness import scaled
from bench.report import render
from bench.results import read_run, schema_errors
from bench.runners.protocol import make_task
from bench.stats import percentile, summarize, trim

RUNNERS = ("py-e2b-2.63.0", "js-e2b-2.51.0")


# --- statistics --------------------------------------------------------------------------------


def test_trim_drops_five_percent_from_each_end_of_twenty_samples() -> None:
    values = [float(v) for v in range(20, 0, -1)]  # 20..1, unsorted
    assert trim(values) == [float(v) for v in range(2, 20)]


def test_trim_keeps_everything_below_twenty_samples() -> None:
    assert trim([3.0, 1.0, 2.0]) == [1.0, 2.0, 3.0]


def test_percentile_is_the_nearest_rank() -> None:
    ordered = [float(v) for v in range(1, 11)]  # 1..10
    assert (percentile(ordered, 50), percentile(ordered, 95), percentile(ordered, 99)) == (5.0, 10.0, 10.0)
    assert percentile(ordered, 0) == 1.0
    assert percentile([float(v) for v in range(1, 101)], 95) == 95.0


def test_summary_of_twenty_samples_with_an_outlier_and_two_failures() -> None:
    values = [10.0] * 9 + [20.0] * 9 + [1.0, 1000.0]  # 20 successes: 1 and 1000 are trimmed
    summary = summarize(values, attempted=22)
    assert summary.trimmed == 1
    assert summary.median_ms == 15.0  # mean of the two middle values of 18
    assert (summary.p95_ms, summary.p99_ms) == (20.0, 20.0)
    assert summary.mean_ms == 15.0
    assert (summary.min_ms, summary.max_ms) == (1.0, 1000.0)  # untrimmed
    assert summary.success_rate == pytest.approx(20 / 22)


@pytest.mark.parametrize(("ratio", "text"), [(2.0, "50%"), (2.02, "49%"), (1.25, "80%"), (0.5, "200%")])
def test_a_transfer_share_is_rounded_down_so_it_never_contradicts_its_target(ratio: float, text: str) -> None:
    doc = {"ratio": ratio, "kind": "upload", "baseline": {"of": ["disk_copy"]}, "rate_mb_s": 400.0}

    assert comparison_text(doc) == f"{text} of disk_copy rate (400 MB/s)"


def test_summary_without_a_success_has_no_figures() -> None:
    summary = summarize([], attempted=3)
    assert summary.success_rate == 0.0
    assert summary.median_ms is None and summary.max_ms is None


# --- a real small run --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("bench-results")
    runners = [arg for name in RUNNERS for arg in ("--runner", name)]
    done = e2b_bench(
        "bench", "-n", "3", "--modes", "sequential,burst", "--transfer-mib", "1", "--results-dir", str(results),
        *runners, timeout=scaled(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (results / "table.txt").write_text(done.stdout)  # the terminal table, beside the run directory
    return only_run_dir(results)


def test_small_run_writes_a_valid_bench_json_with_every_sample(small_run: Path) -> None:
    document = read_bench(small_run)  # validates against bench.schema.json
    assert document is not None
    assert read_run(small_run).status == "completed"
    assert set(document["runners"]) == set(RUNNERS)
    for runner, entry in document["runners"].items():  # each plain HTTP reference right after its SDK twin
        assert list(entry["measures"]) == [
            "tti.sequential", "tti.burst", "tti.burst_on_demand", "tti_http.sequential", "run_true", "run_true_http",
            "upload", "upload_http", "upload_floor", "download", "download_http", "download_floor",
            *(("tti_snapshot", "tti_fork", "tti.code_interpreter") if runner.startswith("py-") else ()),  # Python's
        ]  # fmt: skip
    for entry in document["runners"].values():
        for measure in entry["measures"].values():
            assert [s["index"] for s in measure["samples"]] == list(range(3))
            assert all(s["ok"] for s in measure["samples"]), measure["samples"]
            assert measure["ratio"] is not None and measure["ratio"] > 0
    assert set(document["baselines"]) == {"spawn", "loopback_rtt", "disk_copy"}
    for name, count in (("spawn", 3), ("loopback_rtt", 3), ("disk_copy", 10)):  # measured before and after
        baseline = document["baselines"][name]
        assert len(baseline["samples"]) == 2 * count and baseline["stats"]["ok"] == 2 * count
        assert baseline["median_before_ms"] > 0 and baseline["median_after_ms"] > 0
    for entry in document["runners"].values():  # every ratio is to the baseline of both measurements
        for measure in entry["measures"].values():
            pooled = sum(document["baselines"][name]["stats"]["median_ms"] for name in measure["baseline"]["of"])
            assert measure["baseline"]["median_ms"] == pytest.approx(pooled)
            assert measure["ratio"] == pytest.approx(measure["stats"]["median_ms"] / pooled, abs=1e-3)
    assert document["cleanup"] == {"survivors": [], "error": None}
    for entry in document["runners"].values():  # the burst target is set for 100: a burst of 3 is not judged
        assert entry["measures"]["tti.burst"]["target"] is None
        assert entry["measures"]["tti.sequential"]["target"]["max_ratio"] == 10.0


def test_small_run_settles_the_embedded_endpoint_before_each_measure_and_counts_how_creates_were_served(
    small_run: Path,
) -> None:
    """Each measure began with the endpoint settled: its pool of 4 full, nothing prepared or torn down; the burst with
    its 3 more prepared and served from them, the on-demand burst with the usual pool alone (which a burst of 3
    fits in: served from it)."""
    document = read_bench(small_run)
    assert document is not None
    assert document["header"]["pool"] == {"size": 4, "burst": 3}
    table = (small_run.parent / "table.txt").read_text().splitlines()
    (pool_line,) = [line for line in table if line.startswith("pool: ")]
    assert pool_line == f"pool: {pool_text(document['header'])}"
    assert "kept 4 sandboxes prepared" in pool_line and "tti.burst began with 3 more prepared" in pool_line
    for runner, entry in document["runners"].items():
        measures = entry["measures"]
        assert all(m["settle"]["settled"] and m["settle"].get("error") is None for m in measures.values()), runner
        prepared = {measure_id: m["settle"]["prepared"] for measure_id, m in measures.items()}
        assert prepared == {**dict.fromkeys(measures, 4), "tti.burst": 7}
        assert measures["tti.burst"]["served"] == {"prepared": 3, "on_demand": 0}
        assert measures["tti.burst_on_demand"]["served"] == {"prepared": 3, "on_demand": 0}
        assert measures["tti.burst_on_demand"]["target"] is None  # no cloud target for sandboxes made on demand
        for measure_id in ("tti.sequential", "tti_http.sequential"):  # every create counted, one way or the other
            assert sum(measures[measure_id]["served"].values()) == 3
        if "tti.code_interpreter" in measures:  # each first cell answered by a server kept warm for it
            assert measures["tti.code_interpreter"]["served"] == {"prepared": 3, "on_demand": 0}
            assert set(measures["tti.code_interpreter"]["phases"]) == {"create_ms", "first_cell_ms", "kill_ms"}
        row = next(i for i, line in enumerate(table) if re.match(rf"{runner} +tti\.burst ", line))
        assert table[row + 1].endswith(" · 3 prepared, 0 on demand")


def test_small_run_has_the_plain_http_references_with_every_sample(small_run: Path) -> None:
    document = read_bench(small_run)
    assert document is not None
    clients = {"py-e2b-2.63.0": "httpx", "js-e2b-2.51.0": "node:http"}
    for runner, entry in document["runners"].items():
        for measure_id, twin_id, warmup in (
            ("tti_http.sequential", "tti.sequential", 0),
            ("run_true_http", "run_true", 2),
            ("upload_http", "upload", 1),
            ("download_http", "download", 1),
        ):
            measure, twin = entry["measures"][measure_id], entry["measures"][twin_id]
            assert (measure["planned"], measure["attempted"], measure["stats"]["ok"]) == (3, 3, 3), measure
            assert [s["ok"] for s in measure["samples"]] == [True] * 3
            assert (measure["client"], measure["warmup"], measure["error"]) == (clients[runner], warmup, None)
            assert measure["baseline"] == twin["baseline"] and measure["ratio"] > 0
            assert measure["target"] is None and twin["target"] is not None  # a reference is not judged
        transfers = [entry["measures"][m] for m in ("upload_http", "download_http")]
        assert [m["bytes"] for m in transfers] == [1 << 20] * 2 and all(m["rate_mb_s"] > 0 for m in transfers)
    cases = {(case.runner, case.case): case.outcome for case in read_run(small_run).cases}
    assert cases[("py-e2b-2.63.0", "run_true_http")] == cases[("js-e2b-2.51.0", "download_http")] == "pass"
    assert cases[("harness", "leak_check")] == "pass"  # the references' own sandboxes were killed too


def test_small_run_times_each_sdk_transfer_against_the_floor_server_too(small_run: Path) -> None:
    document = read_bench(small_run)
    assert document is not None
    for entry in document["runners"].values():
        for way in ("upload", "download"):
            floor, measure = entry["measures"][f"{way}_floor"], entry["measures"][way]
            assert (floor["attempted"], floor["stats"]["ok"], floor["error"]) == (3, 3, None), floor
            assert (floor["client"], floor["bytes"], floor["warmup"], floor["target"]) == ("Sandbox", 1 << 20, 1, None)
            if floor["ratio"] > 2.0:  # the SDK misses the disk target even against the floor: judged by its floor
                assert measure["target"]["max_floor_ratio"] == 1.5
                assert measure["target"]["met"] == (measure["stats"]["median_ms"] <= 1.5 * floor["stats"]["median_ms"])
            else:
                assert measure["target"]["max_ratio"] == 2.0


def test_small_run_takes_each_sdk_transfers_samples_in_turn_with_its_floors(small_run: Path) -> None:
    document = read_bench(small_run)
    assert document is not None
    for entry in document["runners"].values():
        for way in ("upload", "download"):
            floor, measure = entry["measures"][f"{way}_floor"], entry["measures"][way]
            assert (measure["alternated_with"], floor["alternated_with"]) == ([f"{way}_floor"], [way])
            sides = ((way, measure), ("floor", floor))
            turns = sorted((sample["start_ms"], name) for name, taken in sides for sample in taken["samples"])
            # one clock for both: floor first, then the SDK call; the next turn the other way round
            assert [name for _, name in turns] == ["floor", way, way, "floor", "floor", way]


def test_small_run_shows_the_phases_of_each_measure_in_bench_json_and_the_table(small_run: Path) -> None:
    document = read_bench(small_run)
    assert document is not None
    table = (small_run.parent / "table.txt").read_text().splitlines()
    for runner, entry in document["runners"].items():
        tti = entry["measures"]["tti.sequential"]
        medians = {
            part: statistics.median(s["parts"][part] for s in tti["samples"])
            for part in ("create_ms", "first_run_ms", "kill_ms")
        }
        assert tti["phases"] == pytest.approx(medians)
        download = entry["measures"]["download_http"]
        first_byte = statistics.median(s["parts"]["first_byte_ms"] for s in download["samples"])
        assert download["phases"] == pytest.approx({"first_byte_ms": first_byte})
        assert 0 < first_byte <= download["stats"]["max_ms"]
        assert entry["measures"]["upload"]["phases"] == {}  # the SDK's own call shows no parts
        served = tti["served"]  # how the embedded endpoint served its creates
        for measure_id, expected in (
            ("tti.sequential", f"p50 create {ms(medians['create_ms'])} ms · first command "
                               f"{ms(medians['first_run_ms'])} ms · kill {ms(medians['kill_ms'])} ms · "
                               f"{served['prepared']} prepared, {served['on_demand']} on demand"),
            ("download_http", f"p50 first byte {ms(first_byte)} ms · {download['rate_mb_s']:.0f} MB/s"),
        ):  # fmt: skip
            row = next(i for i, line in enumerate(table) if re.match(rf"{runner} +{re.escape(measure_id)} ", line))
            assert table[row + 1].strip() == expected
        upload_row = next(i for i, line in enumerate(table) if re.match(rf"{runner} +upload ", line))
        assert table[upload_row + 1].startswith(runner)  # no phases, no second line


def test_the_report_shows_each_measures_phases(small_run: Path, tmp_path: Path) -> None:
    document = read_bench(small_run)
    assert document is not None
    page = render([small_run], tmp_path / "out").html.read_text()
    tables = re.findall(r'<table class="bench-table" data-runner="([^"]+)">(.*?)</table>', page, re.S)
    assert [runner for runner, _ in tables] == list(RUNNERS)
    for runner, table in tables:
        phases = document["runners"][runner]["measures"]["tti.sequential"]["phases"]
        served = document["runners"][runner]["measures"]["tti.sequential"]["served"]
        cell = re.search(r'<tr data-measure="tti.sequential">.*?<td class="text phases">(.*?)</td>', table).group(1)
        assert cell == (
            f"create {ms(phases['create_ms'])} ms · first command {ms(phases['first_run_ms'])} ms · "
            f"kill {ms(phases['kill_ms'])} ms · {served['prepared']} prepared, {served['on_demand']} on demand"
        )
    assert f'<p class="muted pool">pool: {pool_text(document["header"])}</p>' in page


def floor_pair(median_ms: float, floor_median_ms: float, floor_ratio: float) -> tuple[dict, dict]:
    """A transfer's bench.json entry with the disk target, and its floor's."""
    measure = {"stats": {"median_ms": median_ms}, "target": {"text": "median <= 2x disk_copy", "max_ratio": 2.0,
                                                               "met": False}}  # fmt: skip
    return measure, {"stats": {"median_ms": floor_median_ms}, "ratio": floor_ratio}


@pytest.mark.parametrize(
    ("median_ms", "floor_median_ms", "floor_ratio", "target"),
    [
        (40.0, 10.0, 1.0, {"text": "median <= 2x disk_copy", "max_ratio": 2.0, "met": False}),  # the SDK can: kept
        (140.0, 100.0, 5.0, {"text": "median <= 1.5x upload_floor (the SDK's floor misses median <= 2x disk_copy)",
                             "max_floor_ratio": 1.5, "met": True}),
        (160.0, 100.0, 5.0, {"text": "median <= 1.5x upload_floor (the SDK's floor misses median <= 2x disk_copy)",
                             "max_floor_ratio": 1.5, "met": False}),
    ],
)  # fmt: skip
def test_a_transfer_is_judged_by_its_floor_only_where_the_sdk_misses_the_disk_target_there(
    median_ms: float, floor_median_ms: float, floor_ratio: float, target: dict
) -> None:
    assert _floor_target(*floor_pair(median_ms, floor_median_ms, floor_ratio), "upload_floor") == target


@pytest.mark.parametrize("runner_name", RUNNERS)
def test_the_embedded_endpoint_is_settled_before_each_measure_a_burst_with_its_count_prepared_or_the_usual_pool(
    runner_name: str,
) -> None:
    (runner,) = select_runners([runner_name])
    options = BenchOptions(modes=("sequential", "burst"))

    floor = "http://127.0.0.1:9"
    embedded, remote = plan(options, runner, 7, floor, settle_s=42.0), plan(options, runner, 7, floor)

    settles = {task["id"]: task["settle"] for task in embedded}
    if runner.language == "python":  # its 3 samples at most, each taking a sandbox kept warm
        assert settles.pop("tti.code_interpreter") == {"reserve": 0, "within_s": 42.0, "warm": {CELL_TEMPLATE: 3}}
    assert settles.pop("tti.burst") == {"reserve": 7, "within_s": 42.0}
    assert settles.pop("tti.burst_on_demand") == {"reserve": 0, "within_s": 42.0}  # the usual pool, told nothing
    assert settles and all(settle == {"reserve": 0, "within_s": 42.0} for settle in settles.values())  # the usual pool
    assert schema_errors("task", make_task("bench", runner_name, "r1", deadline_s=1, sandbox_timeout_s=1,
                                           measures=embedded)) == []  # fmt: skip
    alternates = {task["id"]: task["alternate"] for task in embedded if "alternate" in task}
    assert alternates == {"upload": "upload_floor", "download": "download_floor"}
    assert not any("alternate" in task for task in plan(options, runner, 7))  # no floor server: nothing to pair
    # Another endpoint: the same measures as before, nothing asked of a pool it does not have.
    assert [task["id"] for task in remote] == [task["id"] for task in embedded if task["id"] != "tti.burst_on_demand"]
    assert not any("settle" in task for task in remote)


def test_a_non_local_endpoint_needs_an_explicit_count(tmp_path: Path) -> None:
    env = {"E2B_API_KEY": "e2b_x", "E2B_API_URL": "http://127.0.0.1:9", "E2B_SANDBOX_URL": "http://127.0.0.1:9"}
    done = e2b_bench("bench", "--endpoint", "env", "--results-dir", str(tmp_path), env=env, timeout=180)
    assert done.returncode == 2
    assert "give the number of samples per measure with -n N" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--pool", "-1"], f"--pool takes a number of sandboxes from 0 to {POOL_MAX}, not -1"),
        (["--pool", "4", "--endpoint", "env", "-n", "3"], "--pool sizes the embedded endpoint's pool, and 'env' is"),
    ],
)
def test_a_pool_the_embedded_endpoint_cannot_have_is_refused_in_one_sentence(
    tmp_path: Path, args: list[str], error: str
) -> None:
    env = {"E2B_API_KEY": "e2b_x", "E2B_API_URL": "http://127.0.0.1:9", "E2B_SANDBOX_URL": "http://127.0.0.1:9"}
    done = e2b_bench("bench", *args, "--results-dir", str(tmp_path), env=env, timeout=180)
    assert done.returncode == 2
    assert error in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_wall_clock_limit_stops_cleanly_and_leaves_no_sandbox(endpoint: LocalEndpoint, tmp_path: Path) -> None:
    options = BenchOptions(
        endpoint="env",  # the session's embedded endpoint, through E2B_API_URL/E2B_SANDBOX_URL
        runners=("py-e2b-2.63.0",),
        count=500,
        modes=("sequential", "burst"),
        max_seconds=round(scaled(3)),  # a few samples of the sequential mode even on a busy host
        results_dir=tmp_path,
        transfer_mib=1,
        report=False,
    )
    started = time.monotonic()
    table = io.StringIO()
    assert run_bench(options, out=table) == 0
    assert time.monotonic() - started < scaled(30)
    (run_dir,) = [path for path in tmp_path.iterdir() if path.is_dir()]  # and latest.json beside it
    document = read_bench(run_dir)
    assert document is not None
    measures = document["runners"]["py-e2b-2.63.0"]["measures"]
    limit = f"not measured (limit {options.max_seconds:g} s)"
    assert 0 < measures["tti.sequential"]["attempted"] < 500
    assert measures["tti.sequential"]["stopped"] == "deadline"
    # Another endpoint than the embedded one has no pool the bench sizes or settles, and no on-demand burst.
    assert "pool" not in document["header"] and "tti.burst_on_demand" not in measures
    assert all(m["settle"] is None and m["served"] is None for m in measures.values())
    assert measures["tti.burst"]["attempted"] == 0
    assert any("wall-clock limit" in note for note in document["notes"])
    # Cut short, a measure is not measured, with the samples it has: never a missed target.
    for measure in ("tti.sequential", "tti.burst"):
        assert measures[measure]["limit_s"] == options.max_seconds
    sequential = next(line for line in table.getvalue().splitlines() if " tti.sequential " in line)
    assert sequential.endswith(limit)
    assert f"{measures['tti.sequential']['stats']['ok']}/{measures['tti.sequential']['attempted']}" in sequential
    assert "MISSED" not in table.getvalue() and "targets missed" not in table.getvalue()
    cases = {case.case: case for case in read_run(run_dir).cases}
    assert cases["tti.burst"].outcome == "skip" and cases["leak_check"].outcome == "pass"
    assert cases["tti.sequential"].outcome == "skip"
    assert (cases["tti.sequential"].error or "").startswith(f"{limit}: ")
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}) as client:
        assert tagged_sandboxes(client, run_dir.name) == []


# --- report ----------------------------------------------------------------------------------


class Charts(HTMLParser):
    """The bench sections of a report and the SVG charts inside them."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.charts: list[tuple[str, str]] = []  # (class, runner of the enclosing figure)
        self.rows: list[str] = []
        self.external: list[str] = []
        self._runner = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section" and "bench" in (found.get("class") or "").split():
            self.sections.append(found.get("data-run") or "comparison")
        if tag == "figure":
            self._runner = found.get("data-runner") or ""
        if tag == "svg":
            self.charts.append((found.get("class") or "", self._runner))
        if tag == "g" and found.get("class") == "row":
            self.rows.append(found.get("data-label") or "")
        for name in ("src", "href"):
            if (found.get(name) or "").startswith(("http:", "https:", "//")) and tag != "svg":
                self.external.append(found[name] or "")


def test_report_has_a_distribution_chart_per_runner_and_a_comparison_across_runs(
    small_run: Path, tmp_path: Path
) -> None:
    again = tmp_path / (small_run.name + "-again")
    shutil.copytree(small_run, again)
    for name in ("run.json", "bench.json"):
        document = json.loads((again / name).read_text())
        document["header"]["run_id"] = again.name
        (again / name).write_text(json.dumps(document))
    page = Charts()
    page.feed(render([small_run, again], tmp_path / "out").html.read_text())
    assert page.sections == ["comparison", small_run.name, again.name]  # the comparison opens the report
    distributions = [runner for kind, runner in page.charts if kind == "chart distribution"]
    assert distributions == [*RUNNERS, *RUNNERS]
    assert [kind for kind, _ in page.charts].count("chart comparison") == 1
    assert {"tti.sequential", "tti.burst", "baseline: spawn"} <= set(page.rows)
    assert page.external == []


@pytest.mark.bench
def test_full_benchmark_of_the_embedded_endpoint(tmp_path: Path) -> None:
    """The full-size run (100 samples per measure, both SDKs): minutes, so only under `-m bench`."""
    done = e2b_bench("bench", "--results-dir", str(tmp_path), timeout=600)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [path for path in tmp_path.iterdir() if path.is_dir()]  # and latest.json beside it
    document = read_bench(run_dir)
    assert document is not None and document["cleanup"]["survivors"] == []


def measure_doc(met: bool | None, limit_s: float | None = None) -> dict:
    """A measure's bench.json entry: every sample succeeded; its target met, missed, or none set; 5 of 8
    samples taken when the wall-clock limit `limit_s` cut it."""
    target = None if met is None else {"text": "median <= 10x bare_spawn", "max_ratio": 10, "met": met}
    stats = {"attempted": 5, "ok": 5}
    return {
        "attempted": 5,
        "planned": 8 if limit_s else 5,
        "stopped": "deadline" if limit_s else None,
        "limit_s": limit_s,
        "error": None,
        "stats": stats,
        "samples": [],
        "ratio": 12.5,
        "target": target,
    }


@pytest.mark.parametrize(
    ("met", "gate", "verdict"),
    [
        (False, True, ("fail", "missed its target: median <= 10x bare_spawn (median 12.5x)")),
        (False, False, ("pass", None)),  # without --gate a target is reported, not judged
        (True, True, ("pass", None)),
        (None, True, ("pass", None)),  # no target (another endpoint, a small burst): nothing to hold
    ],
)
def test_gate_fails_a_measure_that_missed_its_target(met: bool | None, gate: bool, verdict: tuple) -> None:
    assert _verdict(measure_doc(met), gate=gate) == verdict


@pytest.mark.parametrize(
    ("gate", "verdict"),
    [
        (True, ("fail", "not measured (limit 120 s): 5 of 8 samples")),  # the gate fails for that reason
        (False, ("skip", "not measured (limit 120 s): 5 of 8 samples")),
    ],
)
def test_a_measure_cut_by_the_limit_is_not_measured_never_missed(gate: bool, verdict: tuple) -> None:
    doc = measure_doc(None, limit_s=120)
    doc["target"] = {"text": "median <= 10x bare_spawn", "max_ratio": 10, "met": None}
    assert _verdict(doc, gate=gate) == verdict
    assert target_text(doc) == "not measured (limit 120 s)"


def test_on_a_host_read_as_slow_a_long_run_still_settles_the_embedded_endpoint_before_each_measure(
    tmp_path: Path,
) -> None:
    # There the pool's usual wait, scaled, is past the longest settle the endpoint grants (600 s), and a run this
    # long does not cut it down to its time left: the harness asks at most what the endpoint grants
    done = e2b_bench(
        "bench", "-n", "2", "--modes", "sequential", "--transfer-mib", "1", "--runner", "py-e2b-2.63.0",
        "--max-seconds", "900", "--results-dir", str(tmp_path), env={"E2B_BENCH_SLOWNESS": "8"}, timeout=scaled(300),
    )  # fmt: skip

    bench = json.loads((only_run_dir(tmp_path) / BENCH_JSON).read_text())
    settles = {name: measure["settle"] for name, measure in bench["runners"]["py-e2b-2.63.0"]["measures"].items()}
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(settles) >= 8 and {name for name, settle in settles.items() if not settle["settled"]} == set()
    assert not [note for note in bench["notes"] if "not settled" in note]
