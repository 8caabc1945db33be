"""`e2b-bench`: run suites against an endpoint, serve the embedded endpoint, render reports."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .localbox.server import LocalServer
    from .model import ModelServer

REPO_ROOT = Path(__file__).resolve().parents[1]
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.handler(args, extra)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="e2b-bench",
        description="Conformance and benchmark harness for E2B-compatible endpoints.",
    )
    commands = parser.add_subparsers(dest="command")

    run = commands.add_parser(
        "run",
        help="run the suites against an endpoint, write results/ and a report",
        description="Run the conformance suites (pytest underneath: -k, -x, -m and other pytest options pass through).",
    )
    run.add_argument("--endpoint", default=os.environ.get("E2B_BENCH_ENDPOINT", "local"))
    run.add_argument("--runner", action="append", default=[], help="runner name, repeatable (see `e2b-bench runners`)")
    run.add_argument("--matrix", action="store_true", help="every registered runner (all SDK pins)")
    run.add_argument("--results-dir", default=str(REPO_ROOT / "results"))
    run.add_argument("--step-timeout", type=float, default=90.0)
    run.add_argument("--profile", default="e2b", help="quirk profile of the embedded endpoint (local only)")
    run.add_argument("--quirk", action="append", default=[], help="NAME[=VALUE] quirk of the embedded endpoint")
    run.add_argument("--no-report", action="store_true")
    run.add_argument("--expectations", default=None, help="declarations file (default: the endpoint's)")
    run.add_argument("--include-slow", action="store_true", help="also the cases that wait on purpose (e.g. 60 s)")
    run.add_argument("--shard", default=None, help="K/N: run shard K of N (whole runners); join them with `merge`")
    run.add_argument("suites", nargs="*", default=[], help="suite paths under sandboxes/ (default: all)")
    run.set_defaults(handler=cmd_run)

    serve = commands.add_parser("serve", help="run the embedded E2B-compatible endpoint on loopback")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--api-key", default=None, help="key clients must send (default: a random one)")
    serve.add_argument("--state-dir", type=Path, default=None)
    serve.add_argument("--profile", default="e2b", help="quirk profile (e2b = faithful)")
    serve.add_argument("--quirk", action="append", default=[], help="NAME[=VALUE], repeatable")
    serve.add_argument("--debug-ports", action="store_true", help="also answer on 3000 (API) and 49983 (envd)")
    serve.add_argument("--bench", action="store_true", help="run a short `bench` against this server and exit")
    serve.set_defaults(handler=cmd_serve)

    model = commands.add_parser(
        "model",
        help="run the scripted OpenAI-compatible model on loopback",
        description="Serve /v1/chat/completions and /v1/responses (streamed or not) with the scripted proof-task "
        "policy; every exchange is printed as one redacted JSON line.",
    )
    model.add_argument("--host", default="127.0.0.1")
    model.add_argument("--port", type=int, default=0, help="0 picks a free port")
    model.set_defaults(handler=cmd_model)

    report = commands.add_parser("report", help="render the HTML report and Markdown summary of run directories")
    report.add_argument("run_dirs", nargs="+", type=Path)
    report.add_argument("--out", type=Path, default=None, help="default: reports/out/")
    report.set_defaults(handler=cmd_report)

    bench = commands.add_parser(
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
    bench.add_argument("--max-seconds", type=float, default=120.0, help="wall-clock limit of the measurements")
    bench.add_argument("--transfer-mib", type=float, default=20.0, help="size of the upload and download")
    bench.add_argument("--results-dir", default=str(REPO_ROOT / "results"))
    bench.add_argument("--no-report", action="store_true")
    bench.set_defaults(handler=cmd_bench)

    detect = commands.add_parser(
        "detect", help="prove every quirk of the embedded endpoint is flagged (probes + refusals, one run per quirk)"
    )
    detect.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results")
    detect.set_defaults(handler=cmd_detect)

    merge = commands.add_parser(
        "merge",
        help="join the run directories of one sharded run (`run --shard K/N`) into one run, JUnit and report",
        description="Refuses directories that are not shards of one run; a missing or truncated shard is an "
        "error case of the merged run (exit 1).",
    )
    merge.add_argument("run_dirs", nargs="+", type=Path)
    merge.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results")
    merge.add_argument("--no-report", action="store_true")
    merge.set_defaults(handler=cmd_merge)

    from .load import add_load_parser

    add_load_parser(commands)

    runners = commands.add_parser("runners", help="list the runners (client environments and their pins)")
    runners.set_defaults(handler=cmd_runners)
    return parser


def cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    suites = args.suites or [str(REPO_ROOT / name) for name in ("sandboxes", "frameworks")]
    pytest_args = [
        *suites,
        "--bench",
        "--endpoint", args.endpoint,
        "--results-dir", args.results_dir,
        "--step-timeout", str(args.step_timeout),
        "--quirk-profile", args.profile,
        "-p", "no:cacheprovider",
        "--rootdir", str(REPO_ROOT),
        "-c", str(REPO_ROOT / "pyproject.toml"),
        "-q", "-rfE",
        *(f"--runner={name}" for name in args.runner),
        *(f"--quirk={quirk}" for quirk in args.quirk),
        *(["--matrix"] if args.matrix else []),
        *(["--no-report"] if args.no_report else []),
        *(["--expectations", args.expectations] if args.expectations else []),
        *(["--shard", args.shard] if args.shard else []),
        *([] if args.include_slow or "-m" in extra else ["-m", "not slow and not bench"]),
        *extra,
    ]  # fmt: skip
    os.chdir(REPO_ROOT)
    code = int(pytest.main(pytest_args))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("e2b-bench: no case matched the selection", file=sys.stderr)
    return code


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    from .localbox.quirks import QuirkError, build
    from .localbox.server import HostError, LocalServer
    from .localbox.template import TemplateError

    try:
        quirks = build(args.profile, args.quirk)
        server = LocalServer(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            state_dir=args.state_dir,
            quirks=quirks,
            debug_ports=args.debug_ports,
        )
    except (HostError, TemplateError, QuirkError, OSError) as exc:
        print(f"e2b-bench serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    endpoint = server.endpoint
    if args.bench:  # `e2b-bench bench` on this server: 30 samples, the Python SDK, quirks as given
        from .benchmark import BenchOptions, run_bench

        options = BenchOptions(runners=("py-e2b-2.63.0",), count=30, results_dir=REPO_ROOT / "results", report=False)
        return run_bench(options, server=server)
    active = quirks.active()
    print(f"# e2b-bench embedded endpoint (profile {args.profile}{f', quirks {active}' if active else ''})")
    for name, value in endpoint.env().items():
        print(f"export {name}={value}")
    if args.debug_ports:
        print("# also answering E2B_DEBUG=true clients on 127.0.0.1:3000 (API) and 127.0.0.1:49983 (envd)")
    print("# stop with Ctrl-C: every sandbox is killed and its files removed", flush=True)
    return in_foreground(server)


def in_foreground(server: LocalServer | ModelServer) -> int:
    """Serve until Ctrl-C or SIGTERM; uvicorn shuts down cleanly, then re-raises the signal: exit 0."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0


def cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    from .benchmark import BenchError, BenchOptions, parse_modes, run_bench

    try:
        modes = parse_modes(args.modes)
    except BenchError as exc:
        print(f"e2b-bench bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = BenchOptions(
        endpoint=args.endpoint,
        runners=tuple(args.runner),
        count=args.count,
        modes=modes,
        interval_ms=args.interval_ms,
        max_seconds=args.max_seconds,
        results_dir=Path(args.results_dir),
        transfer_mib=args.transfer_mib,
        report=not args.no_report,
        argv=tuple(sys.argv),
    )
    # Ctrl-C and SIGTERM both end in the benchmark's clean-up (interrupted, exit 130).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return run_bench(options)


def cmd_model(args: argparse.Namespace, extra: list[str]) -> int:
    import json

    from .model import ModelServer

    def show(exchange: dict) -> None:
        print(json.dumps(exchange, ensure_ascii=False), flush=True)

    try:
        server = ModelServer(host=args.host, port=args.port, on_exchange=show)
    except OSError as exc:
        print(f"e2b-bench model: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"# e2b-bench scripted model: base URL {server.endpoint.base_url()} (model {server.endpoint.model})")
    print("# any API key works; stop with Ctrl-C", flush=True)
    return in_foreground(server)


def cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    from .report import render
    from .results import RunError

    out = args.out or REPO_ROOT / "reports" / "out"
    try:
        paths = render(args.run_dirs, out)
    except RunError as exc:
        print(f"e2b-bench report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report: {paths.html}")
    print(f"summary: {paths.markdown}")
    return 0


def cmd_detect(args: argparse.Namespace, extra: list[str]) -> int:
    from .detection import main as detect_main

    return detect_main(args.results_dir)


def cmd_merge(args: argparse.Namespace, extra: list[str]) -> int:
    from .results import RunError
    from .shards import merge

    try:
        merged = merge(args.run_dirs, args.results_dir, report=not args.no_report)
    except RunError as exc:
        print(f"e2b-bench merge: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
