"""`e2b-bench repro RUN --case ID`: one case of a recorded run as a reproduction that runs without the harness.

The directory holds the runner's own client code (its entry script, the language's runner kit and what they
read, under `runner/` in the layout they expect), the runner's pins (`requirements.txt`, or `package.json` and
its lock), `case.json` (the runner task narrowed to the case and its prerequisites: the same steps the harness
ran, no model), the driver (`repro.py` or `repro.mjs`, copied from this package) and `README.md` (the three
variables, what E2B does, what the endpoint did and its wire excerpt, redacted). The driver exits 0 when the
step passes, 1 printing the symptom when it does not. A framework's proof task, which a model drives, is
replayed: the tool calls of the case's transcript go straight through the framework's backend
(`options.replay`, frameworks/proof.py and proof.mjs). The upstream suite's README gives the test runner's own
command line with its pins instead of a script.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.paths import DATA_ROOT
from bench.redaction import Redactor
from bench.results import CaseRecord, Run
from bench.runners.catalog import Runner
from bench.runners.manifest import load_manifest, load_steps, task_steps
from bench.runners.protocol import make_task

HERE = Path(__file__).resolve().parent
VARIABLES = ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL")
SANDBOX_LIFETIME_S = 120  # as a run on a quiet host gives its runners' sandboxes
SKIPPED = {"__pycache__", "node_modules", ".pytest_cache"}
EXCERPT_EXCHANGES = 6
PROOF_STEP = "fw01_proof_task"
NO_MODEL_URL = "http://127.0.0.1:9/v1"  # the discard port: a replayed proof task asks no model
NO_MODEL_KEY = "E2B_BENCH_REPLAY_MODEL_KEY"


class ReproError(Exception):
    """The repro cannot be written (no such case, a runner this checkout does not know); one sentence."""


@dataclass(frozen=True)
class Written:
    directory: Path
    language: str
    command: str  # what to type in the directory to run it


def find_case(run: Run, pattern: str) -> CaseRecord:
    """The one case of `run` whose id is `pattern` or matches it."""
    exact = [case for case in run.cases if case.id == pattern]
    found = exact or [case for case in run.cases if fnmatch.fnmatchcase(case.id, pattern)]
    if not found:
        raise ReproError(f"{run.path} has no case {pattern}")
    if len(found) > 1:
        raise ReproError(f"{pattern} matches {len(found)} cases of {run.path} (e.g. {found[0].id}, {found[1].id})")
    return found[0]


def runner_files(runner: Runner, suite: str) -> list[Path]:
    """What the runner's entry script reads, relative to the data root: the folders of its entry and of its
    runner.toml, the language's runner kit, and what the runners' parent folder shares (proof.py, cells/)."""
    spec = runner.for_suite(suite)
    kit = DATA_ROOT / "sandboxes" / "e2b" / ("python" if spec.language == "python" else "ts")
    folders = {spec.entry_path.parent, kit}
    if spec.project and (DATA_ROOT / spec.project).is_relative_to(DATA_ROOT):  # not a release's own (cache)
        folders.add(DATA_ROOT / spec.project)
    shared = spec.entry_path.parent.parent
    files: set[Path] = set()
    for folder in folders:
        files.update(_tree(folder))
    for item in shared.iterdir() if shared != DATA_ROOT else ():
        if item.is_file() and item.suffix in (".py", ".mjs") and not item.name.startswith("test_"):
            files.add(item)
        elif item.is_dir() and item.name not in SKIPPED and not any(item.rglob("runner.toml")):
            files.update(_tree(item))
    return sorted(path.relative_to(DATA_ROOT) for path in files)


def _tree(folder: Path) -> list[Path]:
    return [
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not SKIPPED.intersection(path.relative_to(folder).parts)
        and not path.name.startswith("test_")
        and path.suffix in (".py", ".mjs", ".json", ".txt", ".toml", ".in")
    ]


def case_task(run: Run, case: CaseRecord, runner: Runner) -> dict[str, Any]:
    """The runner task of the case and its prerequisites, as the harness sends it (no model)."""
    table = runner.table(case.suite)
    if table is None:
        raise ReproError(f"runner {runner.name} has no {case.suite} suite in this checkout")
    steps = load_steps(case.suite, table)
    if case.case not in {step.id for step in steps}:
        raise ReproError(f"{case.suite}/{runner.name} has no step {case.case} in this checkout")
    options: dict[str, Any] = {"sandbox_timeout_s": SANDBOX_LIFETIME_S}
    planned = task_steps(steps, [case.case])
    extra: dict[str, Any] = {}
    if PROOF_STEP in planned["steps"]:
        options["replay"] = replay_calls(run, runner.name)
        # A framework makes its model client when its session opens; replayed, it is never asked (no address,
        # no key of anyone's: a placeholder the task's env sets for the client to find).
        options["model"] = {"base_url": NO_MODEL_URL, "name": "replay", "key_env": NO_MODEL_KEY, "scripted": True}
        extra["env"] = {NO_MODEL_KEY: "replayed-no-model"}
    return make_task(case.suite, runner.name, "repro", **planned, options=options, **extra)


def replay_calls(run: Run, runner: str) -> list[dict[str, Any]]:
    """The tool calls of the runner's first proof attempt in the run's transcript (what the model asked)."""
    path = run.path / f"{runner}.json"
    try:
        transcript = json.loads(path.read_text())
    except (OSError, ValueError):
        transcript = {}
    for attempt in transcript.get("attempts") or []:
        calls = [
            {"name": c.get("name"), "arguments": c.get("arguments") or {}, "result": c.get("result") or ""}
            for c in attempt.get("tool_calls") or []
        ]
        if calls:
            return calls
    # No transcript (the run kept none, or the agent never called a tool): what the scripted model asks.
    return [
        {"name": "shell", "arguments": {"command": "uname -a"}},
        {"name": "shell", "arguments": {"command": "uname -a > /home/user/proof.txt"}},
        {"name": "read", "arguments": {"path": "/home/user/proof.txt"}},
    ]


def write_repro(run: Run, case_id: str, out: Path, runners: dict[str, Runner]) -> Written:
    case = find_case(run, case_id)
    runner = runners.get(case.runner)
    if runner is None:
        raise ReproError(f"runner {case.runner} of {case.id} is not one of this checkout's (`e2b-bench runners`)")
    if out.exists() and any(out.iterdir()):
        raise ReproError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    table = load_manifest()[case.suite][runner.table(case.suite)]
    if "steps_from" in table:
        _readme(out, run, case, runner, upstream_command(runner, case))
        return Written(out, runner.language, "see README.md")
    task = case_task(run, case, runner)
    for relative in runner_files(runner, case.suite):
        target = out / "runner" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(DATA_ROOT / relative, target)
    spec = runner.for_suite(case.suite)
    title = next(step.title for step in load_steps(case.suite, runner.table(case.suite) or "") if step.id == case.case)
    document = {
        "id": case.id,
        "step": case.case,
        "entry": f"runner/{spec.entry}",
        "expected": title,
        "task": task,
    }
    (out / "case.json").write_text(json.dumps(document, indent=2) + "\n")
    if runner.language == "python":
        shutil.copy2(HERE / "repro.py", out / "repro.py")
        (out / "requirements.txt").write_text(requirements(runner))
        command = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/python repro.py"
    else:
        shutil.copy2(HERE / "repro.mjs", out / "repro.mjs")
        project = DATA_ROOT / (spec.project or "")
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(project / name, out / name)
        command = "npm ci && node repro.mjs"
    _readme(out, run, case, runner, command)
    return Written(out, runner.language, command)


def requirements(runner: Runner) -> str:
    """The runner's pins as pip reads them: its lock file, else one `name==version` a line."""
    lock = runner.spec.lock_path
    if lock is not None:
        return lock.read_text()
    return "".join(f"{name}=={version}\n" for name, version in sorted(runner.pins.items()))


