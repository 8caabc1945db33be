"""The JS side of the probes (`[probes.ts]`, sandboxes/e2b/ts/probes.mjs), run through the CLI as a user types it.

OBSERVED is the specification: what the npm SDK reports of each probe on the faithful profile and on the
`b3os-beta` profile, down to the status, error code and exception a refusal carries.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from run_cli import REPO, e2b_bench, only_run_dir

from bench.results import CaseRecord, read_run
from bench.runners.manifest import load_steps

RUNNER = "js-e2b-2.51.0"
SUITE = "sandboxes/e2b/test_probes.py::test_probes"
STEP_IDS = [step.id for step in load_steps("probes", "ts")]

# step -> (outcome, what the runner recorded: `observed` for probes that ran, the refusal's fields otherwise).
OBSERVED: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "e2b": {
        "pj01_watch_dir_stream": ("pass", {"observed": True}),
        "pj02_stdin": ("pass", {"observed": ["got:ping\n", "eof\n"]}),
        "pj03_pty": ("pass", {"observed": {"echoed": True, "exit_code": 3}}),
        "pj04_gzip": ("pass", {"observed": {"round_trip": True}}),
        "pj05_signed_urls": ("pass", {"observed": "signed-js"}),
        "pj06_metrics": ("pass", {"observed": True}),
        "pj07_default_cwd": ("pass", {"observed": {"default": "/home/user", "cwd=/tmp": "/tmp"}}),
        "pj08_setsid_exit_code": ("pass", {"observed": {"exit_code": 5, "stdout": "late\n"}}),
    },
    "b3os-beta": {
        # The streaming RPC's 404 reaches the SDK as a Connect `unimplemented`: the endpoint's message is lost.
        "pj01_watch_dir_stream": (
            "refused",
            {
                "exception": "SandboxError",
                "status_code": 404,
                "error_code": "unimplemented",
                "message": "12: [unimplemented] HTTP 404",
            },
        ),
        "pj02_stdin": (
            "refused",
            {
                "exception": "InvalidArgumentError",
                "status_code": 400,
                "error_code": "invalid_argument",
                "message": "[invalid_argument] stdin is not supported: pass input in the command instead",
            },
        ),
        "pj03_pty": (
            "refused",
            {
                "exception": "InvalidArgumentError",
                "status_code": 400,
                "error_code": "invalid_argument",
                "message": "[invalid_argument] pty is not supported",
            },
        ),
        "pj04_gzip": (
            "refused",
            {
                "exception": "InvalidArgumentError",
                "status_code": 400,
                "error_code": None,
                "message": "gzip uploads are not supported: send the body uncompressed",
            },
        ),
        # A plain fetch of the signed URL: the endpoint's own answer.
        "pj05_signed_urls": (
            "refused",
            {
                "status_code": 401,
                "error_code": "envd_token_invalid",
                "message": "envd_token_invalid: the access token is missing, wrong or expired",
            },
        ),
        # The SDK turns any metrics 404 into SandboxNotFoundError naming the sandbox: no status, no message.
        "pj06_metrics": (
            "refused",
            {
                "exception": "SandboxNotFoundError",
                "status_code": None,
                "error_code": None,
                "message": "Sandbox <id> not found",
            },
        ),
        "pj07_default_cwd": ("deviation", {"observed": {"default": "/workspace", "cwd=/tmp": "/workspace"}}),
        "pj08_setsid_exit_code": ("deviation", {"observed": {"exit_code": 0, "stdout": ""}}),
    },
}


def run_probes(results: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[CaseRecord]]:
    args = ("--runner", RUNNER, "--results-dir", str(results), "--no-report", *extra)
    done = e2b_bench("run", SUITE, *args, timeout=600)
    return done, [c for c in read_run(only_run_dir(results)).cases if c.suite == "probes"]


def recorded(case: CaseRecord, wanted: dict[str, Any]) -> dict[str, Any]:
    """The fields of `wanted` as the case recorded them (the sandbox id in a message made generic)."""
    details = case.details
    found = {key: details.get(key) for key in wanted}
    if isinstance(found.get("message"), str):
        found["message"] = re.sub(r"Sandbox \S+ not found", "Sandbox <id> not found", found["message"])
    return found


def test_the_manifest_table_names_the_probes_script_and_every_step_is_implemented() -> None:
    source = (REPO / "sandboxes" / "e2b" / "ts" / "probes.mjs").read_text()

    assert re.findall(r"^step\('(\w+)',", source, flags=re.MULTILINE) == STEP_IDS
    assert STEP_IDS == list(OBSERVED["e2b"]) == list(OBSERVED["b3os-beta"])


@pytest.mark.parametrize("profile", ["e2b", "b3os-beta"])
def test_every_js_probe_conforms_and_records_what_the_endpoint_answered(profile: str, tmp_path: Path) -> None:
    extra = () if profile == "e2b" else ("--profile", profile)

    done, cases = run_probes(tmp_path, *extra)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [c.case for c in cases] == STEP_IDS
    assert [c.runner for c in cases] == [RUNNER] * len(STEP_IDS)
    assert [c.case for c in cases if not c.conformant] == []
    assert {c.case: (c.outcome, recorded(c, OBSERVED[profile][c.case][1])) for c in cases} == OBSERVED[profile]
