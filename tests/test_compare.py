"""What changed between fixture nightly runs: `report --baseline` (a diff) and `report --history` (a timeline)."""

import json
import shutil
import stat
from pathlib import Path

from bench.compare import Change, diff, find_runs, flaky
from bench.results import read_run
from tests.html_dom import select
from tests.run_cli import e2b_bench

RUNS = Path(__file__).parent / "fixtures" / "runs"
PY, JS, AG2 = "py-e2b-2.63.0", "js-e2b-2.51.0", "ag2-1.2.1"
METRICS_404 = (
    "refused (declared pass): GET /sandboxes/{id}/metrics: HTTP 404: metrics are not supported by this endpoint"
)


def run(name: str):  # type: ignore[no-untyped-def]
    return read_run(RUNS / name, allow_truncated=True)


def test_diff_lists_new_failures_and_slower_cases() -> None:
    result = diff(run("nightly-01"), run("nightly-02"))

    assert result.changes == [
        Change(
            "new failure",
            f"frameworks/{AG2}/fw01_proof_task",
            "pass",
            "fail (declared pass): the model's answer was empty",
        ),
        Change(
            "new failure",
            f"probes/{PY}/pr10_metrics",
            "pass",
            METRICS_404,
        ),
        Change(
            "new failure",
            f"quickstart/{PY}/py02_run_echo",
            "pass",
            "fail (declared pass): CommandExitException: exit status 1",
        ),
        Change("slower", f"quickstart/{JS}/ts01_create", "400 ms", "1300 ms"),
    ]


def test_diff_lists_fixed_cases_changed_symptoms_new_cases_and_pins() -> None:
    result = diff(run("nightly-02"), run("nightly-03"))

    assert result.changes == [
        Change(
            "fixed", f"frameworks/{AG2}/fw01_proof_task", "fail (declared pass): the model's answer was empty", "pass"
        ),
        Change(
            "fixed",
            f"quickstart/{PY}/py02_run_echo",
            "fail (declared pass): CommandExitException: exit status 1",
            "pass",
        ),
        Change(
            "symptom changed",
            f"probes/{PY}/pr10_metrics",
            METRICS_404,
            "refused (declared pass): GET /sandboxes/{id}/metrics: HTTP 501: metrics are not implemented",
        ),
        Change("new case", f"quickstart/{PY}/py03_files", "", "pass"),
        Change("faster", f"quickstart/{JS}/ts01_create", "1300 ms", "390 ms"),
        Change("pin changed", f"{AG2}: openai", "3.57.0", "3.58.0"),
    ]
    assert result.new_failures == []


def test_a_run_that_did_not_finish_is_a_new_failure_and_its_cases_are_removed() -> None:
    result = diff(run("nightly-01"), run("interrupted"))

    assert [(c.kind, c.subject) for c in result.changes[:2]] == [
        ("new failure", "run"),
        ("removed case", f"frameworks/{AG2}/fw01_proof_task"),
    ]
    assert (
        result.changes[0].after == "interrupted (Ctrl-C or SIGTERM) before every selected case ran; 1 case(s) recorded"
    )


def test_report_baseline_fails_on_new_failures_when_asked(tmp_path: Path) -> None:
    done = e2b_bench(
        "report",
        "--baseline",
        str(RUNS / "nightly-01"),
        str(RUNS / "nightly-02"),
        "--fail-on-new",
        "--out",
        str(tmp_path),
    )

    lines = done.stdout.splitlines()
    assert (done.returncode, lines[0], lines[4]) == (
        1,
        f"new failure: frameworks/{AG2}/fw01_proof_task: pass → fail (declared pass): the model's answer was empty",
        "3 new failure(s), 4 change(s) since nightly-01",
    )
    changes = select((tmp_path / "report.html").read_text(), "tr", data_kind="new failure")
    assert len(changes) == 3
    assert "### What changed since `nightly-01`" in (tmp_path / "summary.md").read_text()


def test_report_baseline_passes_without_new_failures(tmp_path: Path) -> None:
    done = e2b_bench(
        "report",
        "--baseline",
        str(RUNS / "nightly-02"),
        str(RUNS / "nightly-03"),
        "--fail-on-new",
        "--out",
        str(tmp_path),
    )

    assert (done.returncode, done.stdout.splitlines()[6]) == (0, "0 new failure(s), 6 change(s) since nightly-02")


def test_report_with_a_baseline_and_two_runs_is_a_usage_error(tmp_path: Path) -> None:
    done = e2b_bench(
        "report", "--baseline", str(RUNS / "nightly-01"), str(RUNS / "nightly-02"), str(RUNS / "nightly-03")
    )

    assert (done.returncode, done.stderr) == (
        2,
        "e2b-bench report: --baseline compares one run with the baseline: give exactly one run directory after it\n",
    )


def test_flaky_cases_flip_back_with_the_same_endpoint_and_pins() -> None:
    runs = find_runs(RUNS)

    assert [r.run_id for r in runs] == ["nightly-01", "nightly-02", "nightly-03", "aborted-preflight", "interrupted"]
    # py02 went bad and came back under the same pins; fw01 came back only after its openai pin moved,
    # and pr10 stayed broken: a regression, not a flake.
    assert flaky(runs) == [
        {
            "case": f"quickstart/{PY}/py02_run_echo",
            "flips": 2,
            "between": ["nightly-01 → nightly-02", "nightly-02 → nightly-03"],
        }
    ]


