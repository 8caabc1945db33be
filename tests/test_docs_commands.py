"""Every shell command of the README and of docs/ is executed, against the embedded endpoint.

The rules a page and this test share are docs/README.md's ("Commands in these pages are executed"): every
command of a fenced `bash`/`sh`/`shell` block and every `$ ` line of a `console` block runs, in the page's
order, in one bash per page; it must exit 0 or the code its trailing `# exit N` names; `./e2b-bench` is
tests/docs_shim.py (`run` as `run --list`, `selftest` collected, `serve` started and stopped); the endpoint
variables a page exports are an embedded endpoint's on loopback; the placeholders (RUN_DIR, CASE_ID, ...) are
real values from a recorded run. A command that did not run (the page's bash died before it) fails the test
as one that failed, and so does a line typed as a command in a block that is not a shell's. A new page or
command needs no change here.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from run_cli import checkout_cli, own_environment

from bench.localbox.server import serving
from bench.model import serving_model
from bench.remote.slowness import scaled

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "e2b-bench"
SHIM = Path(__file__).resolve().parent / "docs_shim.py"
SHELLS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
TYPED = re.compile(r"^\s*(\$ )?\./e2b-bench\b")
EXIT = re.compile(r"\s#\s*exit\s+(\d+)\b")
PROGRAM = re.compile(r"(?<![\w/.-])\./e2b-bench\b")
ENDPOINT_VARS = ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN")
EXPORT = re.compile(rf"^(\s*)export ({'|'.join(ENDPOINT_VARS)})=.*$", re.M)
# The recorded run: one case the quirk breaks, one it does not.
QUIRK = "cwd_override=/workspace"
RECORDED = ("probes/py-e2b-2.63.0/pr01_default_cwd", "quickstart/py-e2b-2.63.0/py02_run_echo")
PAGE_BOUND_S = 900.0  # a whole page on a quiet host, with room; scaled by the host's slowness


def pages() -> list[Path]:
    """The README and every page of the project's documentation: the checkout's own Markdown files, docs/ whole,
    and each folder's README (results/ is the user's)."""
    found = [*sorted(REPO.glob("*.md")), *sorted((REPO / "docs").rglob("*.md")), *sorted(REPO.glob("*/README.md"))]
    return [page for page in dict.fromkeys(found) if page.parent.name not in ("results", ".venv")]


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str
    expected: int

    @property
    def where(self) -> str:
        return f"{shown(self.page)}:{self.line}"


def shown(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else page.name


def commands_of(page: Path) -> tuple[list[Command], list[str]]:
    """The page's commands in order, and its lines typed as commands outside a shell's block."""
    text = page.read_text("utf-8")
    found, stray = [], []
    for fence in FENCE.finditer(text):
        info = fence["info"].strip().split()
        language = info[0] if info else ""
        first = text.count("\n", 0, fence.start("body")) + 1
        lines = fence["body"].splitlines()
        if language not in SHELLS:
            stray += [f"{shown(page)}:{first + i}: {line.strip()}" for i, line in enumerate(lines)
                      if TYPED.match(line)]  # fmt: skip
            continue
        pending, start = "", 0
        for i, line in enumerate(lines):
            if language == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not pending:
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                start = first + i
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            whole = pending + line
            pending = ""
            code = EXIT.search(whole)
            found.append(Command(page, start, whole.strip(), int(code[1]) if code else 0))
    return found, stray


def expected_code(command: Command) -> int:
    """What the command exits with as executed: `run` is listed, so a verdict (1) cannot be had, only 0, a
    usage error (2) or an empty selection (5)."""
    words = shlex.split(command.text, comments=True)
    if "./e2b-bench" in words and words[words.index("./e2b-bench") + 1 :][:1] == ["run"]:
        return command.expected if command.expected in (2, 5) else 0
    return command.expected


@dataclass(frozen=True)
class Context:
    values: dict[str, str]  # placeholder -> value
    env: dict[str, str]  # every command's environment (no endpoint variable: a page exports them)
    exports: dict[str, str]  # what a page's `export E2B_API_KEY=…` lines stand for: the endpoint on loopback
    work: Path


def substitute(command: Command, context: Context, scratch: Path) -> str:
    text = EXPORT.sub(
        lambda m: (
            f"{m[1]}true" if m[2] == "E2B_DOMAIN" else f"{m[1]}export {m[2]}={shlex.quote(context.exports[m[2]])}"
        ),
        command.text,
    )
    values = {
        **context.values,
        "DECLARATIONS": str(scratch / "declarations.toml"),
        "REPORT_DIR": str(scratch / "report"),
    }
    for word in sorted(values, key=len, reverse=True):
        text = re.sub(rf"(?<![\w$/]){word}(?!\w)", lambda _m, v=values[word]: v, text)
    return PROGRAM.sub(lambda _m: f"{shlex.quote(sys.executable)} {shlex.quote(str(SHIM))}", text)


def script(commands: list[Command], context: Context, scratch: Path, ledger: Path) -> str:
    lines = [
        "exec 2>&1",  # one stream, so that each command's words follow its marker
        f"cd {shlex.quote(str(REPO))}",
        f"__ran() {{ printf '%s\\n' \"$*\" >> {shlex.quote(str(ledger))}; }}",
    ]
    for index, command in enumerate(commands):
        lines += [
            f"echo '::command {index}::'",
            substitute(command, context, scratch),
            f"__ran {index} $?",
        ]
    return "\n".join(lines) + "\n"


def run_page(page: Path, commands: list[Command], context: Context) -> list[str]:
    """Execute the page's commands in one bash; the failures, each with its output."""
    scratch = context.work / re.sub(r"\W", "_", str(page.relative_to(REPO)))
    scratch.mkdir()
    shutil.copy(context.values["DECLARATIONS"], scratch / "declarations.toml")
    ledger = scratch / "ledger"
    ledger.touch()
    try:
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", script(commands, context, scratch, ledger)],
            env=context.env,
            capture_output=True,
            text=True,
            timeout=scaled(PAGE_BOUND_S),
            check=False,
            stdin=subprocess.DEVNULL,
        )
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        said = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        output = f"{said}\n(the page's bash outlived {exc.timeout:.0f} s)"
    ran = dict(line.split()[:2] for line in ledger.read_text().splitlines())
    chunks = re.split(r"^::command (\d+)::$", output, flags=re.M)
    said = {int(chunks[i]): chunks[i + 1] for i in range(1, len(chunks) - 1, 2)}
    failures = []
    for index, command in enumerate(commands):
        want = expected_code(command)
        got = ran.get(str(index))
        if got is None:
            failures.append(f"{command.where}: `{command.text}` did not run\n{output[-1500:]}")
        elif int(got) != want:
            tail = said.get(index, "")[-1500:]
            failures.append(f"{command.where}: `{command.text}` exited {got}, not {want}\n{tail}")
    return failures


