"""The server's memory through a run: sampled, and judged flat or growing.

`MemorySampler` reads the resident set of a server's process tree (the server and every process below
it but those pruned, e.g. the load's own clients) every few seconds in a thread of its own, split in two:
the server's own processes (itself, its fork-server, its helpers) and its sandboxes' (their processes and
uplinks, in cgroups of the server's). The sandboxes' part follows how many are running at that moment
and each is bounded by its own memory limit; what leaks is what the server keeps, so the server's part
is judged (the whole tree is reported next to it). `judge` compares the level at the end of the run with
the level once the load had settled in (after its first minute, or its first third when the run is
shorter): each level is the median of the samples in a window of a third of that warm-up, so that one
busy moment decides neither. Growth above `MAX_GROWTH` is not flat.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .census import descendants

MAX_GROWTH = 0.10  # at most this share above the level after warm-up
WARM_UP_S = 60.0  # the first minute: the load ramps up, pools and caches fill
MIN_JUDGED_S = 15.0  # a shorter load has windows too short to tell growth from a busy moment: reported only
SAMPLE_EVERY_S = 2.0
SAMPLES_PER_WINDOW = 5
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(pid: int) -> int:
    """The resident set of one process (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def proportional_bytes(pid: int) -> int:
    """The process's share of the memory it uses (PSS): a page shared by n processes counts 1/n in each, so a
    fork of the server about to exec a helper does not count the server's memory twice."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return resident_bytes(pid)


@dataclass(frozen=True)
class Sample:
    at: float  # wall-clock time (time.time())
    server: int  # bytes: the server's own processes (itself and those of its tree outside its sandboxes)
    tree: int  # bytes: the whole tree, its sandboxes' processes included
    processes: int


def in_cgroup_under(name: str) -> Callable[[int], bool]:
    """Whether a process is in a cgroup below one named `name` (a server's sandboxes and uplinks)."""
    marker = f"/{name}/"

    def inside(pid: int) -> bool:
        try:
            return marker in Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False

    return inside


class MemorySampler:
    """Samples a process tree's resident memory in a background thread until stopped."""

    def __init__(
        self,
        root: int,
        prune: Callable[[int], bool] = lambda pid: False,
        sandboxed: Callable[[int], bool] = lambda pid: False,
        every_s: float = SAMPLE_EVERY_S,
    ) -> None:
        self.root, self.prune, self.sandboxed, self.every_s = root, prune, sandboxed, every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory sampler", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> Sample:
        pids = descendants(self.root, self.prune)
        inside = {pid for pid in pids if self.sandboxed(pid)}
        outside = [self.root, *(pid for pid in pids if pid not in inside)]
        own = sum(map(proportional_bytes, outside))
        return Sample(time.time(), own, own + sum(map(resident_bytes, inside)), len(pids))

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.samples.append(self.sample())
            if self._stop.wait(self.every_s):
                return


def sample_interval(duration_s: float) -> float:
    """Every SAMPLE_EVERY_S, or often enough for a short run's windows to hold a few samples each."""
    window = min(WARM_UP_S, duration_s / 3) / 3
    return min(SAMPLE_EVERY_S, max(window / SAMPLES_PER_WINDOW, 0.25))


def _mib(value: float) -> float:
    return round(value / (1024 * 1024), 1)


def judge(samples: Sequence[Sample], start: float, end_at: float, warm_up_s: float = WARM_UP_S) -> dict[str, Any]:
    """Whether the server's memory stayed flat after the warm-up of a load from `start` to `end_at` (wall-clock
    times): levels, growth and the verdict, in MiB. Samples outside the load count for nothing but the start
    and the maximum. `flat` is None when the samples cannot say (none in a window); `why` then says so."""
    duration_s = end_at - start
    warm = min(warm_up_s, duration_s / 3)
    window = warm / 3
    settled = [s.server for s in samples if warm - window <= s.at - start <= warm]
    end = [s.server for s in samples if duration_s - window <= s.at - start <= duration_s]
    judged: dict[str, Any] = {
        "samples": len(samples),
        "load_s": round(duration_s, 3),
        "warm_up_s": round(warm, 3),
        "window_s": round(window, 3),
        "max_growth": MAX_GROWTH,
        "start_mib": _mib(samples[0].server) if samples else None,
        "after_warm_up_mib": _mib(statistics.median(settled)) if settled else None,
        "end_mib": _mib(statistics.median(end)) if end else None,
        "max_mib": _mib(max(s.server for s in samples)) if samples else None,
        "tree_start_mib": _mib(samples[0].tree) if samples else None,
        "tree_max_mib": _mib(max(s.tree for s in samples)) if samples else None,
        "growth": None,
        "flat": None,
        "why": None,
    }
    if not settled or not end:
        judged["why"] = f"no sample in the window after the warm-up ({len(settled)}) or at the end ({len(end)})"
        return judged
    growth = statistics.median(end) / statistics.median(settled) - 1
    judged["growth"] = round(growth, 4)
    if duration_s < MIN_JUDGED_S:
        judged["why"] = f"a load of {duration_s:.0f} s is too short to judge (at least {MIN_JUDGED_S:g} s)"
        return judged
    judged["flat"] = growth <= MAX_GROWTH
    if growth > MAX_GROWTH:
        judged["why"] = (
            f"the server's memory grew {growth:.0%} after the warm-up ({judged['after_warm_up_mib']} MiB to "
            f"{judged['end_mib']} MiB), more than {MAX_GROWTH:.0%}"
        )
    return judged


def timeline(samples: Sequence[Sample], start: float) -> list[list[float]]:
    """[seconds since `start`, server MiB, whole tree MiB, processes below the server] of every sample."""
    return [[round(s.at - start, 3), _mib(s.server), _mib(s.tree), s.processes] for s in samples]
