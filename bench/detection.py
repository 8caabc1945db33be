"""`e2b-bench detect`: proof that the harness detects each deviation the embedded endpoint can have.

Runs the probes, the refusal cases, the Python behaviours and the computer suite (its Node runner) once
against the faithful profile and once per quirk switched on alone (two runs at a time, each serving its own
embedded endpoint), each judged by the faithful endpoint's declarations, and records one case per quirk: the
cases it flagged (`details.flagged`) and the run directory that shows them. A quirk that flags nothing is `fail`:
the harness would not notice that deviation; the faithful baseline must flag nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from .differential.capture import DIFFERENTIAL_ENV
from .endpoints import resolve
from .exits import ExitCode, defer_interrupts, interrupted_code
from .lifecycle import Lifecycle
from .localbox.quirks import OPTION_FIELDS
from .paths import SANDBOXES_DIR
from .preload import OUTPUT_TAIL, run_forked, stop_all
from .results import CaseRecord, case_id, read_run

PROBES = SANDBOXES_DIR / "e2b" / "test_probes.py"
SUITES = (
    f"{PROBES}::test_probes",
    f"{PROBES}::test_refusals",
    str(SANDBOXES_DIR / "e2b" / "test_behaviours.py"),
    str(SANDBOXES_DIR / "e2b" / "test_computer.py"),
)
RUNNER = "py-e2b-2.63.0"
JS_RUNNER = "js-e2b-2.51.0"  # the computer suite's only (its binding is JavaScript); its other suites are not run
ONLY_COMPUTER_IN_JS = f"not ({JS_RUNNER} and not test_computer)"
# The 2.5 MB output and 20 MiB round-trip probes relate to no quirk; the faithful baseline still runs them.
HEAVY = "not pr13_large_output and not pr14_binary_round_trip"
BASELINE = "none (faithful)"
STOP_GRACE_S = 60  # for a run told to stop to kill its sandboxes and write its footer
PARALLEL = 2  # quirk runs at a time: each has its own embedded endpoint

# Which cases each behavioural quirk (as `--quirk` takes it), switched on alone, flags, and no other:
# the specification `detect` proves and tests/test_quirk_detection.py checks. Identity quirks (token and
# id prefixes, the 401 text) change no behaviour a case asserts: the token probes record them instead.
IDENTITY_QUIRKS = ("token_prefix", "sandbox_id_prefix", "token_error")
# Quirks of the server's own resources that no client can observe (its self-tests check them instead).
SERVER_ONLY_QUIRKS = ("streams_outlive_clients",)
# Remote conditions, not deviations: a stalled stream is one hung case (tests/test_remote_run.py); latency, slow
# creates, rate limits and transient 5xx change no verdict: the harness retries what can be retried and records
# the rest as the endpoint's transient (tests/test_remote_conditions.py).
# An unavailable route fails whatever cases use the route it is given (tests/test_remote_refused_route.py), and so
# does a missing one, for the SDK releases that use it (tests/test_bisect.py).
CONDITION_QUIRKS = (
    "stream_stall", "rate_limit", "transient_5xx", "latency", "slow_create", "unavailable_route", "missing_route"
)  # fmt: skip
# What a misbehaving third-party endpoint does to a whole run (the `hostile` profile's parts): each breaks
# most cases at once, so no case list specifies it; tests/test_hostile.py checks that a run under it ends, blames
# nothing of the harness's own and declares to a fixed point.
HOSTILE_MUTATIONS = ("stream_no_end_frame",)
# Its quirks of the same kind: commands served by a small pool, a cap on running sandboxes, a 502 after delete,
# `user` ignored (each shown alone by tests/test_hostile.py).
HOSTILE_QUIRKS = ("envd_pool", "pool_until_exit", "max_running", "deleted_502", "ignore_user")
OPTION_CASES = {
    "mcp": "rf01_create_mcp",
    "autoResume": "rf02_create_auto_resume",
    "volumeMounts": "rf03_create_volume_mounts",
    "iam": "rf04_create_iam",
    "network": "rf05_create_network_rules",
    "onTimeoutFilesystem": "rf06_create_on_timeout_filesystem",
    "pauseWithoutMemory": "rf07_pause_without_memory",
    "connectReboot": "rf08_connect_on_resume_reboot",
}


def both(*bodies: str) -> tuple[str, ...]:
    """A behaviour's cases under the sync and the async Python client."""
    return tuple(f"behaviours/{flavour}_{body}" for body in bodies for flavour in ("sync", "async"))


