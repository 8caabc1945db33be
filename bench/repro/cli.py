"""The subcommands that turn a failing case into something a stranger can run: `repro` (and, registered here
too, the others of bench/repro/). bench/cli.py only calls `add_parsers`."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.exits import ExitCode

if TYPE_CHECKING:
    from bench.results import Run
    from bench.runners.catalog import Runner

Command = Callable[..., argparse.ArgumentParser]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser], command: Command) -> None:
    repro = command(
        commands,
        "repro",
        help="write a standalone reproduction of one case of a run (a script, its pins and a README)",
        description="The script runs the case's step with the runner's own client code and pins, no harness and "
        "no model: exit 0 where the endpoint behaves as E2B does, 1 printing the symptom where it does not.",
    )
    repro.add_argument("run_dir", type=Path, metavar="RUN", help="a run directory")
    repro.add_argument("--case", required=True, metavar="ID", help="the case id (suite/runner/case) or a pattern")
    repro.add_argument("--out", type=Path, default=None, metavar="DIR", help="where to write it (RUN/repro/<case>)")
    repro.set_defaults(handler=cmd_repro)

    diff = command(
        commands,
        "diff",
        help="the first wire exchange of a case that differs between two runs (e.g. the reference and yours)",
        description="Ids, tokens, times and ports normalized; shown side by side. Without --case: each case whose "
        "outcome differs between the runs (at most 10). Exit 0 no difference, 1 a difference, 2 unusable input.",
    )
    diff.add_argument("run_a", type=Path, metavar="RUN_A", help="a run directory (e.g. against the reference)")
    diff.add_argument("run_b", type=Path, metavar="RUN_B", help="a run directory (e.g. against the endpoint)")
    diff.add_argument("--case", default=None, metavar="ID", help="the case id (suite/runner/case)")
    diff.set_defaults(handler=cmd_diff)

    bisect = command(
        commands,
        "bisect",
        help="the first release of a package (SDK or framework) with which a case fails on the endpoint",
        description="Each version is a runner environment of its own (cached) and one `run --case` against the "
        "endpoint; --good must pass and --bad fail, then a binary search over the releases between them. "
        "Prints 'first bad NAME X (last good W)' and a block to paste into an issue; writes bisect.json.",
    )
    bisect.add_argument(
        "--case", required=True, metavar="ID", help="suite/runner/case; the runner part may be a pattern"
    )
    bisect.add_argument("--package", required=True, metavar="NAME", help="the package whose releases are tried")
    bisect.add_argument("--good", default=None, metavar="V", help="a release that passes (default: the oldest of "
                        "--bad's major line)")  # fmt: skip
    bisect.add_argument("--bad", default=None, metavar="V", help="a release that fails (default: the runner's pin)")
    _endpoint_flags(bisect)
    bisect.set_defaults(handler=cmd_bisect)

    span = command(
        commands,
        "range",
        help="the endpoint's compatibility with every release of a package: range.json and a table to publish",
        description="One run of the suites (or --case patterns) per release, the newest patch of each minor release "
        "by default; which pass, and each cause's first and last release.",
    )
    span.add_argument("suites", nargs="*", help="suites to run (default: the runner's)")
    span.add_argument("--package", required=True, metavar="NAME", help="the package whose releases are tried")
    span.add_argument("--from", dest="start", default=None, metavar="V", help="the oldest release to try")
    span.add_argument("--to", dest="end", default=None, metavar="V", help="the newest (default: the runner's pin)")
    span.add_argument("--runner", default=None, help="the runner whose pin is varied (default: the first pinning it)")
    span.add_argument("--every", action="store_true", help="every release, not only each minor's newest patch")
    span.add_argument("--case", action="append", default=[], metavar="PATTERN", help="as `run --case`")
    _endpoint_flags(span)
    span.set_defaults(handler=cmd_range)


def cmd_repro(args: argparse.Namespace, extra: list[str]) -> int:
    from bench.results import InvalidRun, NotARun, read_run
    from bench.runners.catalog import available_runners

    from .standalone import ReproError, find_case, write_repro

    try:
        run = read_run(args.run_dir, allow_truncated=True)
        case = find_case(run, args.case)
        out = args.out if args.out is not None else args.run_dir / "repro" / slug(case.id)
        written = write_repro(run, case.id, out, {**available_runners(), **run_versions(run)})
    except (ReproError, NotARun, InvalidRun) as exc:
        print(f"e2b-bench repro: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"repro of {case.id} ({case.outcome}) written to {written.directory}")
    print(f"  run it there with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set: {written.command}")
    return 0


def cmd_diff(args: argparse.Namespace, extra: list[str]) -> int:
    from bench.results import InvalidRun, NotARun, read_run

    from .diff import DiffError, differing_cases, first_difference

    try:
        run_a = read_run(args.run_a, allow_truncated=True)
        run_b = read_run(args.run_b, allow_truncated=True)
        cases = [args.case] if args.case else differing_cases(run_a, run_b)[:10]
        found = [(case, first_difference(run_a, run_b, case)) for case in cases]
    except (DiffError, NotARun, InvalidRun) as exc:
        print(f"e2b-bench diff: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if not cases:
        print("no case differs in outcome between the runs (name one with --case)")
        return 0
    names = (f"A: {run_a.run_id}", f"B: {run_b.run_id}")
    for case, difference in found:
        print("\n".join(difference.lines(names)) if difference else f"{case}: the same exchanges in both runs")
    return 1 if any(difference for _, difference in found) else 0


def _endpoint_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `run` that decide what each of the command's runs meets, passed on as given."""
    from bench.paths import RESULTS_DIR

    parser.add_argument("--endpoint", default=None, help="local | env | NAME (as `run`)")
    parser.add_argument("--profile", default=None, help="quirk profile of the embedded endpoint")
    parser.add_argument("--quirk", action="append", default=[], help="NAME[=VALUE] quirk of the embedded endpoint")
    parser.add_argument("--expectations", default=None, help="declarations file (as `run`)")
    parser.add_argument("--step-timeout", default=None, help="as `run`")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where its runs go")


