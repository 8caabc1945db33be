"""Standalone reproduction of one e2b-bench case (written by `e2b-bench repro`; runs without the harness).

Needs only the packages of requirements.txt and three variables, as the E2B SDK reads them:
E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL (E2B_DOMAIN too for a hosted endpoint). It runs the case's
step (and the steps it needs) with the client code under runner/, exactly as the harness ran it, and
exits 0 when the endpoint behaved as E2B does (the step passed), 1 printing the symptom when it did
not, 2 when it could not run (a missing variable). REPRO_TIMEOUT_S bounds the silence of a step (300 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VARIABLES = ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL")


def main() -> int:
    case = json.loads((HERE / "case.json").read_text(encoding="utf-8"))
    missing = [name for name in VARIABLES if not os.environ.get(name)]
    if missing:
        print(f"repro: set {', '.join(missing)} (see README.md)", file=sys.stderr)
        return 2
    timeout_s = float(os.environ.get("REPRO_TIMEOUT_S", "300"))
    task = dict(case["task"])
    task["run_id"] = task["metadata"]["e2b-bench-run"] = f"repro-{os.getpid()}-{int(time.time())}"
    process = subprocess.Popen(
        [sys.executable, str(HERE / case["entry"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=HERE,
        start_new_session=True,
    )
    stdin, stdout, errors = process.stdin, process.stdout, process.stderr
    assert stdin is not None and stdout is not None and errors is not None
    stdin.write(json.dumps(task).encode())
    stdin.close()
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(line.decode(errors="replace") for line in errors),
                     daemon=True).start()  # fmt: skip
    events: dict[str, dict[str, Any]] = {}
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
    reader.start()
    heard, seen, running = time.monotonic(), 0, None
    while reader.is_alive():
        reader.join(0.2)
        for raw in lines[seen:]:
            heard = time.monotonic()
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if event.get("type") == "hello":
                print(f"repro: {case['id']} with {', '.join(f'{k} {v}' for k, v in event.get('pins', {}).items())}")
            if event.get("type") == "start":
                running = event.get("id")
            if event.get("type") == "step":
                events[event["id"]] = event
                running = None
                print(f"  {event['id']}: {event['outcome']}" + (f": {event['error']}" if event.get("error") else ""))
        seen = len(lines)
        if time.monotonic() - heard > timeout_s:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
            print(f"REPRODUCED: no answer in {timeout_s:.0f} s in step {running or '(between steps)'}")
            return 1
    process.wait()
    step = events.get(case["step"])
    if step is None:
        tail = "".join(stderr)[-1500:].strip()
        print(f"REPRODUCED: the client ended (exit {process.returncode}) before {case['step']} was reported\n{tail}")
        return 1
    if step["outcome"] in ("pass", "skip"):
        note = f" (skipped: {step.get('error')})" if step["outcome"] == "skip" else ""
        print(f"OK: {case['step']} behaves as E2B does{note}")
        return 0
    culprit = step
    error = str(step.get("error") or "")
    if error.startswith("depends on ") and error[len("depends on ") :] in events:
        culprit = events[error[len("depends on ") :]]
    print(f"REPRODUCED: {culprit['id']} {culprit['outcome']}: {culprit.get('error')}")
    details = {k: v for k, v in (culprit.get("details") or {}).items() if k != "traceback"}
    if details:
        print(json.dumps(details, indent=2, default=str)[:4000])
    print(f"E2B: {case['expected']}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