def upstream_command(runner: Runner, case: CaseRecord) -> str:
    """The upstream test runner's own command line for one of E2B's tests, with the pins it ran under, typed in
    E2B's SDK source tree (`packages/python-sdk` or `packages/js-sdk`)."""
    pins = " ".join(shlex.quote(f"{name}=={version}") for name, version in sorted(runner.pins.items()))
    if runner.language == "python":
        return (
            f"cd packages/python-sdk && python3 -m venv .venv && .venv/bin/pip install -e . {pins} && "
            f"E2B_DOMAIN=${{E2B_DOMAIN:-localhost}} .venv/bin/pytest -p no:cacheprovider {shlex.quote(case.case)}"
        )
    path, _, title = case.case.partition(" > ")
    vitest = runner.pins.get("vitest", "")
    named = f" -t {shlex.quote(title.replace(' > ', ' '))}" if title else ""
    return f"cd packages/js-sdk && npm ci && npx vitest@{vitest} run {shlex.quote(path)}{named}"


def _readme(out: Path, run: Run, case: CaseRecord, runner: Runner, command: str) -> None:
    endpoint = run.header.get("endpoint", {})
    details = case.details or {}
    observed = details.get("observed")
    e2b = details.get("e2b")
    head = [
        f"# Reproduction: {case.id}",
        "",
        f"Recorded by e2b-bench run `{run.run_id}` against endpoint `{endpoint.get('name', '?')}`, "
        f"runner `{runner.name}` ({', '.join(f'{k} {v}' for k, v in sorted(runner.pins.items()))}).",
        "",
        "## Run it",
        "",
        "Point the E2B SDK at the endpoint with the three variables it reads:",
        "",
        "```sh",
        "export E2B_API_KEY=...        # the endpoint's API key",
        "export E2B_API_URL=...        # its API, e.g. https://api.example.test",
        "export E2B_SANDBOX_URL=...    # where sandboxes (envd) are reached",
        command,
        "```",
        "",
        "It exits 0 when the endpoint behaves as E2B does and 1, printing the symptom, when it does not.",
        "",
        "",
    ]
    lines = [
        "## What E2B does",
        "",
        f"{case.case}: {_title(case, runner)}.",
        *(["", f"E2B: `{json.dumps(e2b, default=str)[:600]}`"] if e2b is not None else []),
        "",
        "## What this endpoint did",
        "",
        f"`{case.outcome}`: {case.error or case.note or '(no message)'}",
        *(["", f"Observed: `{json.dumps(observed, default=str)[:600]}`"] if observed is not None else []),
    ]
    if case.evidence:
        lines += ["", "Wire excerpt (the case's exchanges, redacted):", "", "```"]
        for exchange in case.evidence[:EXCERPT_EXCHANGES]:
            lines += _exchange_lines(exchange)
        if len(case.evidence) > EXCERPT_EXCHANGES:
            lines.append(f"... {len(case.evidence) - EXCERPT_EXCHANGES} more exchange(s)")
        lines.append("```")
    # What the run recorded is redacted already; the redactor runs again over it, never over the fixed text.
    text = "\n".join(head) + "\n" + Redactor().redact_text("\n".join(lines)) + "\n"
    (out / "README.md").write_text(text)


