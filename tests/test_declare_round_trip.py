"""Shipped profiles conform to their shipped declarations, and declarations written from a run are a fixed point
(`e2b-bench expectations RUN --write FILE`, bench/triage/declare.py): written from a run, the same endpoint run
again and judged by them conforms (exit 0). Real runs of the embedded endpoint: every shipped profile whole (the
remote conditions' and hostile's round trip under `--slow` only), three single quirks of different kinds, and a run
cut short by its time budget.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from run_cli import e2b_bench, only_run_dir
from shared_runs import WHOLE_RUN_S, Shared, profile_key, quirk_key, quirk_run, shares, whole_run

from bench.detection import CONDITION_QUIRKS, IDENTITY_QUIRKS, RUNNER
from bench.expectations import Expectations, compared_outcome, judge
from bench.localbox.quirks import PROFILES, Quirks
from bench.results import read_run
from bench.triage.causes import apart

REPO = Path(__file__).resolve().parents[1]
EXPECTATIONS = REPO / "expectations"
# What a generated `match` never holds: an id, or a prefix of the harness's own.
NOT_IN_A_MATCH = re.compile(r"sbx-\w{6,}|\b[0-9a-f]{8}-[0-9a-f]{4}-|attempt \d+/\d+|endpoint transient|runner died")


def behavioural(profile: str) -> list[str]:
    """The quirks of a profile that change what a case observes (not only when or how fast it answers)."""
    default, quirks = Quirks(), PROFILES[profile]
    ignored = {*CONDITION_QUIRKS, *IDENTITY_QUIRKS}
    return [
        f.name for f in fields(Quirks) if f.name not in ignored and getattr(quirks, f.name) != getattr(default, f.name)
    ]


def declarations_of(profile: str) -> Path:
    """The file `run --profile P` is judged by: `expectations/P.toml`, else the embedded endpoint's own."""
    own = EXPECTATIONS / f"{profile}.toml"
    return own if profile != "e2b" and own.exists() else EXPECTATIONS / "local.toml"


def whole(profile: str) -> pytest.MarkDecorator:
    """The mark of a test reading a profile's whole run: each profile's on a worker of its own (the runs are
    hundreds of sandboxes each: in parallel they finish sooner), its round trip with it."""
    return shares(profile_key(profile))


# In CI every profile's whole run but the remote conditions' (remote-e2b: the faithful endpoint behind latency and
# a seeded share of 429/502/503 answers), which CI runs over the SDK suites below; its whole run is `--slow`'s.
CI_WHOLE = ("e2b", "b3os-beta", "hostile")
REMOTE_SUITES = ("quickstart", "refusals", "tokens", "probes")


def slow_unless(ci: bool) -> list[pytest.MarkDecorator]:
    return [] if ci else [pytest.mark.slow]


@pytest.mark.parametrize(
    "profile", [pytest.param(name, marks=[whole(name), *slow_unless(name in CI_WHOLE)]) for name in sorted(PROFILES)]
)
def test_every_shipped_profile_conforms_whole_to_its_shipped_declarations(shared: Shared, profile: str) -> None:
    # A profile that changes what cases observe ships the declarations of what it changes.
    if behavioural(profile):
        assert (EXPECTATIONS / f"{profile}.toml").is_file(), f"profile {profile} ships no expectations/{profile}.toml"

    code, run_dir, output = whole_run(shared, profile)

    assert_conforms(code, run_dir, output, profile)
    assert len(read_run(run_dir).cases) > 300  # every suite of the default run, both SDK runners and the frameworks


