"""The CI recipes of docs/ci/ do what they say: their very commands, run in order against the embedded endpoint.

The CI services themselves are not involved: `uses:` steps (checkout, cache, upload) are theirs; every `run:`
(GitHub) and script line (GitLab) is executed with bash as the service would, with the service's files
(`$GITHUB_ENV`, `$GITHUB_STEP_SUMMARY`) emulated and the history directory kept between nightly runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import yaml
from run_cli import only_run_dir

from bench.results import read_run

REPO = Path(__file__).resolve().parents[1]
GITHUB = REPO / "docs" / "ci" / "github-actions.yml"
GITLAB = REPO / "docs" / "ci" / "gitlab-ci.yml"
SELECTION = "--runner py-e2b-2.63.0 sandboxes/e2b/test_quickstart.py"
CASES = 12  # the Python quickstart's 11 steps and the leak check
# A declaration the embedded endpoint does not match: the case passes, so the gate must fail.
STALE = """[endpoint]
name = "local"

[cases."quickstart/*/py02_run_echo"]
outcome = "fail"
reason = "declared broken, but it works"
"""


@dataclass(frozen=True)
class Step:
    name: str
    code: int
    output: str


def bash(script: str, env: dict[str, str]) -> Step:
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return Step(script.splitlines()[0], done.returncode, done.stdout + done.stderr)


def service_env(declared: dict[str, str], overrides: dict[str, str]) -> dict[str, str]:
    """The job's variables as the service would set them; `${{ }}` expressions (secrets, vars) are left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update({k: str(v) for k, v in declared.items() if "${{" not in str(v)})
    return {**env, **overrides}


def github_run(tmp_path: Path, name: str, history: Path, args: str) -> tuple[list[Step], dict[str, str], str]:
    """Every `run:` of the gate job in order, as a nightly (schedule) run; returns steps, final env, summary."""
    job = yaml.safe_load(GITHUB.read_text())["jobs"]["gate"]
    work = tmp_path / name
    work.mkdir()
    github_env, summary = work / "github_env", work / "step_summary.md"
    env = service_env(
        job["env"],
        {
            "E2B_BENCH_ENDPOINT": "local",
            "E2B_BENCH_ARGS": args,
            "RESULTS_DIR": str(work / "results"),
            "HISTORY_DIR": str(history),
            "GITHUB_ENV": str(github_env),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_EVENT_NAME": "schedule",
        },
    )
    steps = []
    for step in job["steps"]:
        if "run" not in step:
            continue
        github_env.touch()
        env.update(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line)  # type: ignore[misc]
        steps.append(bash(step["run"], env))
    return steps, env, summary.read_text()


def test_github_workflow_gates_and_keeps_a_nightly_history(tmp_path: Path) -> None:
    history = tmp_path / "history"
    stale = tmp_path / "stale.toml"
    stale.write_text(STALE)

    first, env, summary = github_run(tmp_path, "night-1", history, SELECTION)
    second, env2, summary2 = github_run(tmp_path, "night-2", history, f"{SELECTION} --expectations {stale}")

    assert [step.code for step in first] == [0, 0, 0, 0], [step.output[-2000:] for step in first]
    assert (
        summary.splitlines()[0]
        == f"## e2b-bench: ✅ GATE PASSED: {CASES} case(s), {CASES} conformant, 0 non-conformant"
    )
    junit = ET.parse(Path(env["RUN_DIR"]) / "junit.xml").getroot()
    assert sum(int(suite.get("tests", "0")) for suite in junit.iter("testsuite")) == CASES
    # The second night fails the gate (exit 1), says why first, and what changed since the first night.
    assert [step.code for step in second] == [0, 1, 0, 0], [step.output[-2000:] for step in second]
    lines = summary2.splitlines()
    assert lines[0] == f"## e2b-bench: ❌ GATE FAILED: {CASES} case(s), {CASES - 1} conformant, 1 non-conformant"
    assert f"### Since {Path(env['RUN_DIR']).name}" in lines
    assert "new failure: quickstart/py-e2b-2.63.0/py02_run_echo: pass → pass (declared fail)" in lines
    assert "## e2b-bench history: 2 run(s), 1 failed the gate" in lines
    assert sorted(p.name for p in history.iterdir()) == sorted(Path(e["RUN_DIR"]).name for e in (env, env2))


def test_gitlab_job_runs_the_gate_and_the_nightly_history(tmp_path: Path) -> None:
    job = yaml.safe_load(GITLAB.read_text())["e2b-bench"]
    env = service_env(
        job["variables"],
        {
            "E2B_BENCH_ENDPOINT": "local",
            "E2B_BENCH_ARGS": SELECTION,
            "RESULTS_DIR": str(tmp_path / "results"),
            "HISTORY_DIR": str(tmp_path / "history"),
            "CI_PIPELINE_SOURCE": "schedule",
        },
    )
    # The image's own set-up (Debian packages for Node) is the one line left out: this machine has them.
    before = [line for line in job["before_script"] if not line.startswith("apt-get")]

    # GitLab runs before_script and script in one shell, after_script in another.
    steps = [bash("\n".join([*before, *job["script"]]), env), bash("\n".join(job["after_script"]), env)]

    assert [step.code for step in steps] == [0, 0], [step.output[-2000:] for step in steps]
    assert f"## e2b-bench: ✅ GATE PASSED: {CASES} case(s), {CASES} conformant, 0 non-conformant" in steps[1].output
    history = (tmp_path / "history-report" / "history.md").read_text().splitlines()
    assert history[0] == "## e2b-bench history: 1 run(s), 0 failed the gate"
    assert job["artifacts"]["reports"]["junit"] == "results/*/junit.xml"


