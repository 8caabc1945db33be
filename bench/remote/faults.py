"""Faults the harness's own tests inject into a run's runners through the real CLI: `E2B_BENCH_FAULTS`, a JSON
object of task options every runner's task carries (`crash_after: <step>`, a Node SDK runner SIGKILLs itself
after that step; `hang_in: <step>`, it goes silent in it), so a test sees what a user's run does when a runner
dies or hangs. Unset (every user's run): none."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

FAULTS_ENV = "E2B_BENCH_FAULTS"


def fault_options(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The task options of `E2B_BENCH_FAULTS`; an empty dict when unset; a value that is not a JSON object is
    an error naming the variable."""
    text = environ.get(FAULTS_ENV, "").strip()
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{FAULTS_ENV} is not JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise ValueError(f"{FAULTS_ENV} is not a JSON object: {text[:200]}")
    return options
