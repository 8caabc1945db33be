"""What tests/test_docs_commands.py runs for `./e2b-bench` in the docs' commands: the real CLI, with the narrowing
docs/README.md states ("Commands in these pages are executed") and nothing else.

- `run ...` runs as `run --list ...`: the run's own code resolves the selection and everything it names and lists
  the cases (exit 5 when none matches), running none of them.
- `selftest ...` runs with pytest's `--collect-only` on one process.
- `serve ...` is started, must print the variables to export, and is then stopped with SIGTERM; it must end
  cleanly (its exit code is this command's).
- every other command runs as written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / "e2b-bench")
SERVE_READY_S = 600.0  # a cold host builds the template first; the wait ends as soon as the exports are printed


def serve(args: list[str]) -> int:
    server = subprocess.Popen([CLI, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    ready = threading.Event()
    seen: list[str] = []

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            sys.stdout.write(line)
            seen.append(line)
            if all(any(f"export {name}" in one for one in seen) for name in ("E2B_API_KEY", "E2B_API_URL")):
                ready.set()
        ready.set()  # the server ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready.wait(SERVE_READY_S)
    if server.poll() is not None:
        reader.join()
        print(f"docs_shim: serve ended before it was stopped (exit {server.returncode})", file=sys.stderr)
        return server.returncode or 1
    server.send_signal(signal.SIGTERM)
    code = server.wait(SERVE_READY_S)
    reader.join()
    printed = all(any(f"export {name}" in one for one in seen) for name in ("E2B_API_KEY", "E2B_API_URL"))
    if not printed:
        print("docs_shim: serve did not print the variables to export", file=sys.stderr)
        return 1
    return 0 if code in (0, 130, 143, -signal.SIGTERM) else code


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "run":
        argv = ["run", "--list", *rest]
    elif command == "selftest":
        argv = ["selftest", *rest, "--collect-only", "-q", "-n", "0"]
    elif command == "serve":
        return serve(rest)
    sys.stdout.flush()
    os.execv(CLI, [CLI, *argv])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