def test_the_remote_conditions_profile_conforms_over_the_sdk_suites_of_both_clients(tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = e2b_bench("run", "--profile", "remote-e2b", *REMOTE_SUITES, "--results-dir", str(results), "--no-report",
                     timeout=WHOLE_RUN_S)  # fmt: skip
    run_dir = only_run_dir(results)

    assert_conforms(done.returncode, run_dir, done.stdout[-3000:] + done.stderr[-3000:], "remote-e2b")
    assert {case.suite for case in read_run(run_dir).cases} >= set(REMOTE_SUITES)


def assert_conforms(code: int, run_dir: Path, output: str, profile: str) -> None:
    run = read_run(run_dir)
    assert Path(run.header["expectations"]) == declarations_of(profile)
    assert run.status == "completed"
    # A profile of remote conditions answers some requests 502/503 on purpose: a case failed only by such an
    # answer is the endpoint's moment, no verdict (exit 2 when there are only those), never a deviation.
    failing = [case for case in run.cases if not case.conformant]
    assert [case.id for case in failing if apart(case) is None] == [], output
    assert code == (2 if failing else 0), output
    # however the endpoint misbehaves, the harness held up: no runner lost its cases, every case ran
    lost = [case.id for case in run.cases if (case.error or "").startswith(("runner died", "not run"))]
    assert lost == [], output


def rerun(run_dir: Path, results: Path, declared: Path, only: list[str] | None = None) -> tuple[int, Path, str]:
    """The run's own command line again (the same endpoint, profile, quirks and selection, or `only` these
    cases of it), judged by `declared`."""
    argv = [str(item) for item in read_run(run_dir).header["argv"][1:]]
    if only is not None:
        argv += [f"--case={case}" for case in only if not case.startswith("housekeeping/")]
    at = argv.index("--results-dir")
    argv[at + 1] = str(results)
    argv = [item for item in argv if not item.startswith("--expectations")] + ["--expectations", str(declared)]
    results.mkdir(parents=True, exist_ok=True)
    done = e2b_bench(*argv, "--no-report", timeout=WHOLE_RUN_S)
    return done.returncode, only_run_dir(results), done.stdout[-3000:] + done.stderr[-3000:]


def write(run_dir: Path, declared: Path, *flags: str) -> str:
    written = e2b_bench("expectations", str(run_dir), "--write", str(declared), *flags, timeout=WHOLE_RUN_S)
    assert written.returncode == 0, written.stdout + written.stderr
    return written.stdout


def readable(declared: Path) -> list[str]:
    """Each `match` the file holds."""
    found = []
    for declaration in Expectations.load(declared).cases.values():
        if declaration.match is not None:
            found += [declaration.match] if isinstance(declaration.match, str) else list(declaration.match)
    return found


# hostile's round trip (a confirming re-run of its ~100 failures, then those again) is `--slow`'s; b3os-beta's and
# the single quirks' below show the same fixed point in CI.
@pytest.mark.parametrize(
    "profile",
    [pytest.param(name, marks=[whole(name), *slow_unless(name != "hostile")]) for name in ("b3os-beta", "hostile")],
)
def test_declarations_written_from_a_profiles_whole_run_judge_it_again_conformant(
    shared: Shared, tmp_path: Path, profile: str
) -> None:
    _, run_dir, _ = whole_run(shared, profile)
    # judged by the faithful declarations, everything the profile changes fails: that is what is declared
    declared = tmp_path / f"{profile}.toml"
    shutil.copy(EXPECTATIONS / "local.toml", declared)

    said = write(run_dir, declared)
    code, again, output = rerun(run_dir, tmp_path / "again", declared, only=failing_under(run_dir, declared))

    assert code == 0, output
    assert all(case.conformant for case in read_run(again).cases)
    assert [match for match in readable(declared) if NOT_IN_A_MATCH.search(match)] == []
    if profile == "b3os-beta":
        # one cause per difference, about: at most 1.5 causes for each behaviour the profile changes (its refused
        # options each count)
        causes = int(re.search(r": (\d+) cause\(s\) declared", said)[1])  # type: ignore[index]
        differences = len(behavioural("b3os-beta")) - 1 + len(PROFILES["b3os-beta"].refuse_create_options)
        assert causes <= 1.5 * differences, said


def failing_under(run_dir: Path, declared: Path) -> list[str]:
    """The cases of the run that are not `pass` by `declared`: those its declarations decide (with their
    prerequisites, which a run of them runs too). The others are judged as before: a pattern written covers
    exactly its cause's cases of the run, so no declaration reaches them."""
    written = Expectations.load(declared)
    return sorted(case.id for case in read_run(run_dir).cases if written.for_case(case.id).outcome != "pass")


# Three kinds of difference: a login profile that moves every command (a quirk of the sandbox), a wire mutation
# (an answer changed on its way), a refusal (an envd option refused).
SINGLE = ("cwd_override=/workspace", "mutations=start_ignores_cwd", "refuse_pty")


@pytest.mark.parametrize("quirk", [pytest.param(q, marks=shares(quirk_key(q))) for q in SINGLE])
def test_declarations_written_from_a_single_quirks_run_judge_it_again_conformant(
    shared: Shared, tmp_path: Path, quirk: str
) -> None:
    run_dir = quirk_run(shared, quirk)
    declared = tmp_path / "endpoint.toml"
    failing = sorted(case.id for case in read_run(run_dir).cases if not case.conformant)

    said = write(run_dir, declared)
    code, again, output = rerun(run_dir, tmp_path / "again", declared)

    assert failing and code == 0, output
    assert all(case.conformant for case in read_run(again).cases)
    # every failure recurred and is declared, and nothing passing is
    written = Expectations.load(declared)
    assert sorted(case.id for case in read_run(run_dir).cases if written.for_case(case.id).outcome != "pass") == failing
    assert "did not recur" not in said
    assert [match for match in readable(declared) if NOT_IN_A_MATCH.search(match)] == []


def test_a_run_cut_short_is_refused_and_only_its_finished_cases_are_declared(tmp_path: Path) -> None:
    results = tmp_path / "results"
    # more cases than 30 s of a budget can run: some finish, the rest are recorded not run
    done = e2b_bench("run", "probes", "refusals", "behaviours", "--runner", RUNNER, "--quirk=refuse_stdin",
                     "--max-minutes", "0.5", "--results-dir", str(results), "--no-report", timeout=600)  # fmt: skip
    run_dir = only_run_dir(results)
    run = read_run(run_dir)
    not_run = sorted(case.id for case in run.cases if (case.error or "").startswith("not run"))
    finished = [case for case in run.cases if case.id not in not_run]
    assert run.status == "interrupted" and not_run, done.stdout[-2000:]
    declared = tmp_path / "endpoint.toml"  # the embedded endpoint's declarations, which judged the run
    shutil.copy(EXPECTATIONS / "local.toml", declared)

    refused = e2b_bench("expectations", str(run_dir), "--write", str(declared), timeout=600)
    nothing_written = declared.read_text() == (EXPECTATIONS / "local.toml").read_text()
    said = write(run_dir, declared, "--finished-only")

    assert (refused.returncode, nothing_written) == (2, True), refused.stdout + refused.stderr
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "did not finish (status interrupted): an unfinished run's failures are not all the endpoint's; run it to "
            "the end, or pass --finished-only to declare only the cases it finished"
        )
    )
    assert f"only the {len(finished)} case(s) it finished are declared from" in said
    assert f"not declared, not run: {len(not_run)} case(s)" in said
    written, faithful = Expectations.load(declared), Expectations.load(EXPECTATIONS / "local.toml")
    # no case it did not run is declared (what the run's own declarations said of it stands)
    assert [case for case in not_run if written.for_case(case) != faithful.for_case(case)] == []
    # each case it finished is judged conformant by what was written: its failures (a refused stdin) declared
    assert [
        case.id
        for case in finished
        if not judge(
            compared_outcome(case.outcome, case.details, case.note),  # type: ignore[arg-type]
            case.details,
            case.error,
            written.for_case(case.id),
        ).conformant
    ] == []