def computer(*steps: str) -> tuple[str, ...]:
    """Steps of the computer suite."""
    return tuple(f"computer/{step}" for step in steps)


# The computer steps that run commands as the agent user: each needs it created (useradd) and its own ids.
AS_AGENT_USER = computer(
    "co02_template_agent_user",
    "co03_skills_read_only",
    "co04_command_limits",
    "co05_cancel_descendants",
    "co06_file_streams",
)


# Each wire mutation (bench/localbox/mutations.py) breaks one documented behaviour; these cases notice.
MUTATION_CASES: dict[str, tuple[str, ...]] = {
    "list_ignores_metadata": both("list_filters_paging"),
    "list_ignores_state": both("list_filters_paging", "rest_statuses"),
    "list_ignores_limit": both("list_filters_paging"),
    "list_ignores_next_token": both("list_filters_paging"),
    "get_drops_metadata": both("create_envs_metadata"),
    "get_state_always_running": both("pause_connect", "rest_statuses", "pause_filesystem"),
    "create_ignores_timeout": both("create_timeout_end_at"),
    "create_ignores_envs": both("create_envs_metadata"),
    "create_ignores_internet_access": both("create_internet_access"),
    "set_timeout_ignored": both("rest_statuses", "set_timeout", "rest_options"),
    "pause_ignored": both("list_filters_paging", "pause_connect", "rest_statuses", "pause_filesystem"),
    "kill_ignored": (*both("kill", "rest_statuses", "kill_cuts_stream"), "housekeeping/leak_check"),
    "not_found_as_400": both("errors", "kill", "rest_statuses"),
    "bad_key_as_403": both("errors", "rest_statuses"),
    "metrics_empty": (*both("metrics"), "probes/pr10_metrics"),
    "start_ignores_envs": both("background_list_kill", "run_envs_cwd_user"),
    "start_ignores_cwd": (
        *both("background_list_kill", "run_envs_cwd_user"), "probes/pr01_default_cwd", "probes/pr02_login_profile"
    ),
    "start_ignores_user": both("host_and_mcp", "run_envs_cwd_user"),
    "output_truncated": both("output_sizes"),
    "output_chunks_repeated": both("output_sizes"),
    "stderr_dropped": both("run_streams"),
    "output_held": both("run_streams", "process_selectors"),  # the latter waits for a running command's output
    "exit_code_zeroed": (
        *both("pty_resize_kill", "run_exit_code"),
        "probes/pr03_setsid", "probes/pr04_exit_codes", "probes/pr06_pty",
    ),
    "connect_drops_end": both("connect_command", "pty_connect_input"),
    "process_list_empty": both("background_list_kill"),
    "pty_resize_ignored": both("pty_resize_kill"),
    "list_dir_ignores_depth": both("list_depth"),
    "stat_owner_root": both("entry_info"),
    "stat_mtime_epoch": both("entry_info"),
    "stat_drops_symlink_target": both("entry_info"),
    "remove_ignored": both("remove"),
    "watch_not_recursive": ("behaviours/async_watch_recursive",),
    "watcher_not_recursive": ("behaviours/sync_watch_recursive",),
    "watch_drops_removes": ("behaviours/async_watch_recursive",),
    "watcher_drops_removes": ("behaviours/sync_watch_recursive",),
    "download_truncated": both("gzip", "write_read_sizes"),
    "download_drops_last_byte": (
        *both("gzip", "host_and_mcp", "read_formats", "rest_statuses", "run_exit_code", "signed_urls"),
        *both("write_read_sizes", "proc_file_read", "signed_url_refusals"),
        "probes/pr07_gzip",
        "probes/pr08_signed_urls",
    ),
    "upload_ignores_user": both("write_as_user"),
    "upload_drops_metadata": both("file_metadata"),
    "upload_ignores_gzip": (*both("gzip"), "probes/pr07_gzip"),
}  # fmt: skip
# Behaviours a refused create/pause/connect option also breaks.
OPTION_BEHAVIOURS: dict[str, tuple[str, ...]] = {
    "pauseWithoutMemory": both("pause_filesystem"),
    "network": (
        "refusals/rf16_create_private_traffic",  # allowPublicTraffic is a network member too
        *both("mask_request_host"),  # and maskRequestHost
        # fidelity: field table and second-path checks
        "refusals/rf17_create_network_transform_rules",  # refused as an unsupported member, not as unenforceable
        "refusals/rf18_create_egress_proxy",
    ),
    "autoResume": both("auto_resume_wakes_on_traffic"),
    "onTimeoutFilesystem": both("rest_options"),
}
# Each fidelity quirk brings back one behaviour the embedded endpoint used to have and E2B does not.
FIDELITY_CASES: dict[str, tuple[str, ...]] = {
    "dir_mode_go_bit": both("dir_mode"),
    "remove_missing_404": both("remove_missing"),
    "upload_no_metadata": both("file_metadata_replaced"),
    "proc_size_zero": both("proc_file_read"),
    "kill_stream_clean_end": both("kill_cuts_stream"),
    "kill_stream_unavailable": both("kill_cuts_stream"),
    "kill_returns_early": both("background_list_kill"),
    "signed_url_generic_error": both("signed_url_refusals"),
    "metrics_ignore_window": both("metrics_window"),
    "ignore_traffic_token": ("refusals/rf16_create_private_traffic",),
    "files_write_as_user": both("file_metadata_replaced"),
    "unknown_route_404": both("rest_statuses"),
    # fidelity: wake on traffic, host masking, watch events
    "ignore_auto_resume": both("auto_resume_wakes_on_traffic"),
    "ignore_mask_host": both("mask_request_host"),
    "extra_write_event": both("watch_events_match_envd"),
    # fidelity: field table and second-path checks
    "pause_keeps_memory": both("pause_filesystem", "rest_options"),
}
# What an endpoint reports, or how far an option reaches, compared with what is: each quirk breaks one.
REPORTED_CASES: dict[str, tuple[str, ...]] = {
    "wrong_cpu_count": both("reported_resources"),
    "stale_file_info": both("file_info_current"),
    "sticky_cwd": both("run_envs_cwd_user", "options_end_with_call"),
    "pty_strips_cr": both("pty_bytes"),
}
# The new cases of the field table, as the older quirks and mutations also break them (measured).
FIELD_ALSO: dict[str, tuple[str, ...]] = {
    "cwd_override=/workspace": both("options_end_with_call", "process_info"),
    "refuse_stdin": both("process_selectors"),
    "refuse_pty": both("pty_bytes", "process_selectors"),
    "metrics_404": both("reported_resources"),
    "mutations=metrics_empty": both("reported_resources"),
    "mutations=get_drops_metadata": both("reported_resources"),
    "mutations=start_ignores_envs": both("options_end_with_call", "process_info"),
    "mutations=start_ignores_cwd": both("options_end_with_call", "process_info"),
    "mutations=process_list_empty": both("process_info"),
    "mutations=start_ignores_user": both("options_end_with_call"),
    "mutations=exit_code_zeroed": both("pty_bytes"),
    "mutations=pty_resize_ignored": both("process_selectors"),
    "mutations=stat_mtime_epoch": both("file_info_current"),
    "mutations=get_state_always_running": both("rest_options"),
    "mutations=create_ignores_timeout": both("rest_options"),
    "mutations=pause_ignored": both("rest_options"),
}
# What the agent computer contract needs from an endpoint (the `computer` suite), each quirk breaking one thing.
COMPUTER_CASES: dict[str, tuple[str, ...]] = {
    "kill_leader_only": ("computer/co04_command_limits", "computer/co05_cancel_descendants"),
    "kill_unconfirmed": ("computer/co08_release", *both("kill", "rest_statuses")),
    "drop_mutation_answer": ("computer/co06_file_streams", *both("rename")),
    "no_useradd": AS_AGENT_USER,
}
DETECTED_BY: dict[str, tuple[str, ...]] = {
    "cwd_override=/workspace": (
        "probes/pr01_default_cwd", "probes/pr02_login_profile", "probes/pr12_relative_paths", *both("run_envs_cwd_user")
    ),
    "session_leader": ("probes/pr03_setsid",),
    "end_on_exit": ("probes/pr16_output_after_exit",),
    "refuse_stdin": ("probes/pr05_stdin", "refusals/rf10_envd_stdin", *both("stdin", "stream_input")),
    "refuse_pty": ("probes/pr06_pty", "refusals/rf11_envd_pty", *both("pty_resize_kill", "pty_connect_input")),
    "refuse_gzip_upload": ("probes/pr07_gzip", "refusals/rf12_gzip_upload", *both("gzip")),
    "refuse_signed_urls": ("probes/pr08_signed_urls", *both("signed_urls", "signed_url_refusals", "download_encoding")),
    "watch_dir_404": (
        "probes/pr09_watch_dir", "refusals/rf14_envd_watch_dir", *both("watch_recursive", "watch_events_match_envd")
    ),
    "metrics_404": (
        "probes/pr10_metrics", "refusals/rf15_get_metrics", *both("metrics", "rest_statuses", "metrics_window")
    ),
    "template_build_501": ("probes/pr11_template_build", "refusals/rf13_template_build"),
    **{
        f"refuse_create_options={option}": (f"refusals/{OPTION_CASES[option]}", *OPTION_BEHAVIOURS.get(option, ()))
        for option in OPTION_FIELDS
    },
    **{f"mutations={name}": cases for name, cases in MUTATION_CASES.items()},
    **FIDELITY_CASES,
    **COMPUTER_CASES,
    **REPORTED_CASES,
}  # fmt: skip
for _quirk, _also in FIELD_ALSO.items():
    DETECTED_BY[_quirk] = (*DETECTED_BY[_quirk], *_also)