def passed_flags(args: argparse.Namespace) -> list[str]:
    flags: list[str] = []
    for name in ("endpoint", "profile", "expectations", "step_timeout"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    for quirk in args.quirk:
        flags += ["--quirk", quirk]
    return flags


def cmd_bisect(args: argparse.Namespace, extra: list[str]) -> int:
    from .bisect import BisectError, bisect, report_lines

    try:
        document, path = bisect(args.case, args.package, args.good, args.bad, passed_flags(args), args.results_dir)
    except BisectError as exc:
        print(f"e2b-bench bisect: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print("\n".join(report_lines(document)))
    print(f"bisect.json: {path}")
    return 0


def cmd_range(args: argparse.Namespace, extra: list[str]) -> int:
    from .bisect import BisectError
    from .range import compatibility, markdown

    targets = [*args.suites, *(item for pattern in args.case for item in ("--case", pattern))]
    try:
        document, path = compatibility(
            args.package, args.start, args.runner, targets, passed_flags(args), args.results_dir, args.every, args.end
        )
    except BisectError as exc:
        print(f"e2b-bench range: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print("\n".join(markdown(document)))
    print(f"range.json: {path}")
    return 0


def run_versions(run: Run) -> dict[str, Runner]:
    """The `--runner BASE@VERSION` runners of a run's command line, by the names they made."""
    from bench.runners.catalog import Runner, available_runners
    from bench.runners.envs import RunnerEnvError
    from bench.runners.versioned import SEPARATOR, versioned

    argv = [str(item) for item in run.header.get("argv", [])]
    given = [argv[i + 1] for i, item in enumerate(argv[:-1]) if item == "--runner"]
    given += [item.split("=", 1)[1] for item in argv if item.startswith("--runner=")]
    known = {name: runner.spec for name, runner in available_runners().items()}
    made: dict[str, Runner] = {}
    for name in given:
        if SEPARATOR in name:
            try:
                spec = versioned(name, known)
            except RunnerEnvError:
                continue
            made[spec.name] = Runner(spec)
    return made


def slug(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", case_id).strip("_")
