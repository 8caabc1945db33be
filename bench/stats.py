"""Latency statistics computed as ComputeSDK's sandbox benchmark does, so figures compare with theirs.

Only successful samples enter the statistics. They are sorted and `floor(n * 5%)` samples are dropped
from each end (unless that would leave nothing); the median is the middle of what remains (the mean of
the two middle values for an even count) and a percentile is its nearest rank,
`sorted[ceil(p/100 * n) - 1]`. Min and max are those of every successful sample, before trimming.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

TRIM_FRACTION = 0.05
METHOD = (
    "successful samples only; floor(n*5%) trimmed from each end; median (mean of the two middle values "
    "for even n) and nearest-rank p95/p99 of the trimmed samples; min/max untrimmed"
)


@dataclass(frozen=True)
class Summary:
    """What a list of latency samples says, in milliseconds; every figure is None without a success."""

    attempted: int
    ok: int
    trimmed: int  # samples dropped from EACH end before median/p95/p99/mean
    success_rate: float | None
    median_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    min_ms: float | None
    max_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trim(values: Sequence[float], fraction: float = TRIM_FRACTION) -> list[float]:
    """The sorted values without `floor(n * fraction)` from each end (all of them when that leaves none)."""
    ordered = sorted(values)
    cut = math.floor(len(ordered) * fraction)
    if cut == 0 or len(ordered) - 2 * cut <= 0:
        return ordered
    return ordered[cut : len(ordered) - cut]


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile `p` (0-100) of already sorted values."""
    if not ordered:
        raise ValueError("percentile of no values")
    index = max(0, math.ceil(p / 100 * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def median(ordered: Sequence[float]) -> float:
    """Median of already sorted values: the mean of the two middle ones for an even count."""
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summarize(values: Sequence[float], attempted: int | None = None, fraction: float = TRIM_FRACTION) -> Summary:
    """Statistics of the successful samples `values` out of `attempted` (default: as many as values)."""
    attempted = len(values) if attempted is None else attempted
    if attempted < len(values):
        raise ValueError(f"{len(values)} successful samples out of {attempted} attempted")
    rate = len(values) / attempted if attempted else None
    if not values:
        return Summary(attempted, 0, 0, rate, None, None, None, None, None, None)
    kept = trim(values, fraction)
    return Summary(
        attempted=attempted,
        ok=len(values),
        trimmed=(len(values) - len(kept)) // 2,
        success_rate=rate,
        median_ms=median(kept),
        p95_ms=percentile(kept, 95),
        p99_ms=percentile(kept, 99),
        mean_ms=sum(kept) / len(kept),
        min_ms=min(values),
        max_ms=max(values),
    )


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """First and third quartile (nearest rank) of the samples, for box plots."""
    ordered = sorted(values)
    return percentile(ordered, 25), percentile(ordered, 75)
