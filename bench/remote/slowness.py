"""How much slower than a quiet one this host is right now: the factor deadlines that wait on the host scale by.

Measured once per process (a short busy loop: wall-clock time over the CPU time it got, so a host whose
cores are shared by several times as many busy processes reads several times slower), and never less than
what the host's run queue says now (its one-minute load average over its cores): a long-lived process, the
embedded endpoint of a whole run, measured once on a quiet host and then met a busy one. Or set with
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


def load_factor() -> float:
    """How much slower than on a quiet host a CPU-bound task runs by the run queue now: a task among L others
    on N cores gets N / (L + 1) of one, so (L + 1) / N with L the one-minute load average, at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this system
        return 1.0
    return min(max((load + 1) / (os.cpu_count() or 1), 1.0), MAX_FACTOR)


@cache
def _given() -> float | None:
    """E2B_BENCH_SLOWNESS when set (None: not set), else this process's measurement, made on first use."""
    value = os.environ.get(SLOWNESS_ENV, "").strip()
    if value:
        try:
            return min(max(float(value), 1.0), MAX_FACTOR)
        except ValueError:
            pass  # not a number: measured instead (the variable is a tuning knob, not an input to refuse)
    return None


@cache
def _first_measure() -> float:
    return measure()


def slowness() -> float:
    """This process's factor: E2B_BENCH_SLOWNESS when set, else the larger of what it measured on first use and
    what the run queue says now (cheap to read: every deadline asks)."""
    value = _given()
    if value is not None:
        return value
    return round(max(_first_measure(), load_factor()), 2)


def forget() -> None:
    """Read E2B_BENCH_SLOWNESS and measure again on next use (tests that change the variable)."""
    _given.cache_clear()
    _first_measure.cache_clear()


def scaled(seconds: float) -> float:
    """`seconds` (what a quiet host needs, with margin) stretched by the host's slowness."""
    return seconds * slowness()