def _title(case: CaseRecord, runner: Runner) -> str:
    table = runner.table(case.suite)
    try:
        return next(step.title for step in load_steps(case.suite, table or "") if step.id == case.case)
    except (StopIteration, Exception):  # a source tree's test, or a step this checkout no longer has
        return "the step passes"


def _exchange_lines(exchange: dict[str, Any]) -> list[str]:
    """One wire log line as a few lines of text: the request, its answer and the first bytes of both bodies."""
    where = exchange.get("path") or _path(str(exchange.get("url", "?")))
    out = [f"{exchange.get('method', '?')} {where} -> {exchange.get('status')}"]
    for label, keys in (
        ("  request: ", ("request", "request_excerpt")),
        ("  answer:  ", ("response", "response_excerpt")),
    ):
        body = next((exchange[key] for key in keys if exchange.get(key)), None)
        if body:
            out.append(label + (body if isinstance(body, str) else json.dumps(body, default=str))[:300])
    frames = exchange.get("frames") or exchange.get("response_frames")
    if frames:
        out.append("  frames:  " + json.dumps(frames, default=str)[:300])
    return out


def _path(url: str) -> str:
    """A URL without its scheme and host (the loopback proxy's port says nothing of the endpoint)."""
    rest = url.split("://", 1)[-1]
    return "/" + rest.split("/", 1)[1] if "/" in rest else url