# Deviations of other areas the computer suite notices too (measured: the suite alone under each quirk).
COMPUTER_ALSO: dict[str, tuple[str, ...]] = {
    "mutations=get_drops_metadata": (
        # co01's receipt tag is not in GET; the steps on its computer depend on it
        *computer("co01_open_seeds_python"),
        *AS_AGENT_USER,
        *computer("co09_no_credentials_inside"),
    ),
    "mutations=create_ignores_timeout": ("computer/co08_release",),
    "mutations=kill_ignored": ("computer/co08_release",),
    "mutations=not_found_as_400": ("computer/co08_release",),
    "mutations=start_ignores_user": AS_AGENT_USER,
    "mutations=exit_code_zeroed": AS_AGENT_USER,
    "mutations=output_truncated": ("computer/co04_command_limits",),
    "mutations=output_chunks_repeated": ("computer/co04_command_limits",),
    "mutations=output_held": ("computer/co05_cancel_descendants",),  # waits for its tree's "started" line
    "mutations=download_truncated": ("computer/co06_file_streams",),
    "mutations=download_drops_last_byte": ("computer/co06_file_streams",),
}
for _quirk, _cases in COMPUTER_ALSO.items():
    DETECTED_BY[_quirk] = (*DETECTED_BY[_quirk], *_cases)