def endpoints_file(example: Path, target: Path, endpoint: dict[str, str]) -> list[str]:
    """`endpoints.toml.example` with each table pointed at `endpoint` (no declarations of its own); returns the
    names of the key variables its tables name."""
    tables = tomllib.loads(example.read_text())["endpoints"]
    lines = []
    for name, table in tables.items():
        lines += [
            f"[endpoints.{name}]",
            f"api_url = {json.dumps(endpoint['E2B_API_URL'])}",
            f"sandbox_url = {json.dumps(endpoint['E2B_SANDBOX_URL'])}",
            f"key_env = {json.dumps(table['key_env'])}",
            "",
        ]
    target.write_text("\n".join(lines))
    return [table["key_env"] for table in tables.values()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A small run of the embedded endpoint with a quirk (one case non-conformant), in a results directory of
    its own, and the environment every command gets (no E2B_* variable of the caller's)."""
    work = tmp_path_factory.mktemp("docs")
    env = own_environment(work / "results")
    done = checkout_cli("run", "-q", "--quirk", QUIRK, *(f"--case={case}" for case in RECORDED), env=env, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    latest = json.loads((work / "results" / "latest.json").read_text())
    yield Path(latest["run_dir"]), env


def test_list_names_the_cases_the_run_ran(recorded: tuple[Path, dict[str, str]]) -> None:
    """`run --list` selects through the run's own path: the same selection lists exactly the cases it recorded."""
    run_dir, env = recorded
    listed = checkout_cli("run", "--list", "--quirk", QUIRK, *(f"--case={case}" for case in RECORDED), env=env)
    cases = [json.loads(line) for line in (run_dir / "cases.jsonl").read_text().splitlines()]
    ran = sorted(case["id"] for case in cases if not case["id"].startswith("housekeeping/"))

    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.splitlines()[-len(RECORDED) :]) == ran == sorted(RECORDED)
    assert not any(path.name != run_dir.name for path in run_dir.parent.iterdir() if path.is_dir()), "--list made a run"


def test_every_command_of_the_readme_and_docs_runs(recorded: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    run_dir, base_env = recorded
    cases = [json.loads(line) for line in (run_dir / "cases.jsonl").read_text().splitlines()]
    failing = next(case["id"] for case in cases if not case["conformant"])
    history = tmp_path / "history"
    history.mkdir()
    old = history / f"0-{run_dir.name}"
    shutil.copytree(run_dir, old)
    shutil.copytree(run_dir, history / run_dir.name)
    declarations = tmp_path / "declarations.toml"
    declarations.write_text('[endpoint]\nname = "local"\n')

    every, stray = [], []
    for page in pages():
        found, typed = commands_of(page)
        every.append((page, found))
        stray += typed
    with serving() as endpoint, serving_model() as model:
        env = {k: v for k, v in base_env.items() if k not in ENDPOINT_VARS}
        env["E2B_BENCH_ENDPOINTS"] = str(tmp_path / "endpoints.toml")
        for key_env in endpoints_file(REPO / "endpoints.toml.example", tmp_path / "endpoints.toml", endpoint.env()):
            env[key_env] = endpoint.api_key
        values = {
            "RESULTS_DIR": base_env["E2B_BENCH_RESULTS_DIR"],
            "RUN_DIR": str(run_dir),
            "OLD_RUN_DIR": str(old),
            "RUNS_DIR": str(history),
            "CASE_ID": failing,
            "DECLARATIONS": str(declarations),
            "MODEL_URL": model.endpoint.base_url(),
        }
        context = Context(values, env, endpoint.env(), tmp_path)
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda item: run_page(item[0], item[1], context) if item[1] else [], every))
    failures = [failure for result in results for failure in result]
    count = sum(len(found) for _, found in every)

    assert stray == [], "typed as commands outside a bash/sh/console block (fence them as a shell, or drop `./`)"
    assert count > 0
    assert failures == [], "\n\n".join(failures)


def test_a_page_is_read_as_a_reader_types_it(tmp_path: Path) -> None:
    """Continuations joined, comments and output left out, `# exit N` kept, and a command typed in a block that
    is not a shell's reported."""
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```bash\n# a comment\n./e2b-bench run --case 'a/*/b' \\\n  -q   # exit 5\n\necho done\n```\n\n"
        "```console\n$ ./e2b-bench runners\npy-e2b-2.63.0 ...\n```\n\n"
        "```text\n./e2b-bench report x\ne2b-bench run [...]\n```\n"
    )
    found, stray = commands_of(page)

    assert [(c.where, c.text, c.expected) for c in found] == [
        ("page.md:5", "./e2b-bench run --case 'a/*/b'    -q   # exit 5", 5),
        ("page.md:8", "echo done", 0),
        ("page.md:12", "./e2b-bench runners", 0),
    ]
    assert stray == ["page.md:17: ./e2b-bench report x"]
    assert expected_code(found[0]) == 5 and expected_code(Command(page, 1, "./e2b-bench run x  # exit 1", 1)) == 0
