"""Property-based cases against the endpoint: generated file names and contents, output sizes and
interleavings, environment values and nested paths, each checked through a second path (a shell command
inside the sandbox) and shrunk to the smallest failing input.

Generation is seeded and bounded (SEED, a fixed number of examples, no example database), so every run
tries the same inputs and a failure is reproducible: its details carry the falsifying example, the seed and
the command that re-runs the case.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Callable
from typing import Any

from driver import Context, Fail, Observed, excerpt, expect, main, step
from hypothesis import HealthCheck, Phase, given, reporting, seed, settings
from hypothesis import strategies as st

SUITES = {"properties"}
SEED = 20261130
HOME = "/home/user"
SETTINGS = settings(
    max_examples=12,
    deadline=None,
    database=None,
    derandomize=False,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)

# Names a user may give a file: letters of several scripts, digits, spaces and punctuation, never '/', NUL
# or a name the shell would read as an option or a dot entry.
NAME_CHARS = st.characters(
    codec="utf-8", exclude_characters="/\\\x00", exclude_categories=("Cs", "Cc", "Zl", "Zp", "Co", "Cn")
)
NAMES = st.text(NAME_CHARS, min_size=1, max_size=40).filter(
    lambda name: name not in (".", "..") and not name.startswith(("-", " ")) and len(name.encode()) <= 200
)
ENV_NAMES = st.from_regex(r"\APROP_[A-Z0-9_]{1,12}\Z")
ENV_VALUES = st.text(st.characters(codec="utf-8", exclude_characters="\x00", exclude_categories=("Cs",)), max_size=60)
SEGMENTS = st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]), st.integers(0, 70000)), min_size=1, max_size=6)


def sandbox(ctx: Context) -> Any:
    if ctx.sandbox is None:
        ctx.sandbox = ctx.new_sandbox()
        ctx.watch(ctx.sandbox.sandbox_id, lambda: ctx.sandbox, lambda: setattr(ctx, "sandbox", None))
    return ctx.sandbox


def check(step_id: str, obs: Observed, test: Callable[[], None]) -> None:
    """Run a hypothesis test; a failure carries the falsifying example, the seed and a re-run command."""
    reported: list[str] = []
    with reporting.with_reporter(reported.append):
        try:
            seed(SEED)(test)()
        except Exception as exc:
            # Hypothesis attaches the (shrunk) falsifying example to the exception as notes.
            obs["falsifying_example"] = excerpt("\n".join([*reported, *getattr(exc, "__notes__", [])]))
            obs["seed"] = SEED
            obs["rerun"] = f"./e2b-bench run sandboxes/e2b/test_properties.py -k {step_id}"
            raise Fail(f"{type(exc).__name__}: {exc} (falsifying example in details)") from None
    obs["seed"] = SEED
    obs["examples"] = SETTINGS.max_examples


@step("pp01_file_names_and_contents")
def file_names_and_contents(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    sbx.files.make_dir(f"{HOME}/prop-files")

    @SETTINGS
    @given(name=NAMES, data=st.binary(max_size=70000))
    def written_file_is_what_the_shell_sees(name: str, data: bytes) -> None:
        path = f"{HOME}/prop-files/{name}"
        info = sbx.files.write(path, data)
        expect(info.path == path, f"write returned path {info.path!r}, expected {path!r}")
        inside = sbx.commands.run(f"stat -c %s -- {shlex.quote(path)}; sha256sum < {shlex.quote(path)}").stdout
        expected = [str(len(data)), hashlib.sha256(data).hexdigest()]
        expect(inside.split()[:2] == expected, f"the shell sees {inside.split()[:2]}, expected {expected}")
        expect(bytes(sbx.files.read(path, format="bytes")) == data, "read back differs from what was written")
        listed = {entry.name for entry in sbx.files.list(f"{HOME}/prop-files")}
        expect(name in listed, f"list() of the directory does not show {name!r}")
        sbx.commands.run(f"rm -f -- {shlex.quote(path)}")

    check("pp01_file_names_and_contents", obs, written_file_is_what_the_shell_sees)


@step("pp02_output_sizes_and_interleavings")
def output_sizes_and_interleavings(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)

    @SETTINGS
    @given(segments=SEGMENTS)
    def every_byte_arrives_on_its_stream(segments: list[tuple[str, int]]) -> None:
        parts = []
        for index, (stream, size) in enumerate(segments):
            letter = "abcdefghij"[index % 10]
            redirect = " >&2" if stream == "stderr" else ""
            parts.append(f"head -c {size} /dev/zero | tr '\\0' {letter}{redirect}")
        result = sbx.commands.run("; ".join(parts))
        for stream in ("stdout", "stderr"):
            wanted = "".join("abcdefghij"[i % 10] * size for i, (s, size) in enumerate(segments) if s == stream)
            got = getattr(result, stream)
            expect(got == wanted, f"{stream}: {len(got)} chars, expected {len(wanted)} in the order written")

    check("pp02_output_sizes_and_interleavings", obs, every_byte_arrives_on_its_stream)


@step("pp03_env_values")
def env_values(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)

    @SETTINGS
    @given(envs=st.dictionaries(ENV_NAMES, ENV_VALUES, min_size=1, max_size=5))
    def every_value_reaches_the_command(envs: dict[str, str]) -> None:
        names = sorted(envs)
        script = "; ".join(f'printf "%s\\0" "${name}"' for name in names)
        result = sbx.commands.run(script, envs=envs)
        seen = result.stdout.split("\0")[:-1]
        expect(seen == [envs[n] for n in names], f"the command saw {seen!r}, expected {[envs[n] for n in names]!r}")

    check("pp03_env_values", obs, every_value_reaches_the_command)


@step("pp04_nested_paths")
def nested_paths(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)

    @SETTINGS
    @given(parts=st.lists(NAMES, min_size=1, max_size=4))
    def nested_directories_hold_the_file(parts: list[str]) -> None:
        directory = "/".join([f"{HOME}/prop-paths", *parts])
        created = sbx.files.make_dir(directory)
        expect(created is True or sbx.files.exists(directory), f"make_dir({directory!r}) made nothing")
        path = f"{directory}/leaf.txt"
        sbx.files.write(path, directory)
        seen = sbx.commands.run(f"cat -- {shlex.quote(path)}").stdout
        expect(seen == directory, f"the shell reads {seen!r} at {path!r}")
        entry = sbx.files.get_info(path)
        expect(entry.path == path and entry.name == "leaf.txt", f"get_info says {entry.path!r}, {entry.name!r}")
        sbx.commands.run(f"rm -rf -- {shlex.quote(f'{HOME}/prop-paths')}")

    check("pp04_nested_paths", obs, nested_directories_hold_the_file)


if __name__ == "__main__":
    sys.exit(main(SUITES))