# Details no case asserts (issue 43's areas: precision, units, a value after a later call, stream order, a user's
# environment, a replaced file's metadata, the lifetime after connect): the differential judgement flags them
# (bench/differential/), each in these cases (which pass their own assertions under it), naming this field.
DIFFERENTIAL_DETECTED_BY: dict[str, tuple[tuple[str, ...], str]] = {
    "coarse_times": (both("set_timeout"), "startedAt"),
    "metrics_in_mib": (both("metrics"), "GET /sandboxes/{id}/metrics [].memUsed"),
    "timeout_keeps_endat": (both("set_timeout"), "POST /sandboxes/{id}/timeout probe list.endAt"),
    "root_home_of_user": (both("run_envs_cwd_user"), "POST /process.Process/Start probe env.HOME"),
    "upload_replaces_file": (both("file_metadata_replaced"), "POST /files probe stat.same_inode"),
    "connect_sets_lifetime": (both("rest_options"), "sandboxes/{id}/connect probe endAt_in"),
    "mutations=stderr_held": (both("run_streams"), "POST /process.Process/Start messages"),
}
DETECTED_BY.update({quirk: cases for quirk, (cases, _) in DIFFERENTIAL_DETECTED_BY.items()})
QUIRKS: tuple[str, ...] = tuple(DETECTED_BY)


