"""How much slower than a quiet one this host is right now: the factor deadlines that wait on the host scale by.

Measured once per process (a short busy loop: wall-clock time over the CPU time it got, so a host whose
cores are shared by several times as many busy processes reads several times slower) or set with
E2B_BENCH_SLOWNESS. A deadline that is honest on a quiet host is `scaled(seconds)` everywhere else.
"""

from __future__ import annotations

import os
import statistics
import time
from functools import cache

SLOWNESS_ENV = "E2B_BENCH_SLOWNESS"  # a number >= 1 overrides the measurement (CI runners known to be shared)
SAMPLE_CPU_S = 0.02  # CPU time each sample burns
SAMPLES = 5
MAX_FACTOR = 20.0  # beyond this a host is not slow but stuck: a deadline should still end
STEP_TIMEOUT_HELP = (
    "seconds a step that declares no expected duration may take on a quiet host (also how long a runner may stay "
    "silent between steps); scaled by a step's `expect_s` and by the host's measured slowness"
)


def _sample() -> float:
    """Wall-clock over CPU time of a loop that burns SAMPLE_CPU_S of CPU."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu < SAMPLE_CPU_S:
        sum(range(2000))
    return (time.perf_counter() - wall) / max(time.thread_time() - cpu, 1e-6)


def measure(samples: int = SAMPLES) -> float:
    """The host's slowness now: the median ratio of a few samples, at least 1."""
    return min(max(statistics.median(_sample() for _ in range(samples)), 1.0), MAX_FACTOR)


@cache
def slowness() -> float:
    """This process's factor: E2B_BENCH_SLOWNESS when set, else measured on first use."""
    value = os.environ.get(SLOWNESS_ENV, "").strip()
    if value:
        try:
            return min(max(float(value), 1.0), MAX_FACTOR)
        except ValueError:
            pass  # not a number: measured instead (the variable is a tuning knob, not an input to refuse)
    return round(measure(), 2)


def scaled(seconds: float) -> float:
    """`seconds` (what a quiet host needs, with margin) stretched by the host's slowness."""
    return seconds * slowness()