SHARDED = REPO / "docs" / "ci" / "sharded-run.yml"
# Four groups (a group is one runner's steps of one suite), so each of the recipe's four shards runs one.
SHARDED_SELECTION = (
    "--runner py-e2b-2.63.0 --runner js-e2b-2.51.0 sandboxes/e2b/test_quickstart.py "
    "sandboxes/e2b/test_probes.py::test_probes sandboxes/e2b/test_probes.py::test_refusals"
)


def expand(command: str, values: dict[str, str]) -> str:
    """GitHub's `${{ name }}` expressions of a `run:` replaced by their values, as the service does."""
    for name, value in values.items():
        command = command.replace("${{ " + name + " }}", value)
    assert "${{" not in command, command
    return command


def test_sharded_recipe_runs_every_shard_merges_them_and_names_a_missing_shard(tmp_path: Path) -> None:
    workflow = yaml.safe_load(SHARDED.read_text())
    shard_job, merge_job = workflow["jobs"]["shard"], workflow["jobs"]["merge"]
    total = str(workflow["env"]["SHARDS"])
    assert shard_job["strategy"]["matrix"]["shard"] == list(range(1, int(total) + 1))
    downloads = tmp_path / "artifacts"
    codes = []
    for index in shard_job["strategy"]["matrix"]["shard"]:
        work = tmp_path / f"shard-job-{index}"
        work.mkdir()
        env = service_env(
            {**workflow["env"], **shard_job["env"]},
            {"E2B_BENCH_ENDPOINT": "local", "E2B_BENCH_ARGS": SHARDED_SELECTION},
        )
        values = {"matrix.shard": str(index), "env.SHARDS": total}
        (run,) = [expand(step["run"], values) for step in shard_job["steps"] if "run" in step]
        # The job's working directory is the checkout; its `shard/` is uploaded as artifact shard-K.
        step = bash(run.replace("--results-dir shard", f"--results-dir {work / 'shard'}"), env)
        codes.append(step.code)
        (downloads / "shards").mkdir(parents=True, exist_ok=True)
        shutil.copytree(work / "shard", downloads / "shards" / f"shard-{index}")

    def merge_job_run(shards: Path, name: str) -> list[Step]:
        job_dir = tmp_path / name
        job_dir.mkdir()
        summary = job_dir / "summary.md"
        env = service_env({}, {"GITHUB_STEP_SUMMARY": str(summary)})
        steps = []
        for step in merge_job["steps"]:
            if "run" in step:
                script = step["run"].replace("shards/", f"{shards}/").replace("merged", str(job_dir / "merged"))
                steps.append(bash(script, env))
        return steps

    complete = merge_job_run(downloads / "shards", "merge-all")
    shutil.rmtree(downloads / "shards" / "shard-3")
    short = merge_job_run(downloads / "shards", "merge-one-missing")

    assert codes == [0] * int(total)
    assert [step.code for step in complete] == [0, 0], [step.output[-2000:] for step in complete]
    merged = read_run(only_run_dir(tmp_path / "merge-all" / "merged"))
    assert merged.status == "completed" and all(case.conformant for case in merged.cases)
    assert {case.id for case in merged.cases if case.suite == "shards"} == {
        f"shards/harness/shard_{i}_of_{total}" for i in range(1, int(total) + 1)
    }
    assert [step.code for step in short] == [1, 0], [step.output[-2000:] for step in short]
    assert f"e2b-bench merge: missing shard 3/{total}: no run directory of it was given" in short[0].output
    missing = read_run(only_run_dir(tmp_path / "merge-one-missing" / "merged"))
    assert missing.status == "completed"  # the shards given finished; the missing one fails the gate as a case
    (case,) = [c for c in missing.cases if c.id == f"shards/harness/shard_3_of_{total}"]
    assert (case.outcome, case.error) == ("error", f"missing shard 3/{total}: no run directory of it was given")


def test_every_recipe_sets_up_node_20_or_newer() -> None:
    github = [yaml.safe_load(path.read_text()) for path in (GITHUB, SHARDED)]
    versions = [
        str(step["with"]["node-version"])
        for workflow in github
        for job in workflow["jobs"].values()
        for step in job["steps"]
        if str(step.get("uses", "")).startswith("actions/setup-node@")
    ]
    image = yaml.safe_load(GITLAB.read_text())["e2b-bench"]["image"]

    assert versions and all(int(version.split(".")[0]) >= 20 for version in versions)
    assert image.startswith("node:") and int(image.split(":")[1].split("-")[0]) >= 20