def run_one(results: Path, quirk: str | None, only: Collection[str] = ()) -> Path:
    """One recorded run of the probes, refusals and behaviours (`only`: just these `suite/case` ids, and the
    cases whose names contain theirs); returns its run directory."""
    results.mkdir(parents=True, exist_ok=True)
    before = {p for p in results.iterdir() if p.is_dir()}
    command = ["run", *SUITES, "--runner", RUNNER, "--runner", JS_RUNNER]
    command += ["--results-dir", str(results), "--no-report"] + ([f"--quirk={quirk}"] if quirk else [])
    selection = " or ".join(case.split("/", 1)[1] for case in sorted(only) if not case.startswith("housekeeping/"))
    keep = [ONLY_COMPUTER_IN_JS] + ([f"({selection})"] if selection else [HEAVY] if quirk else [])
    command += ["-k", " and ".join(keep)]
    # Forked from a process that has imported the harness: ~1 s of CPU less per run than `python -m bench.cli`.
    # Ctrl-C, SIGTERM or a hung run: the run is told to stop (its runners, its footer) and waited for.
    # The cases of a quirk a case asserts are its specification with the differential judgement off (on, it only
    # ever turns a pass into a deviation: they stay flagged); the baseline and the differential's quirks run with it.
    judged = quirk is None or quirk in DIFFERENTIAL_DETECTED_BY
    environment = {**os.environ, DIFFERENTIAL_ENV: "1" if judged else "0"}
    child = run_forked(command, timeout_s=600, grace_s=STOP_GRACE_S, env=environment)
    made = sorted({p for p in results.iterdir() if p.is_dir()} - before)
    # A completed run whose only failures followed a 502/503 and could not be run again exits 2 (the endpoint's
    # transient, unconfirmed): its cases are flagged all the same.
    transient = child.returncode == ExitCode.USAGE and len(made) == 1 and read_run(made[0]).status == "completed"
    if (child.returncode not in (ExitCode.OK, ExitCode.NONCONFORMANT) and not transient) or len(made) != 1:
        raise RuntimeError(f"run with quirk {quirk!r} ended with {child.returncode}: {child.output[-OUTPUT_TAIL:]}")
    return made[0]


def _instant(stamp: str) -> float:
    """Seconds since the epoch of a run.json UTC stamp."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def flagged(run_dir: Path) -> list[str]:
    return sorted(f"{c.suite}/{c.case}" for c in read_run(run_dir).cases if not c.conformant)


def detect(
    results_root: Path, quirks: tuple[str, ...] = QUIRKS, report: bool = False, baseline: Path | None = None
) -> Path:
    """Run the baseline and every quirk (each run serves its own embedded endpoint); returns the run directory.
    `baseline`: a `run_one(..., None)` run already made, copied in instead of run again."""
    life = Lifecycle(resolve("local"), results_dir=results_root, report=report)
    run = life.open("detection", {})
    runs_dir = run.path / "runs"
    all_detected = True

    def timed(quirk: str | None) -> tuple[Path, float]:
        if quirk is None and baseline is not None:
            made = read_run(baseline)
            copied = Path(shutil.copytree(baseline, runs_dir / "baseline" / baseline.name))
            took = (_instant(made.footer["finished_at"]) - _instant(made.header["started_at"])) if made.footer else 0.0
            return copied, round(took * 1000, 1)
        started = time.monotonic()
        run_dir = run_one(runs_dir / re.sub(r"[^A-Za-z0-9_.-]+", "-", quirk or "baseline"), quirk)
        return run_dir, round((time.monotonic() - started) * 1000, 1)

    try:
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            try:
                runs = list(pool.map(timed, (None, *quirks)))
            except BaseException:  # Ctrl-C or SIGTERM: the runs under way stop too, and the pool ends with them
                stop_all()
                raise
        for quirk, (run_dir, duration_ms) in zip((None, *quirks), runs, strict=True):
            found = flagged(run_dir)
            detected = not found if quirk is None else bool(found)
            all_detected = all_detected and detected
            name = quirk or BASELINE
            run.record(
                CaseRecord(
                    id=case_id("detection", "harness", name),
                    suite="detection",
                    runner="harness",
                    case=name,
                    outcome="pass" if detected else "fail",
                    expected="pass",
                    conformant=detected,
                    duration_ms=duration_ms,
                    error=None if detected else ("flags cases" if quirk is None else "flags no case"),
                    details={"flagged": found, "run_dir": str(run_dir.relative_to(run.path))},
                )
            )
    except KeyboardInterrupt:
        life.finish("interrupted", interrupted_code())
        raise
    except Exception:
        life.finish("aborted", ExitCode.USAGE)
        raise
    defer_interrupts()  # the footer and report of a run whose every quirk ran are written whole
    life.finish("completed", ExitCode.OK if all_detected else ExitCode.NONCONFORMANT)
    return run.path


def main(results_root: Path) -> int:
    path = detect(results_root, report=True)
    cases = read_run(path).cases
    width = max(len(c.case) for c in cases)
    for case in cases:
        verdict = "detected" if case.conformant else "NOT DETECTED"
        print(f"{case.case:{width}}  {verdict}: {', '.join(case.details['flagged']) or '-'}")
    print(f"run directory: {path}")
    if (path / "report.html").is_file():
        print(f"report: {path / 'report.html'}")
    return ExitCode.OK if all(c.conformant for c in cases) else ExitCode.NONCONFORMANT
