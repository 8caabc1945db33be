"""Causes on real runs of the embedded endpoint: each quirk alone gives the causes expected, the written
declarations round-trip (a run judged by them conforms; a second quirk fails it naming only its cases).

Runs are cut to the cases a quirk flags (`detection.run_one(..., only=DETECTED_BY[quirk])`), so each is a
few seconds of sandboxes; they are the runs tests/test_quirk_detection.py makes, shared (tests/shared_runs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_cli import e2b_bench, only_run_dir
from shared_runs import Shared, quirk_key, quirk_params, quirk_run, shares

from bench.detection import DETECTED_BY, RUNNER, SUITES
from bench.expectations import Expectations, match_found, symptom_text
from bench.localbox.quirks import PROFILES
from bench.results import read_run, schema_errors
from bench.triage.declare import update_file

STDIN_REFUSED = "stdin is not supported"
LOCAL = Expectations.load(Path(__file__).resolve().parents[1] / "expectations" / "local.toml")

# What a person expects each quirk to look like, cause by cause (cases as `suite/case`, the Python runner's).
EXPECTED: dict[str, list[set[str]]] = {
    # One refusal by the endpoint, whichever way it was met: the probe, the raw request, the SDK's exception
    # in four behaviours.
    "refuse_stdin": [
        {
            "probes/pr05_stdin",
            "refusals/rf10_envd_stdin",
            "behaviours/sync_stdin",
            "behaviours/async_stdin",
            "behaviours/sync_stream_input",
            "behaviours/async_stream_input",
        },
        # envd's tag selectors, met through raw Connect calls that send input: the endpoint's own message
        {"behaviours/sync_process_selectors", "behaviours/async_process_selectors"},
    ],
    # The SDK turns the 404 into "sandbox not found" (the probe and the metrics behaviours see that), the raw
    # request sees the endpoint's own message: the answer each case's exchanges hold is one, so one cause; the
    # REST status table sees 404 where 200 belongs (among other answers of its own).
    "metrics_404": [
        {
            "probes/pr10_metrics",
            "refusals/rf15_get_metrics",
            "behaviours/sync_metrics",
            "behaviours/async_metrics",
            "behaviours/sync_metrics_window",
            "behaviours/async_metrics_window",
            "behaviours/sync_reported_resources",  # the metrics agree with the cgroup's figures
            "behaviours/async_reported_resources",
        },
        {"behaviours/sync_rest_statuses", "behaviours/async_rest_statuses"},
    ],
    # The checks compare what they got with what E2B gives: whatever they check (the default cwd, what the login
    # profile prints, a command's output under cwd/envs/user, the next call's cwd, the cwd /proc shows), what
    # only the observed value has is /workspace: one cause. Where a relative path lands observes `missing`.
    "cwd_override=/workspace": [
        {
            "behaviours/sync_run_envs_cwd_user",
            "behaviours/async_run_envs_cwd_user",
            "behaviours/sync_options_end_with_call",
            "behaviours/async_options_end_with_call",
            "behaviours/sync_process_info",
            "behaviours/async_process_info",
            "probes/pr01_default_cwd",
            "probes/pr02_login_profile",
        },
        {"probes/pr12_relative_paths"},
    ],
}


def short(case_id: str) -> str:
    suite, _, case = case_id.split("/", 2)
    return f"{suite}/{case}"


@pytest.mark.parametrize("quirk", quirk_params(sorted(EXPECTED)))
def test_each_quirk_alone_gives_the_causes_a_person_expects(shared: Shared, quirk: str) -> None:
    run_dir = quirk_run(shared, quirk)

    document = json.loads((run_dir / "causes.json").read_text())

    assert schema_errors("causes", document) == []
    found = sorted((sorted(short(c) for c in cause["cases"]) for cause in document["causes"]), key=str)
    assert found == sorted((sorted(cases) for cases in EXPECTED[quirk]), key=str)
    assert document["failing"] == len(DETECTED_BY[quirk])
    # each cause's match is found in the symptom of every one of its cases, and each case has its exchanges
    cases = {case.id: case for case in read_run(run_dir).cases}
    for cause in document["causes"]:
        assert cause["match"] is not None
        for case_id in cause["cases"]:
            case = cases[case_id]
            pinned = cause["match"] if isinstance(cause["match"], str) else tuple(cause["match"])
            assert match_found(pinned, symptom_text(case.error, case.details)), (case_id, pinned)
            assert case.evidence, case_id
        assert cause["representative"]["evidence"], cause["key"]


@shares(quirk_key("refuse_stdin"))
def test_a_refused_stdin_shows_the_refusal_in_each_cases_own_exchanges(shared: Shared) -> None:
    run_dir = quirk_run(shared, "refuse_stdin")

    failing = [case for case in read_run(run_dir).cases if not case.conformant]

    assert len(failing) == 8
    for case in failing:
        refused = [
            exchange
            for exchange in case.evidence or []
            if exchange["path"] == "/process.Process/Start"
            and '"stdin": true' in exchange.get("request", "")
            and STDIN_REFUSED in " ".join(exchange.get("frames", []))
        ]
        assert refused, case.id


# The probes and refusals that either quirk of the round trip flags (refuse_stdin, metrics_404).
ROUND_TRIP = "pr05_stdin or rf10_envd_stdin or pr10_metrics or rf15_get_metrics"


def run_quirks(results: Path, *quirks: str, expectations: Path | None = None) -> tuple[int, Path]:
    """The round trip's cases of the Python runner under these quirks, as a user runs them."""
    results.mkdir(parents=True)
    args = ["run", *SUITES[:2], "--runner", RUNNER, "--results-dir", str(results), "--no-report"]
    args += [f"--quirk={quirk}" for quirk in quirks] + ["-k", ROUND_TRIP]
    if expectations is not None:
        args += ["--expectations", str(expectations)]
    done = e2b_bench(*args, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, only_run_dir(results)


def stdin_refused(shared: Shared) -> tuple[int, Path]:
    """The round trip's cases under `refuse_stdin` alone: the first run of both tests below (they only read it)."""
    return shared.once("round-trip refuse_stdin", lambda directory: run_quirks(directory / "results", "refuse_stdin"))


@shares("round-trip refuse_stdin")
def test_declarations_written_from_a_run_gate_it_until_a_second_quirk_breaks_it(shared: Shared, tmp_path: Path) -> None:
    code, first = stdin_refused(shared)
    declared = tmp_path / "endpoint.toml"
    written = e2b_bench("expectations", str(first), "--write", str(declared))
    assert (code, written.returncode) == (1, 0), written.stderr

    again, _ = run_quirks(tmp_path / "again", "refuse_stdin", expectations=declared)
    broken, second = run_quirks(tmp_path / "second", "refuse_stdin", "metrics_404", expectations=declared)

    assert again == 0
    assert broken == 1
    nonconformant = sorted(case.id for case in read_run(second).cases if not case.conformant)
    assert nonconformant == [f"probes/{RUNNER}/pr10_metrics", f"refusals/{RUNNER}/rf15_get_metrics"]


@shares("round-trip refuse_stdin")
def test_update_file_keeps_the_declarations_of_an_earlier_run(shared: Shared, tmp_path: Path) -> None:
    _, first = stdin_refused(shared)
    _, both = run_quirks(tmp_path / "both", "refuse_stdin", "metrics_404")
    declared = tmp_path / "endpoint.toml"
    update_file(read_run(first), declared)

    change = update_file(read_run(both), declared)

    # only what the first file did not declare is added (one cause: the run's only cases named *_metrics); the
    # stdin declarations stand as written
    assert sorted(change.added) == ["*/*/*_metrics"]
    assert change.updated == []
    again, _ = run_quirks(tmp_path / "again", "refuse_stdin", "metrics_404", expectations=declared)
    assert again == 0


# Causes each quirk of the b3os-beta profile gives on the Python probes and refusals, judged by no declaration.
# One each, except where the cases check different things or the endpoint names different things:
PROFILE_CAUSES = {
    "cwd_override": 2,  # what a check observed (/workspace), and where a relative path lands (`missing`)
    "metrics_404": 1,  # the SDK's "sandbox not found" and the raw request's: one answer of the endpoint's
    # one per option the endpoint names; pause and connect both name 'memory'; network rules and egress proxy
    # are the embedded endpoint's own 501s, each naming its member
    "refuse_create_options": 9,
    "session_leader": 1,
    "end_on_exit": 1,
    "refuse_stdin": 1,
    "refuse_pty": 1,
    "refuse_gzip_upload": 1,
    "refuse_signed_urls": 1,
    "watch_dir_404": 1,
    "template_build_501": 1,
    "embedded refusal": 2,  # what it refuses whatever the profile: PUT network rules, egress proxy (501 each)
}


def embedded_refusal(case_id: str) -> str | None:
    """What the embedded endpoint refuses whatever the profile (declared `refused` in its own expectations)."""
    declared = LOCAL.cases.get(f"{case_id.split('/')[0]}/*/{case_id.split('/', 2)[2]}")
    return "embedded refusal" if declared is not None and declared.outcome == "refused" else None


def on(quirk: str) -> bool:
    """Does the b3os-beta profile switch this quirk (`NAME[=VALUE]`) on?"""
    name, _, value = quirk.partition("=")
    held = getattr(PROFILES["b3os-beta"], name)
    if isinstance(held, frozenset):
        return value in held
    return held == value if value else bool(held)


def test_a_profile_judged_by_nothing_gives_its_quirks_causes_none_mixing_two(tmp_path: Path) -> None:
    nothing = tmp_path / "nothing.toml"
    nothing.write_text('[endpoint]\nname = "b3os-beta"\n')
    args = ["run", *SUITES[:2], "--runner", RUNNER, "--profile", "b3os-beta", "--expectations", str(nothing)]
    args += ["--results-dir", str(tmp_path / "results"), "--no-report"]
    done = e2b_bench(*args, "-k", "not pr13_large_output and not pr14_binary_round_trip", timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]

    document = json.loads((only_run_dir(tmp_path / "results") / "causes.json").read_text())

    field_of = {case: quirk.split("=")[0] for quirk, cases in DETECTED_BY.items() if on(quirk) for case in cases}
    per_field: dict[str, int] = {}
    for cause in document["causes"]:
        fields = {field_of.get(short(case)) or embedded_refusal(case) for case in cause["cases"]}
        assert len(fields) == 1 and None not in fields, cause["cases"]
        field = fields.pop()
        assert field is not None
        per_field[field] = per_field.get(field, 0) + 1
    assert per_field == PROFILE_CAUSES, per_field
