"""`e2b-bench`: run suites against an endpoint, serve the embedded endpoint, render reports."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .exits import EPILOG, ExitCode, interrupt_deferred, interrupt_on_sigterm, interrupted_code, signal_received
from .listing import LIST_HELP
from .paths import DATA_ROOT, PYTEST_INI, REFERENCED_SUITES, REPORTS_OUT, RESULTS_DIR, SUITE_DIRS
from .remote.budget import MAX_MINUTES_HELP, MAX_SANDBOXES_HELP
from .remote.slowness import STEP_TIMEOUT_HELP

if TYPE_CHECKING:
    from .localbox.server import LocalServer
    from .model import ModelServer

ENVIRONMENT = """environment variables read:
  E2B_BENCH_ENDPOINT   default of --endpoint (local)
  E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN   the `env` endpoint (as the SDKs read them)
  E2B_BENCH_CACHE      where runner environments, the sandbox template and the report's compiled templates
                       are cached (~/.cache/e2b-bench)
  E2B_BENCH_NODE       the `node` that runs the Node runners (default: node on PATH)
  E2B_BENCH_UPSTREAM_SOURCE  default of --upstream-source (E2B's SDK source tree of the upstream suite)
  E2B_BENCH_RESULTS_DIR default of --results-dir and of report's --out (results/ of the checkout)
  E2B_BENCH_ENDPOINTS  the endpoints.toml of named endpoints (endpoints.toml of the checkout)
  E2B_BENCH_PROGRESS_S seconds between `run`'s progress lines when the output is not a terminal (30)
  the variable named by --model-key-env, or by key_env of an endpoints.toml table
"""
SUITE_MARK = re.compile(r"""@pytest\.mark\.suite\(["'](?P<suite>[\w-]+)["']\)\s*\ndef (?P<function>\w+)""")

POOL_HELP = "sandboxes the embedded endpoint keeps prepared ahead of creates (default 4; past them, made on demand)"


class UsageError(Exception):
    """A command line or environment that cannot work; the message says what to change (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    try:
        with interrupt_on_sigterm():  # first, so that a SIGTERM at any moment of start-up ends like Ctrl-C
            code = _main(argv)
        return interrupted_code() if interrupt_deferred() else code
    except KeyboardInterrupt:
        return interrupted_code()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return ExitCode.USAGE
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.handler(args, extra))
    except UsageError as exc:
        print(f"e2b-bench {args.command}: {exc}", file=sys.stderr)
        return ExitCode.USAGE


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default said once: added where its help does not say it already and there is one to say
    (no "(default: None)", "False" or "[]"); epilogs kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = action.help or ""
        default = action.default
        quiet = default is None or default is False or default == [] or default is argparse.SUPPRESS
        if "default" in help.lower() or quiet or not action.option_strings or action.nargs == 0:
            return help
        return f"{help} (default: %(default)s)"


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, *, help: str, description: str = ""
) -> argparse.ArgumentParser:
    return commands.add_parser(
        name, help=help, description=description or None, formatter_class=_Formatter, epilog=EPILOG + ENVIRONMENT
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="e2b-bench",
        description="Conformance and benchmark harness for E2B-compatible endpoints.",
        formatter_class=_Formatter,
        epilog=EPILOG + ENVIRONMENT,
    )
    commands = parser.add_subparsers(dest="command")

    run = _command(
        commands,
        "run",
        help="run the suites against an endpoint, write results/ and a report",
        description="Run the conformance suites (pytest underneath: -k, -x, -m and other pytest options pass "
        "through, before or after the suites).",
    )
    run.add_argument("--endpoint", default=os.environ.get("E2B_BENCH_ENDPOINT", "local"), help="local | env | NAME")
    run.add_argument("--runner", action="append", default=[], help="runner name, repeatable (see `e2b-bench runners`)")
    run.add_argument("--matrix", action="store_true", help="every registered runner (all SDK pins)")
    run.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where run directories go")
    run.add_argument("--step-timeout", type=float, default=90.0, help=STEP_TIMEOUT_HELP)
    run.add_argument("--max-sandboxes", type=int, default=None, metavar="N", help=MAX_SANDBOXES_HELP)
    run.add_argument("--max-minutes", type=float, default=None, metavar="M", help=MAX_MINUTES_HELP)
    run.add_argument("--profile", default="e2b", help="quirk profile of the embedded endpoint (local only)")
    run.add_argument("--quirk", action="append", default=[], help="NAME[=VALUE] quirk of the embedded endpoint")
    run.add_argument("--no-report", action="store_true", help="do not render the report")
    run.add_argument("--no-differential", action="store_true", help="do not judge cases against their reference traces")
    run.add_argument(
        "--differential",
        action="store_true",
        help="judge against the reference traces also an embedded endpoint given quirks or a profile "
        "(by default it is judged by its declarations alone)",
    )
    run.add_argument("--expectations", default=None, help="declarations file (default: the endpoint's)")
    run.add_argument("--include-slow", action="store_true", help="also the cases that wait on purpose (e.g. 60 s)")
    run.add_argument("--model-base-url", default=None, help="a real OpenAI-compatible model for the frameworks")
    run.add_argument("--model", default=None, help="model name to ask for (with --model-base-url)")
    run.add_argument("--model-key-env", default=None, help="NAME of the variable holding the model's key")
    run.add_argument("--attempts", type=int, default=2, help="tries of a framework's proof task before it fails")
    run.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only the cases whose id (suite/runner/case, as in the report) is PATTERN or matches it as an fnmatch "
        "pattern, repeatable; picks the runner it names and runs a slow case too",
    )
    run.add_argument("--reference", type=Path, default=None, metavar="RUN",
                     help="a run of the same cases against a reference endpoint: each failing case shows its first "
                     "wire difference from it (terminal and report)")  # fmt: skip
    run.add_argument("-q", "--quiet", action="store_true", help="print only the closing verdict line")
    run.add_argument("-v", "--verbose", action="store_true", help="also each case as it ends and harness warnings")
    run.add_argument("-k", dest="keyword", default=None, help="pytest -k: only cases matching the expression")
    run.add_argument("-m", dest="markexpr", default=None, help="pytest -m (default: not slow and not bench)")
    run.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first non-conformant case")
    run.add_argument(
        "--wire-bodies",
        type=int,
        nargs="?",
        const=4096,
        default=None,
        metavar="BYTES",
        help="also log the first BYTES (default 4096) of each request and response body, redacted, in wire/*.jsonl",
    )
    run.add_argument(
        "--upstream-source",
        type=Path,
        default=None,
        metavar="PATH",
        help="E2B's SDK source tree for the upstream suite (a checkout of E2B's repository; default: "
        "$E2B_BENCH_UPSTREAM_SOURCE, else ../shared/reference/e2b-sdk-source beside the checkout)",
    )
    run.add_argument("--list", action="store_true", dest="list_cases", help=LIST_HELP)
    run.add_argument("--shard", default=None, help="K/N: run shard K of N (whole runners); join them with `merge`")
    run.add_argument("suites", nargs="*", default=[], help="suite names (e.g. quickstart, probes) or paths")
    run.set_defaults(handler=cmd_run)

    serve = _command(commands, "serve", help="run the embedded E2B-compatible endpoint on loopback")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--api-key", default=None, help="key clients must send (default: a random one)")
    serve.add_argument("--state-dir", type=Path, default=None)
    serve.add_argument("--profile", default="e2b", help="quirk profile (e2b = faithful)")
    serve.add_argument("--quirk", action="append", default=[], help="NAME[=VALUE], repeatable")
    serve.add_argument("--debug-ports", action="store_true", help="also answer on 3000 (API) and 49983 (envd)")
    serve.add_argument("--pool", type=int, default=None, metavar="N", help=POOL_HELP)
    serve.add_argument("--bench", action="store_true", help="run a short `bench` against this server and exit")
    serve.set_defaults(handler=cmd_serve)

    model = _command(
        commands,
        "model",
        help="run the scripted OpenAI-compatible model on loopback",
        description="Serve /v1/chat/completions and /v1/responses (streamed or not) with the scripted proof-task "
        "policy; every exchange is printed as one redacted JSON line.",
    )
    model.add_argument("--host", default="127.0.0.1")
    model.add_argument("--port", type=int, default=0, help="0 picks a free port")
    model.set_defaults(handler=cmd_model)

    report = _command(commands, "report", help="render the HTML report and Markdown summary of run directories")
    report.add_argument("run_dirs", nargs="*", type=Path)
    report.add_argument("--out", type=Path, default=REPORTS_OUT, help="where report.html and summary.md go")
    report.add_argument("--baseline", type=Path, default=None, help="RUN to compare the one run directory with")
    report.add_argument("--fail-on-new", action="store_true", help="with --baseline: exit 1 on a new failure")
    report.add_argument("--duration-factor", type=float, default=2.0, help="with --baseline: slower/faster factor")
    report.add_argument(
        "--history", type=Path, default=None, help="DIR of runs: the cases whose outcome changed, flaky cases, trends"
    )
    report.add_argument("--all", action="store_true", dest="every_case", help="with --history: every case's row")
    report.add_argument(
        "--causes", action="store_true", help="print each run's failing cases grouped by cause (no files written)"
    )
    report.set_defaults(handler=cmd_report)

    expectations = _command(
        commands,
        "expectations",
        help="write declarations (expectations/*.toml) from a run: one per cause of its failing cases",
        description="Each cause of the run's non-conformant cases becomes one declaration (patterns covering exactly "
        "its cases, the outcome the judge compares, `match` a fragment of the endpoint's words, `reason` its "
        "message), added to FILE or updating it: reasons a person wrote are kept; declarations of cases that now "
        "pass are listed as stale and removed with --prune. Only a finished run is declared from; the failures "
        "are run again once against the same endpoint and only those that recur are declared; harness faults, "
        "runner deaths, cases not run, the leak check and transient or capacity answers never are.",
    )
    expectations.add_argument("run_dir", type=Path, metavar="RUN")
    expectations.add_argument("--write", type=Path, required=True, metavar="FILE", help="declarations file to write")
    expectations.add_argument("--prune", action="store_true", help="remove the stale declarations")
    expectations.add_argument(
        "--finished-only", action="store_true", help="from a run that did not finish: declare only its finished cases"
    )
    expectations.add_argument(
        "--no-confirm", action="store_true", help="declare the failures without running them again to confirm them"
    )
    expectations.set_defaults(handler=cmd_expectations)

    reference = _command(
        commands,
        "reference",
        help="record the reference traces the differential judgement compares each case with",
        description="Run the suites RUNS times against the embedded endpoint (faithful, the differential judgement "
        "off) and, with --write, store each case's traces of the runs where it passed as "
        "sandboxes/e2b/reference/<suite>/<runner>.jsonl (reviewed like code). --from RUN... makes them from "
        "runs already made instead.",
    )
    reference.add_argument("--runner", action="append", default=[], help="runner name, repeatable (default: run's)")
    reference.add_argument("--case", action="append", default=[], metavar="PATTERN", help="as run's --case")
    reference.add_argument("-k", dest="keyword", default=None, help="pytest -k: only cases matching the expression")
    reference.add_argument("--write", action="store_true", help="write the reference files (else: only run)")
    reference.add_argument("--runs", type=int, default=2, help="runs to record (values that vary are judged by shape)")
    reference.add_argument("--from", dest="from_runs", type=Path, nargs="+", default=None, metavar="RUN")
    reference.add_argument(
        "suites",
        nargs="*",
        default=[],
        help=f"suite names (default: those judged by reference: {', '.join(REFERENCED_SUITES)})",
    )
    reference.set_defaults(handler=cmd_reference)

    bench = _command(
        commands,
        "bench",
        help="time the SDKs against an endpoint, as ratios to local baselines; write results/ and a report",
        description="Time to interactive (sequential, staggered, burst), commands.run('true') and 20 MiB transfers "
        "for each runner, next to a bare spawn, a loopback round trip and a disk copy measured in the same run.",
    )
    bench.add_argument("--endpoint", default=os.environ.get("E2B_BENCH_ENDPOINT", "local"))
    bench.add_argument(
        "--runner", action="append", default=[], help="runner name, repeatable (default: one per language)"
    )
    bench.add_argument(
        "-n",
        type=int,
        default=None,
        dest="count",
        help="samples per measure (default 100 on the embedded endpoint; required elsewhere)",
    )
    bench.add_argument("--modes", default="sequential,staggered,burst", help="time-to-interactive modes")
    bench.add_argument("--interval-ms", type=float, default=50.0, help="launch interval of the staggered mode")
    bench.add_argument("--max-seconds", type=float, default=180.0, help="wall-clock limit of the measurements")
    bench.add_argument("--transfer-mib", type=float, default=20.0, help="size of the upload and download")
    bench.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where run directories go")
    bench.add_argument("--no-report", action="store_true", help="do not render the report")
    bench.add_argument("--gate", action="store_true", help="a missed performance target fails its measure (exit 1)")
    bench.add_argument("--pool", type=int, default=None, metavar="N", help=POOL_HELP + "; measured once they are")
    bench.set_defaults(handler=cmd_bench)

    detect = _command(
        commands,
        "detect",
        help="prove every quirk of the embedded endpoint is flagged (probes + refusals, one run per quirk)",
    )
    detect.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where run directories go")
    detect.set_defaults(handler=cmd_detect)

    merge = _command(
        commands,
        "merge",
        help="join the run directories of one sharded run (`run --shard K/N`) into one run, JUnit and report",
        description="Refuses directories that are not shards of one run; a missing or truncated shard is an "
        "error case of the merged run (exit 1).",
    )
    merge.add_argument("run_dirs", nargs="+", type=Path)
    merge.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    merge.add_argument("--no-report", action="store_true")
    merge.set_defaults(handler=cmd_merge)

    from .loadcli import add_load_parser

    add_load_parser(commands, cmd_load)

    from .repro.cli import add_parsers as add_repro_parsers

    add_repro_parsers(commands, _command)

    runners = _command(commands, "runners", help="list the runners (client environments and their pins)")
    runners.set_defaults(handler=cmd_runners)
    return parser


def cmd_load(args: argparse.Namespace, extra: list[str]) -> int:
    from .load import cmd_load as run_load

    return run_load(args, extra)


def cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    from .selection import SelectionError, check_model, select
    from .shards import Shard, ShardError
    from .upstream.source import SOURCE_ENV, SourceError, python_sdk

    try:  # checked here too, so that a mistake is one sentence and exit 2 before pytest starts
        select(args.endpoint, profile=args.profile, quirks=args.quirk, expectations=args.expectations,
               runners=args.runner, matrix=args.matrix)  # fmt: skip
        if args.shard:
            Shard.parse(args.shard)
        check_model(args.model_base_url, args.model, args.model_key_env)
    except (SelectionError, ShardError) as exc:
        raise UsageError(str(exc)) from None
    collect_only = {"--co", "--collect-only"}
    if collect_only & set(extra):  # pytest's collection alone would record an empty run: it is what --list does
        args.list_cases, extra = True, [arg for arg in extra if arg not in collect_only]
    if args.reference is not None and not (args.reference / "run.json").is_file():
        raise UsageError(f"--reference {args.reference} is not a run directory (no run.json)")
    suites = [suite_target(name) for name in args.suites] or [str(path) for path in SUITE_DIRS]
    ignored = source_suites_ignored(args.suites, args.case)
    if args.upstream_source is not None:
        os.environ[SOURCE_ENV] = str(args.upstream_source.expanduser().resolve())  # read by the listing and the env
    if len(ignored) < len(source_suites_ignored([], [])):  # a source-tree suite is asked for: its tree must be there
        try:
            python_sdk()
        except SourceError as exc:
            raise UsageError(str(exc)) from None
    # Cases named with --case run even when slow: they were asked for by name.
    markexpr = args.markexpr or ("" if args.include_slow else "not bench" if args.case else "not slow and not bench")
    pytest_args = [
        *suites,
        "--bench",
        "--endpoint", args.endpoint,
        "--results-dir", str(writable_dir(args.results_dir)),
        "--step-timeout", str(positive(args.step_timeout, "--step-timeout")),
        "--quirk-profile", args.profile,
        "--attempts", str(int(positive(args.attempts, "--attempts"))),
        "-p", "bench.plugin",
        "-p", "no:cacheprovider",
        # no suite is async: anyio's plugin would only cost each run a rewrite of anyio's asyncio backend
        "-p", "no:anyio",
        *_plugin_autoload(extra),
        "--rootdir", str(DATA_ROOT),
        "-c", str(PYTEST_INI),
        "-q", "-rfE",
        *(f"--runner={name}" for name in args.runner),
        *(f"--quirk={quirk}" for quirk in args.quirk),
        *(["--matrix"] if args.matrix else []),
        *(["--no-report"] if args.no_report else []),
        *(["--expectations", str(Path(args.expectations).resolve())] if args.expectations else []),
        *(["--model-base-url", args.model_base_url] if args.model_base_url else []),
        *(["--model", args.model] if args.model else []),
        *(["--model-key-env", args.model_key_env] if args.model_key_env else []),
        *(["-k", args.keyword] if args.keyword else []),
        *(["-m", markexpr] if markexpr else []),
        *(["-x"] if args.exitfirst else []),
        *(["--shard", args.shard] if args.shard else []),
        *(["--list-cases"] if args.list_cases else []),
        *(f"--case={pattern}" for pattern in args.case),
        *(f"--ignore={path}" for path in ignored),
        *(["--max-sandboxes", str(int(positive(args.max_sandboxes, "--max-sandboxes")))]
          if args.max_sandboxes is not None else []),
        *(["--max-minutes", str(positive(args.max_minutes, "--max-minutes"))] if args.max_minutes is not None else []),
        *extra,
    ]  # fmt: skip
    quirked = bool(args.quirk) or (args.profile is not None and args.profile != "e2b")
    if args.no_differential or (quirked and not args.differential):
        from .differential.capture import DIFFERENTIAL_ENV

        # Read by every wire proxy and the judgement of the run. The embedded endpoint with quirks of its own is
        # judged by its declarations (written from runs without the judgement) unless --differential is given;
        # an environment that says otherwise (`detect`, E2B_BENCH_DIFFERENTIAL) is kept.
        if args.no_differential or DIFFERENTIAL_ENV not in os.environ:
            os.environ[DIFFERENTIAL_ENV] = "0"
    if args.wire_bodies is not None:
        from .wire import WIRE_BODIES_ENV

        os.environ[WIRE_BODIES_ENV] = str(args.wire_bodies)  # read by every wire proxy of the run
    from .triage.console import Console

    console = Console(verbosity=-1 if args.quiet else 1 if args.verbose else 0)
    code = int(pytest.main(pytest_args, plugins=[console]))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        why = console.empty_selection or "no case matched the selection (check -k, -m, --case and the suite names)"
        print(f"e2b-bench run: {why}", file=sys.stderr)
        return ExitCode.NO_CASES
    # pytest's own codes for a bad command line or an interruption before the run started
    if code == pytest.ExitCode.USAGE_ERROR:
        return ExitCode.USAGE
    # pytest says 2 for an interruption; the plugin's `pytest.exit` says 2 (ExitCode.USAGE) for a failed preflight
    return interrupted_code() if code == pytest.ExitCode.INTERRUPTED and signal_received() else code


def _plugin_autoload(extra: list[str]) -> list[str]:
    """A run needs only its own pytest plugin. The environment's others (loaded from their entry points) cost
    every run their imports and the rewriting of their packages' modules (anyio's, which the endpoint and every
    HTTP client import, among them): they are loaded only when the command line, or PYTEST_ADDOPTS, carries
    pytest options one of them may be asked for."""
    return [] if extra or os.environ.get("PYTEST_ADDOPTS") else ["--disable-plugin-autoload"]


def suite_target(name: str) -> str:
    """A suite name (`probes`) as the pytest node of its test function; anything else is a path."""
    known = suite_nodes()
    if name in known:
        return known[name]
    path = Path(name.split("::")[0])
    if not path.exists():
        raise UsageError(f"unknown suite {name!r}: give one of {', '.join(sorted(known))} or a path to a suite module")
    return str(path.resolve()) + name[len(name.split("::")[0]) :]


def source_suites_ignored(named: list[str], cases: list[str]) -> list[str]:
    """The folders of the suites whose steps are a source tree's tests (E2B's own, `steps_from`) that a run leaves
    out: such a suite runs only when named, as a suite or by the first part of a `--case` pattern (it is long and
    needs the tree)."""
    from .runners.manifest import load_manifest

    tables = load_manifest()
    modules = suite_nodes()
    ignored = []
    for suite, tables_of in tables.items():
        if not any(isinstance(t, dict) and "steps_from" in t for t in tables_of.values()) or suite not in modules:
            continue
        asked = suite in named or any(fnmatch.fnmatchcase(suite, p.split("/", 1)[0]) for p in cases)
        if not asked:
            ignored.append(str(Path(modules[suite].split("::")[0]).parent))
    return ignored


def suite_nodes() -> dict[str, str]:
    """Every suite name with its test function (`sandboxes/e2b/test_probes.py::test_probes`)."""
    found = {}
    for root in SUITE_DIRS:
        for module in sorted(root.rglob("test_*.py")):
            for match in SUITE_MARK.finditer(module.read_text("utf-8")):
                found[match["suite"]] = f"{module}::{match['function']}"
    return found


def writable_dir(path: Path) -> Path:
    """`path` (made if missing) as an absolute path, or a UsageError naming the problem."""
    path = path.resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the results directory {path} ({exc.strerror}): choose another with --results-dir"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"the results directory {path} is not writable: choose another with --results-dir")
    return path


def pool_size(value: int | None) -> int | None:
    """`--pool N` as given (None: the endpoint's default), or a UsageError naming what it takes."""
    from .localbox.registry import POOL_MAX

    if value is not None and not 0 <= value <= POOL_MAX:
        raise UsageError(f"--pool takes a number of sandboxes from 0 to {POOL_MAX}, not {value}")
    return value


def positive(value: float, flag: str) -> float:
    if not value > 0:
        raise UsageError(f"{flag} must be positive, not {value:g}")
    return value


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    from .localbox.quirks import QuirkError, build
    from .localbox.registry import POOL_SIZE
    from .localbox.server import HostError, LocalServer
    from .localbox.template import TemplateError

    pool = pool_size(args.pool)
    try:
        quirks = build(args.profile, args.quirk)
        server = LocalServer(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            state_dir=args.state_dir,
            quirks=quirks,
            debug_ports=args.debug_ports,
            pool_size=POOL_SIZE if pool is None else pool,
        )
    except (HostError, TemplateError, QuirkError, OSError) as exc:
        print(f"e2b-bench serve: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    endpoint = server.endpoint
    if args.bench:  # `e2b-bench bench` on this server: 30 samples, the Python SDK, quirks as given
        from .benchmark import BenchOptions, run_bench

        options = BenchOptions(runners=("py-e2b-2.63.0",), count=30, results_dir=RESULTS_DIR, report=False)
        return run_bench(options, server=server)
    active = quirks.active()
    print(f"# e2b-bench embedded endpoint (profile {args.profile}{f', quirks {active}' if active else ''})")
    for name, value in endpoint.env().items():
        if name == "E2B_API_KEY":  # a terminal's scrollback and a CI log are no place for it
            value = f'"$(cat {server.key_file()})"'
        print(f"export {name}={value}")
    if args.debug_ports:
        print("# also answering E2B_DEBUG=true clients on 127.0.0.1:3000 (API) and 127.0.0.1:49983 (envd)")
    print("# stop with Ctrl-C: every sandbox is killed and its files removed", flush=True)
    return in_foreground(server)


def in_foreground(server: LocalServer | ModelServer) -> int:
    """Serve until Ctrl-C or SIGTERM (see `main`); uvicorn shuts down cleanly, then re-raises the signal: exit 0."""
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0


def cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    from .benchmark import BenchError, BenchOptions, parse_modes, run_bench

    try:
        modes = parse_modes(args.modes)
    except BenchError as exc:
        print(f"e2b-bench bench: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    options = BenchOptions(
        endpoint=args.endpoint,
        runners=tuple(args.runner),
        count=args.count,
        modes=modes,
        interval_ms=args.interval_ms,
        max_seconds=args.max_seconds,
        results_dir=writable_dir(args.results_dir),
        transfer_mib=args.transfer_mib,
        report=not args.no_report,
        argv=tuple(sys.argv),
        gate=args.gate,
        pool=pool_size(args.pool),
    )
    return run_bench(options)  # Ctrl-C and SIGTERM end in the benchmark's clean-up (interrupted, exit 130 or 143)


def cmd_model(args: argparse.Namespace, extra: list[str]) -> int:
    import json

    from .model import ModelServer

    def show(exchange: dict) -> None:
        print(json.dumps(exchange, ensure_ascii=False), flush=True)

    try:
        server = ModelServer(host=args.host, port=args.port, on_exchange=show)
    except OSError as exc:
        print(f"e2b-bench model: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"# e2b-bench scripted model: base URL {server.endpoint.base_url()} (model {server.endpoint.model})")
    print("# any API key works; stop with Ctrl-C", flush=True)
    return in_foreground(server)


def cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    from .compare import report_command
    from .results import RunError, read_run

    try:
        if args.causes:
            from .triage.causes import terminal_lines

            if not args.run_dirs:
                raise UsageError("--causes needs the run directories to print (e.g. results/<run>)")
            for path in args.run_dirs:
                print("\n".join(terminal_lines(read_run(path, allow_truncated=True))))
            return ExitCode.OK
        return report_command(
            args.run_dirs,
            args.out,
            baseline=args.baseline,
            history=args.history,
            every_case=args.every_case,
            fail_on_new=args.fail_on_new,
            factor=args.duration_factor,
        )
    except RunError as exc:
        print(f"e2b-bench report: {exc}", file=sys.stderr)
        return ExitCode.USAGE


def cmd_expectations(args: argparse.Namespace, extra: list[str]) -> int:
    from .expectations import ExpectationsError
    from .results import RunError, read_run
    from .triage.declare import DeclareError, rerun, update_file

    try:
        run = read_run(args.run_dir, allow_truncated=True)
        confirm = None if args.no_confirm else rerun
        change = update_file(run, args.write, args.prune, args.finished_only, confirm)
    except (RunError, ExpectationsError, DeclareError, OSError) as exc:
        raise UsageError(str(exc)) from None
    for line in change.lines():
        print(line)
    return ExitCode.OK


def cmd_reference(args: argparse.Namespace, extra: list[str]) -> int:
    from .differential.reference import record_runs, write_references

    runs = args.from_runs
    if runs is None:
        chosen = [*(f"--runner={name}" for name in args.runner), *(f"--case={pattern}" for pattern in args.case)]
        chosen += ["-k", args.keyword] if args.keyword else []
        code, runs = record_runs(args.suites or list(REFERENCED_SUITES), int(positive(args.runs, "--runs")), chosen)
        if code != ExitCode.OK:
            print(f"e2b-bench reference: a run was not conformant (exit {code}); nothing written", file=sys.stderr)
            return code
    if args.write:
        for path in write_references(runs):
            print(f"e2b-bench reference: wrote {path}")
    return ExitCode.OK


def cmd_detect(args: argparse.Namespace, extra: list[str]) -> int:
    from .detection import main as detect_main

    return detect_main(writable_dir(args.results_dir))


def cmd_merge(args: argparse.Namespace, extra: list[str]) -> int:
    from .results import RunError
    from .shards import merge

    try:
        merged = merge(args.run_dirs, args.results_dir, report=not args.no_report)
    except RunError as exc:
        print(f"e2b-bench merge: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    for problem in merged.problems:
        print(f"e2b-bench merge: {problem}", file=sys.stderr)
    print(f"run directory: {merged.path}")
    return merged.exit_code


def cmd_runners(args: argparse.Namespace, extra: list[str]) -> int:
    from .runners.catalog import available_runners, default_runners

    defaults = {r.name for r in default_runners()}
    for runner in available_runners().values():
        pins = ", ".join(f"{k}=={v}" for k, v in sorted(runner.pins.items()))
        print(f"{runner.name:24} {runner.language:7} {pins}{'  (default)' if runner.name in defaults else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