def test_report_history_renders_a_timeline_per_case(tmp_path: Path) -> None:
    history = tmp_path / "history"
    shutil.copytree(RUNS, history / "results")

    done = e2b_bench("report", "--history", str(history), "--out", str(tmp_path / "out"))

    html = (tmp_path / "out" / "history.html").read_text()
    outcomes = [
        (td.attrs.get("data-outcome"), td.classes[-1])
        for td in select(f"<table>{_row_html(html, f'quickstart/{PY}/py02_run_echo')}</table>", "td")
    ]
    assert done.returncode == 0
    assert outcomes == [
        ("pass", "conformant"),
        ("fail", "nc"),
        ("pass", "conformant"),
        (None, "absent"),
        (None, "absent"),
    ]
    assert [th.attrs.get("class") for th in select(html, "th") if "data-run" in th.attrs] == [
        "passed",
        "failed",
        "failed",
        "failed",
        "failed",
    ]
    md = (tmp_path / "out" / "history.md").read_text().splitlines()
    assert md[0] == "## e2b-bench history: 5 run(s), 4 failed the gate"
    assert (
        f"- `quickstart/{PY}/py02_run_echo`: flipped 2 time(s) with the same endpoint and pins "
        "(nightly-01 → nightly-02; nightly-02 → nightly-03)"
    ) in md
    assert stat.S_IMODE((tmp_path / "out" / "history.html").stat().st_mode) == 0o644


def _row_html(html: str, case: str) -> str:
    start = html.index(f'<tr data-case="{case}"')
    return html[start : html.index("</tr>", start) + 5]


def test_report_history_of_a_directory_without_runs_is_a_usage_error(tmp_path: Path) -> None:
    done = e2b_bench("report", "--history", str(tmp_path))

    assert (done.returncode, done.stderr) == (
        2,
        f"e2b-bench report: {tmp_path}: no run directory (no run.json) found under it\n",
    )


def with_error(tmp_path: Path, name: str, error: str) -> Path:
    """A copy of nightly-02 whose pr10_metrics failed with `error`."""
    copy = tmp_path / name
    shutil.copytree(RUNS / "nightly-02", copy)
    lines = [json.loads(line) for line in (copy / "cases.jsonl").read_text().splitlines()]
    for line in lines:
        if line["case"] == "pr10_metrics":
            line["error"] = error
    (copy / "cases.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return copy


def test_a_symptom_differing_only_in_sandbox_id_port_or_timing_is_not_a_change(tmp_path: Path) -> None:
    before = with_error(tmp_path, "a", "Sandbox i4k2sm0x7v1c9q3e5t8z not found at 127.0.0.1:38503 after 12.5 ms")
    after = with_error(tmp_path, "b", "Sandbox zz9y8x7w6v5u4t3s2r1q not found at 127.0.0.1:41177 after 9.1 ms")
    status = with_error(tmp_path, "c", "Sandbox zz9y8x7w6v5u4t3s2r1q not found: HTTP 410")

    assert diff(read_run(before), read_run(after)).changes == []
    assert [c.kind for c in diff(read_run(before), read_run(status)).changes] == ["symptom changed"]


def test_report_history_shows_benchmark_ratio_trends(tmp_path: Path) -> None:
    done = e2b_bench("report", "--history", str(RUNS.parent / "bench-history"), "--out", str(tmp_path))

    md = (tmp_path / "history.md").read_text().splitlines()
    html = (tmp_path / "history.html").read_text()

    assert done.returncode == 0
    assert md[md.index("### Benchmark ratios (x baseline of each run)") + 4 :][:3] == [
        f"| `{PY} tti.sequential` | 7.42x | 8.44x |",
        f"| `{PY} tti_http.sequential` | 1.30x | **11.56x** |",
        f"| `{PY} run_true` | 1.13x | **3.62x** |",
    ]
    assert len(select(html, "td", class_="regression")) == 5
    assert html.count("<svg") == 1


def test_report_history_lists_only_the_cases_whose_outcome_changed_and_all_with_all(tmp_path: Path) -> None:
    history = tmp_path / "history"
    shutil.copytree(RUNS, history / "results")
    changed = [f"frameworks/{AG2}/fw01_proof_task", f"probes/{PY}/pr10_metrics", f"quickstart/{PY}/py02_run_echo"]
    steady = [f"quickstart/{PY}/py01_create", f"quickstart/{PY}/py03_files", f"quickstart/{JS}/ts01_create"]

    for flags, rows in (([], changed), (["--all"], sorted([*changed, *steady, "housekeeping/harness/leak_check"]))):
        out = tmp_path / ("all" if flags else "changed")
        done = e2b_bench("report", "--history", str(history), *flags, "--out", str(out))

        html = (out / "history.html").read_text()
        md = (out / "history.md").read_text()
        assert done.returncode == 0, done.stderr
        assert [tr.attrs["data-case"] for tr in select(html, "tr") if "data-case" in tr.attrs] == rows
        assert [line.split("`")[1] for line in md.splitlines() if line.startswith("| `")] == rows


def test_all_without_history_is_a_usage_error(tmp_path: Path) -> None:
    done = e2b_bench("report", str(RUNS / "nightly-01"), "--all", "--out", str(tmp_path))

    assert (done.returncode, done.stderr) == (
        2,
        "e2b-bench report: --all applies to --history DIR only: give --history, or drop --all\n",
    )


def test_a_benchmark_with_a_missed_target_and_no_gate_never_reads_gate_passed(tmp_path: Path) -> None:
    bench_run = RUNS.parent / "bench-history" / "20261130T105815Z-bench-local"  # upload missed its target

    done = e2b_bench("report", str(bench_run), "--out", str(tmp_path))

    first = (tmp_path / "summary.md").read_text().splitlines()[0]
    verdict = select((tmp_path / "report.html").read_text(), "p", id="verdict")[0].text
    assert done.returncode == 0, done.stderr
    assert first.startswith("## e2b-bench: ⚠️ TARGETS MISSED (not gated): 1 target(s) missed; ")
    assert verdict == first.split(" ", 3)[3] and "GATE PASSED" not in verdict
